"""LaunchPanel: form built from the cluster and the config, launching through launch()."""

from __future__ import annotations

import ipywidgets as w
import pytest

import nbtrain
from nbtrain._views.launch_panel import INVALID_CLASS, config_control

from _train_fns import train_steps

CONFIG = {"lr": 0.01, "epochs": 3, "optimizer": ["sgd", "adam"], "augment": False, "tag": "base",
          "steps": 5, "sleep": 0.0}


@pytest.mark.quick
def test_each_config_type_gets_a_fitting_control():
    assert isinstance(config_control("lr", 0.01), w.FloatLogSlider)
    assert isinstance(config_control("momentum", 0.9), w.BoundedFloatText)
    assert isinstance(config_control("epochs", 3), w.BoundedIntText)
    assert isinstance(config_control("augment", False), w.Checkbox)
    dropdown = config_control("optimizer", ["sgd", "adam"])
    assert isinstance(dropdown, w.Dropdown) and dropdown.value == "sgd"
    assert isinstance(config_control("tag", "base"), w.Text)


def test_bounds_come_from_the_cluster(cluster):
    panel = nbtrain.LaunchPanel(train_steps, config=CONFIG)
    assert panel.workers.max == 4  # the test cluster has 4 CPUs, 1 per worker
    assert panel.gpus.disabled and "no GPUs" in panel.gpus.tooltip
    panel.cpus.value = 2
    assert panel.workers.max == 2


def test_a_page_without_widgets_shows_the_forms_fields_not_its_widgets_repr(cluster):
    """Tutorial 04's saved page showed `VBox(children=(HBox(children=(VBox(...` under "The form"."""
    panel = nbtrain.LaunchPanel(train_steps, config=CONFIG)
    shown = panel._repr_mimebundle_()
    assert shown["application/vnd.jupyter.widget-view+json"]["model_id"] == panel.widget.model_id
    assert "VBox" not in shown["text/plain"] and "train_steps" in shown["text/plain"]
    assert "VBox" not in shown["text/html"]
    assert "<code>0.01</code>" in shown["text/html"] and "<code>sgd</code>" in shown["text/html"]


def test_invalid_values_block_launch_with_a_message(cluster):
    panel = nbtrain.LaunchPanel(train_steps, config=CONFIG)
    panel.config_controls["tag"].value = "  "
    assert panel.launch_button.disabled
    assert "tag" in panel.message.value
    assert INVALID_CLASS in panel.config_controls["tag"]._dom_classes
    with pytest.raises(nbtrain.NbtrainError, match="invalid values"):
        panel.launch()
    panel.config_controls["tag"].value = "ok"
    assert not panel.launch_button.disabled and panel.message.value == ""


def test_launch_uses_the_form_values(cluster):
    panel = nbtrain.LaunchPanel(train_steps, config=CONFIG)
    panel.workers.value = 1
    panel.config_controls["epochs"].value = 5
    panel.config_controls["optimizer"].value = "adam"
    panel.name.value = "from-panel"
    run = panel.launch()
    assert run.wait(timeout=120) == nbtrain.RunState.SUCCEEDED
    assert run.config == {**CONFIG, "epochs": 5, "optimizer": "adam"}
    assert run.summary()["world_size"] == 1
