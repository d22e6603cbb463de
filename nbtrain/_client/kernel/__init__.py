"""The notebook kernel's own machinery, whatever front end drives it: the widget messages a blocking cell
serves, the progress line that updates in place."""
