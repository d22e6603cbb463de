"""The node relay's process: one actor per node of a wide run.

It gathers its node's ranks' pushes into one supervisor call per flush tick (:mod:`.push_relay`) and
asks the supervisor the node's one standing question for commands (:mod:`.node_question`);
:mod:`.relay_link` is each rank's end of it (a rank's pushes in flight, over the relay's socket).
"""
