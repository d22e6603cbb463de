"""``LaunchPanel``: a widget form in front of :func:`nbtrain.launch`.

The form's bounds come from the connected cluster (the workers slider stops at
what fits; GPU controls are disabled on a cluster without GPUs, with a tooltip
saying why), the hyperparameter inputs come from the ``config`` defaults, and
Launch calls the same ``launch()`` as ``%%ray_train``; the run's dashboard
appears under the panel.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable
from typing import Any

from nbtrain import _options
from nbtrain._client.connecting import connection
from nbtrain._exceptions import NbtrainError
from nbtrain._options import RunOptions

_LOG_SCALE_NAMES = re.compile(r"(^|_)(lr|learning_rate|weight_decay|wd|eps|epsilon)($|_)", re.IGNORECASE)
INVALID_CLASS = "nbtrain-invalid"
_FORM_OPTIONS = {field.name for field in _options.panel_fields()} | {"config", "wait"}


def _is_log_scale(name: str, value: float) -> bool:
    return bool(_LOG_SCALE_NAMES.search(name)) or (0 < abs(value) < 0.01)


def config_control(name: str, default: Any) -> Any:
    """The input widget for one config entry, chosen by the default's type."""
    import ipywidgets as w

    style = {"description_width": "initial"}
    if isinstance(default, bool):
        return w.Checkbox(value=default, description=name, style=style)
    if isinstance(default, int):
        upper = max(10 * abs(default), 100)
        lower = 0 if default >= 0 else -upper
        return w.BoundedIntText(value=default, min=lower, max=upper, description=name, style=style)
    if isinstance(default, float):
        if default > 0 and _is_log_scale(name, default):
            exponent = math.log10(default)
            return w.FloatLogSlider(value=default, base=10, min=min(-6.0, math.floor(exponent) - 2),
                                    max=max(0.0, math.ceil(exponent) + 1), step=0.1, description=name,
                                    readout_format=".2e", style=style)
        bound = max(10 * abs(default), 1.0)
        return w.BoundedFloatText(value=default, min=-bound if default < 0 else 0.0, max=bound,
                                  description=name, style=style)
    if isinstance(default, (list, tuple)) and default:
        return w.Dropdown(options=list(default), value=default[0], description=name, style=style)
    return w.Text(value=str(default), description=name, style=style)


class LaunchPanel:
    """A form to launch ``train_fn`` with chosen workers, resources and hyperparameters.

    Example::

        panel = nbtrain.LaunchPanel(train, config={"lr": 0.01, "epochs": 3, "optimizer": ["sgd", "adam"]})
        panel            # shows the form; Launch starts the run and shows its dashboard below
        panel.run        # the last Run launched from the panel
    """

    def __init__(self, train_fn: Callable[..., Any], config: dict[str, Any] | None = None,
                 **launch_options: Any) -> None:
        import ipywidgets as w

        unknown = sorted(set(launch_options) - {f.name for f in _options.fields()} - {"config"})
        if unknown:
            msg = (f"LaunchPanel got unknown launch option(s) {', '.join(unknown)}; it takes the options of "
                   f"nbtrain.launch(): {', '.join(f.name for f in _options.fields())}.")
            raise NbtrainError(msg)
        self.train_fn = train_fn
        self.defaults = dict(config or {})
        self.launch_options = {key: value for key, value in launch_options.items() if key not in _FORM_OPTIONS}
        self.run: Any = None
        self.runs: list[Any] = []
        cluster = connection.current()
        resources = cluster.resources()
        self.total_cpus = resources.get("CPU", (0.0, 0.0))[1]
        self.total_gpus = resources.get("GPU", (0.0, 0.0))[1]
        start = {field.name: launch_options.get(field.name, field.default) for field in _options.panel_fields()}
        label = {field.name: {"description": _options.info(field).label, "style": {"description_width": "initial"},
                              "description_tooltip": _options.info(field).help}
                 for field in _options.panel_fields()}
        max_workers = max(1, int(self.total_cpus // max(start["cpus_per_worker"], 1e-9)))
        self.workers = w.IntSlider(value=min(start["workers"], max_workers), min=1, max=max_workers, **label["workers"])
        self.cpus = w.BoundedFloatText(value=start["cpus_per_worker"], min=0.1, max=max(self.total_cpus, 0.1),
                                       step=0.5, **label["cpus_per_worker"])
        self.gpus = w.BoundedFloatText(value=start["gpus_per_worker"], min=0.0, max=max(self.total_gpus, 0.0),
                                       step=1.0, **label["gpus_per_worker"])
        if self.total_gpus == 0:
            self.gpus.disabled = True
            self.gpus.description_tooltip = self.gpus.tooltip = "This cluster has no GPUs."
        self.name = w.Text(value=start["name"] or "", placeholder="run-<time> if empty", **label["name"])
        self.max_failures = w.BoundedIntText(value=start["max_failures"], min=0, max=100, **label["max_failures"])
        self.mode = w.ToggleButtons(options=["background", "blocking"],
                                    value="blocking" if launch_options.get("wait") else "background",
                                    tooltips=["return at once; the dashboard keeps updating",
                                              "wait here until the run ends"])
        self.config_controls = {key: config_control(key, value) for key, value in self.defaults.items()}
        self.message = w.HTML()
        self.launch_button = w.Button(description="Launch", button_style="primary", icon="play")
        self.stop_button = w.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.confirm = w.HBox(layout=w.Layout(display="none"))
        self.output = w.Output()
        self.launch_button.on_click(lambda _b: self._on_launch())
        self.stop_button.on_click(lambda _b: self._on_stop())
        for control in [self.cpus, self.gpus, *self.config_controls.values()]:
            control.observe(lambda _change: self.validate(), names="value")
        self.cpus.observe(self._rebound_workers, names="value")
        self.gpus.observe(self._rebound_workers, names="value")
        resources_box = w.VBox([w.HTML("<b>Resources</b>"), self.workers, self.cpus, self.gpus, self.name,
                                self.max_failures, self.mode])
        config_box = w.VBox([w.HTML("<b>Hyperparameters</b>"), *self.config_controls.values()])
        self.widget = w.VBox([w.HBox([resources_box, config_box]), self.message,
                              w.HBox([self.launch_button, self.stop_button]), self.confirm, self.output])
        self.widget.add_class("nbtrain-launch-panel")
        self.validate()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """The live form where widgets show; where they do not (a saved page, nbconvert's HTML, the docs), the
        form's fields as they stand, not the widgets' ``VBox(children=...)``."""
        return {"application/vnd.jupyter.widget-view+json": {"version_major": 2, "version_minor": 0,
                                                             "model_id": self.widget.model_id},
                "text/html": self.summary_html(),
                "text/plain": f"nbtrain launch panel for {getattr(self.train_fn, '__name__', 'a function')} "
                              "(a form of widgets; it is live in a running notebook)"}

    def summary_html(self) -> str:
        """The form's fields and their values, as a small table: what a page without widgets shows."""
        fields = [(self.workers.description, self.workers.value), (self.cpus.description, self.cpus.value),
                  (self.gpus.description, self.gpus.value), (self.name.description, self.name.value or "(automatic)"),
                  (self.max_failures.description, self.max_failures.value), ("mode", self.mode.value),
                  *((key, control.value) for key, control in self.config_controls.items())]
        rows = "".join(f"<tr><td>{html.escape(str(label))}</td><td><code>{html.escape(str(value))}</code></td></tr>"
                       for label, value in fields)
        return (f'<div class="nbtrain-launch-panel-summary"><b>nbtrain launch panel</b> for '
                f"<code>{html.escape(getattr(self.train_fn, '__name__', 'a function'))}</code> "
                f"(live in a running notebook)<table>{rows}</table></div>")

    # ------------------------------------------------------------------ form state
    def _rebound_workers(self, _change: Any = None) -> None:
        per_worker = max(self.cpus.value, 1e-9)
        limit = int(self.total_cpus // per_worker)
        if self.gpus.value > 0:
            limit = min(limit, int(self.total_gpus // self.gpus.value))
        self.workers.max = max(1, limit)

    def values(self) -> dict[str, Any]:
        """The hyperparameters as the form has them now: what Launch would pass as ``config``.

        Returns:
            ``{name: value}`` for each entry of the ``config`` the panel was made with.

        Example::

            panel.values()["lr"]
        """
        return {key: control.value for key, control in self.config_controls.items()}

    def validate(self) -> list[str]:
        """Check the form: mark invalid inputs, and disable Launch while any remain. Runs on every change.

        A number's input must hold a finite number, a text's must not be empty, and CPUs and GPUs per worker
        must fit in the cluster.

        Returns:
            One line per problem, ``[]`` when the form can be launched.
        """
        problems = []
        for key, control in self.config_controls.items():
            default = self.defaults[key]
            value = control.value
            bad = (isinstance(default, (int, float)) and not isinstance(default, bool)
                   and (not isinstance(value, (int, float)) or (isinstance(value, float) and not math.isfinite(value))))
            bad = bad or (isinstance(default, str) and not str(value).strip())
            if bad:
                problems.append(f"{key}: {value!r} is not a valid value")
                control.add_class(INVALID_CLASS)
            else:
                control.remove_class(INVALID_CLASS)
        if self.gpus.value > self.total_gpus:
            problems.append(f"GPUs per worker: the cluster has {self.total_gpus:g} GPUs")
        if self.cpus.value > self.total_cpus:
            problems.append(f"CPUs per worker: the cluster has {self.total_cpus:g} CPUs")
        self.launch_button.disabled = bool(problems)
        self.message.value = ("<span style='color:#d62728'>Fix before launching: " + "; ".join(problems) + "</span>"
                              if problems else "")
        return problems

    def active_run(self) -> Any:
        if self.run is not None and not self.run.state.is_terminal:
            return self.run
        return None

    # ------------------------------------------------------------------ actions
    def launch(self) -> Any:
        """Launch with what the form says now, as the Launch button does, and show the run's dashboard
        under the panel; in blocking mode, wait here until the run ends.

        Returns:
            The new :class:`Run` (also ``panel.run``; ``panel.runs`` has every run launched from the panel).

        Raises:
            NbtrainError: the form has invalid values (:meth:`validate` lists them), or any error of
                :func:`launch`.

        Example::

            panel.workers.value = 4
            run = panel.launch()
        """
        problems = self.validate()
        if problems:
            msg = "The launch form has invalid values: " + "; ".join(problems)
            raise NbtrainError(msg)
        from nbtrain._client.entry.launch import start
        from nbtrain._client.run.following import block_until_done

        options = RunOptions(**self.launch_options, **self.form_options())
        run = start(self.train_fn, options)
        self.run = run
        self.runs.append(run)
        self.stop_button.disabled = False
        with self.output:
            view = run.dashboard(follow="background")
        if self.mode.value == "blocking":
            block_until_done(run, launched=True, view_thread=view.thread)
        return run

    def form_options(self) -> dict[str, Any]:
        """The launch options the form sets, as ``launch()`` keyword arguments."""
        form = {"config": self.values(), "workers": self.workers.value, "cpus_per_worker": float(self.cpus.value),
                "gpus_per_worker": float(self.gpus.value), "name": self.name.value.strip() or None,
                "max_failures": self.max_failures.value,
                "wait": False}  # a blocking launch waits here, with the dashboard drawing, not inside start()
        assert set(form) == _FORM_OPTIONS, "the panel's fields and the declared panel options differ"
        return form

    def _on_launch(self) -> None:
        if self.active_run() is not None:
            self._ask_about_active_run()
            return
        self._launch_reporting_errors()

    def _launch_reporting_errors(self) -> None:
        self.confirm.layout.display = "none"
        try:
            self.launch()
            self.message.value = ""
        except NbtrainError as exc:
            self.message.value = f"<pre style='color:#d62728;white-space:pre-wrap'>{exc}</pre>"

    def _ask_about_active_run(self) -> None:
        import ipywidgets as w

        stop_first = w.Button(description="Stop it, then launch", button_style="warning")
        parallel = w.Button(description="Run both")
        cancel = w.Button(description="Cancel")

        def stop_then_launch(_b: Any) -> None:
            self.run.stop()
            self._launch_reporting_errors()

        stop_first.on_click(stop_then_launch)
        parallel.on_click(lambda _b: self._launch_reporting_errors())
        cancel.on_click(lambda _b: setattr(self.confirm.layout, "display", "none"))
        self.confirm.children = (w.HTML(f"Run <b>{self.run.name}</b> is still active. "), stop_first, parallel, cancel)
        self.confirm.layout.display = "flex"

    def _on_stop(self) -> None:
        if self.run is not None:
            self.run.stop()
        self.stop_button.disabled = True
