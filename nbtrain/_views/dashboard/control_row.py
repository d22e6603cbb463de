"""The live dashboard's control row: the run's optimizer settings, each with an input to change it, Pause /
Resume, Checkpoint now and Stop — the buttons of :class:`~nbtrain._client.run.control.RunControl` — Rewind with
its step and skip fields (``run.rewind``), the active guards and how many rewinds the run took, Stacks and
Profile 10 steps (:class:`~nbtrain._client.run.inspection.RunInspection`). (The marks each change leaves on
the curves are the run's history model's: :mod:`nbtrain._client.run.run_history`.)

Clicks call the same ``run.adjust()`` / ``run.pause()`` / ``run.stacks()`` a cell would, on a thread of their own
(a click never waits on the cluster in the kernel's widget handler); what happened, or why not, shows in the
dashboard's notice, and the stacks or the profile's table in an area under the row.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable
from typing import Any

from nbtrain._cluster.commands import ADJUSTABLE
from nbtrain._guards import describe_guard

CHANGE_COLOUR = "#2ca02c"
FIELD_WIDTH = "150px"
PROFILE_STEPS = 10   # the Profile button's steps, on rank 0
PROFILE_ROWS = 10    # operators shown under the row (run.profile() in a cell has them all)


class ControlRow:
    """The widgets of one dashboard's controls; ``update(summary)`` shows the run as it stands."""

    def __init__(self, run: Any, say: Callable[..., None], stop_button: Any) -> None:
        import ipywidgets as w

        self.run = run
        self._say = say
        self._shown: dict[str, str] = {}   # what each field last showed: a field the user edits is left alone
        self.fields = {key: w.Text(description=key, layout=w.Layout(width=FIELD_WIDTH, display="none"),
                                   style={"description_width": "initial"}, continuous_update=False)
                       for key in ADJUSTABLE}
        for key, field in self.fields.items():
            field.observe(lambda change, key=key: self._on_edit(key, change), names="value")
        self.pause_button = w.Button(description="Pause", icon="pause", layout=w.Layout(width="auto"),
                                     tooltip="Hold every rank at the same step (resources stay reserved)")
        self.checkpoint_button = w.Button(description="Checkpoint now", icon="save", layout=w.Layout(width="auto"),
                                          tooltip="Ask the ranks for a checkpoint at the next step")
        self.pause_button.on_click(lambda _b: self._act(self._pause_or_resume))
        self.checkpoint_button.on_click(lambda _b: self._act(self.run.checkpoint_now, "checkpoint asked"))
        self.stacks_button = w.Button(description="Stacks", icon="list", layout=w.Layout(width="auto"),
                                      tooltip="Where every rank is now: its Python stacks, taken without pausing it")
        self.profile_button = w.Button(description=f"Profile {PROFILE_STEPS} steps", icon="tachometer",
                                       layout=w.Layout(width="auto"),
                                       tooltip=f"torch.profiler on rank 0 for the next {PROFILE_STEPS} steps: "
                                               "the top operators, and the trace's path")
        self.rewind_step = w.Text(description="to step", placeholder="latest", layout=w.Layout(width="130px"),
                                  style={"description_width": "initial"},
                                  tooltip="a step with a restore point on every rank; empty: the latest")
        self.rewind_skip = w.BoundedIntText(value=0, min=0, max=10**9, description="skip",
                                            layout=w.Layout(width="110px"), style={"description_width": "initial"},
                                            tooltip="batches to skip after the rewind (e.g. the one that diverged)")
        self.rewind_button = w.Button(description="Rewind", icon="undo", layout=w.Layout(width="auto"),
                                      tooltip="Every rank back to its restore point in place, at the same step")
        self.rewind_button.on_click(lambda _b: self._act(self._rewind, "rewind asked"))
        self.guards = w.HTML()  # the active guards, and the rewinds taken so far
        self.answer = w.HTML()  # the stacks, or the profile's table
        self.stacks_button.on_click(lambda _b: self._look(self.stacks_button, "taking every rank's stacks…",
                                                          lambda: self.run.stacks().html(compact=True)))
        self.profile_button.on_click(lambda _b: self._look(
            self.profile_button, f"profiling rank 0 for the next {PROFILE_STEPS} steps…",
            lambda: self.run.profile(steps=PROFILE_STEPS).html(top=PROFILE_ROWS)))
        row = w.HBox([*self.fields.values(), self.pause_button, self.checkpoint_button, self.rewind_step,
                      self.rewind_skip, self.rewind_button, self.stacks_button, self.profile_button, stop_button],
                     layout=w.Layout(flex_flow="row wrap", align_items="center"))
        self.widget = w.VBox([row, self.guards, self.answer])
        self.widget.add_class("nbtrain-controls")

    def update(self, summary: dict[str, Any]) -> None:
        live = summary.get("state") in ("running", "starting", "restarting", "pending")
        hyper = summary.get("hyper") or {}
        for key, field in self.fields.items():
            values = hyper.get(key)
            field.layout.display = None if values is not None and live else "none"
            if values is None:
                continue
            text = _shown(values)
            if self._shown.get(key) != text:  # changed on the cluster: show it (an edit in progress is lost)
                self._shown[key] = text
                field.value = text
                field.tooltip = f"{key} per param group: {text}" if len(values) > 1 else key
        paused = summary.get("paused_at") is not None
        self.pause_button.description, self.pause_button.icon = ("Resume", "play") if paused else ("Pause", "pause")
        for button in (self.pause_button, self.checkpoint_button, self.stacks_button, self.profile_button,
                       self.rewind_step, self.rewind_skip, self.rewind_button):
            button.layout.display = None if live else "none"
        self.pause_button.disabled = self.checkpoint_button.disabled = not live
        points = summary.get("restore_points") or []
        self.rewind_button.disabled = not live or not points
        self.rewind_step.placeholder = f"latest ({points[-1]})" if points else "no restore point yet"
        steps = ", ".join(map(str, points))
        self.rewind_button.tooltip = (f"Every rank back to a restore point in place (steps {steps})" if points
                                      else "Rewind needs a restore point: one is taken at each checkpoint")
        said = [describe_guard(summary["guard"])] if summary.get("guard") else []
        if summary.get("rewinds"):
            said.append(f"rewound {summary['rewinds']}x")
        shown = html.escape(" · ".join(said))
        self.guards.value = f'<span class="nbtrain-guards" style="font-size:0.85em">{shown}</span>' if said else ""

    def _on_edit(self, key: str, change: dict[str, Any]) -> None:
        text = str(change["new"]).strip()
        if text == self._shown.get(key):
            return
        try:
            value: Any = None if text.lower() in ("", "none", "off") and key == "grad_clip" else _parse(key, text)
        except ValueError:
            self._say(f"{key}: {text!r} is not a number{' pair' if key == 'betas' else ''}; nothing was changed.")
            return
        self._act(lambda: self.run.adjust(**{key: value}), f"{key} → {text} asked")

    def _rewind(self) -> Any:
        text = self.rewind_step.value.strip()
        if text and not text.isdigit():
            raise ValueError(f"Rewind: the step must be a whole number of a restore point, or empty for the latest; "
                             f"got {text!r}. Nothing was changed.")
        return self.run.rewind(step=int(text) if text else None, skip_batches=int(self.rewind_skip.value))

    def _pause_or_resume(self) -> Any:
        if self.pause_button.description == "Resume":
            return self.run.resume()
        return self.run.pause()

    def _act(self, action: Callable[[], Any], said: str = "") -> None:
        def go() -> None:
            try:
                result = action()
            except Exception as exc:  # noqa: BLE001 - the refusal says what to do: shown, never raised in a handler
                self._say(str(exc))
                return
            if said:
                self._say(said + (f" (step {result})" if isinstance(result, int) else ""), colour=CHANGE_COLOUR)
        threading.Thread(target=go, name="nbtrain-control", daemon=True).start()


    def _look(self, button: Any, waiting: str, answer: Callable[[], str]) -> None:
        """Stacks or a profile: shown under the row once they come (the button waits meanwhile)."""
        def go() -> None:
            button.disabled = True
            self.answer.value = f"<i>{waiting}</i>"
            try:
                self.answer.value = answer()
            except Exception as exc:  # noqa: BLE001 - the refusal says what to do: shown, never raised in a handler
                self.answer.value = ""
                self._say(str(exc))
            finally:
                button.disabled = False
        threading.Thread(target=go, name="nbtrain-control", daemon=True).start()


def _shown(values: list[Any]) -> str:
    distinct = []
    for value in values:
        if value not in distinct:
            distinct.append(value)
    return "; ".join(_one(value) for value in distinct)


def _one(value: Any) -> str:
    if value is None:
        return "off"
    if isinstance(value, list):
        return ", ".join(f"{item:g}" for item in value)
    return f"{value:g}"


def _parse(key: str, text: str) -> Any:
    if key == "betas":
        parts = [float(part) for part in text.replace("(", "").replace(")", "").split(",")]
        if len(parts) != 2:
            raise ValueError(text)
        return tuple(parts)
    return float(text)
