"""The dashboard's control row, in the kernel: what it shows and what its clicks do.

It shows the run's optimizer settings (each an input on the page), Pause / Resume, Checkpoint now and Stop — the
buttons of :class:`~nbtrain._client.run.control.RunControl` — Rewind with its step and skip fields
(``run.rewind``), the active guards and how many rewinds the run took, Stacks and Profile 10 steps
(:class:`~nbtrain._client.run.inspection.RunInspection`). (The marks each change leaves on the curves are the run's
history model's: :mod:`nbtrain._client.run.run_history`.)

The page sends each click or edit as one message, ``{"action": "adjust", "key": "lr", "value": "0.01"}``;
:meth:`Controls.act` looks its action up in :data:`ACTIONS` and calls the same ``run.adjust()`` /
``run.pause()`` / ``run.stacks()`` a cell would, on a thread of its own (a click never waits on the cluster in
the kernel's widget handler). What happened, or why not, shows in the dashboard's notice; the stacks or the
profile's table under the row.

Until a control has acted the page must not look as if it had: a field always shows the run's value from its
summary, and an asked change is *pending* (:meth:`Controls.state`'s ``pending``) until the run reports it (a
setting's new value, the step it paused at, the call returned), or the call failed.
"""

from __future__ import annotations

import html
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nbtrain._cluster.commands import ADJUSTABLE
from nbtrain._guards import describe_guard

CHANGE_COLOUR = "#2ca02c"
PROFILE_STEPS = 10   # the Profile button's steps, on rank 0
PROFILE_ROWS = 10    # operators shown under the row (run.profile() in a cell has them all)
HANDLED_IDS = 16     # the page's message ids the state lists as handled (its own pending marks then go)
LIVE_STATES = ("running", "starting", "restarting", "pending")

Summary = dict[str, Any]


@dataclass
class Pending:
    """A control asked and not yet seen acting: ``text`` as the page says it, ``reported(summary)`` true once
    the run's summary shows it (None: once the call has returned), ``returned`` once the call has."""

    text: str
    reported: Callable[[Summary], bool] | None = None
    returned: bool = False


class Controls:
    """One dashboard's controls: ``state(summary)`` is what the page shows, ``act(message)`` what a click does.

    ``say(message, colour=...)`` shows a line in the dashboard's notice; ``changed()`` is called when the state
    changed apart from a new summary (a call returned, an answer came); ``start(target)`` runs a call on a thread
    of its own (the dashboard's: a ``mo.Thread`` in marimo, whose widget messages marimo sends).
    """

    def __init__(self, run: Any, say: Callable[..., None], changed: Callable[[], None],
                 start: Callable[[Callable[[], None]], None]) -> None:
        self.run = run
        self._say = say
        self._changed = changed
        self._start = start
        self._lock = threading.Lock()
        self.pending: dict[str, Pending] = {}
        self.handled: deque[str] = deque(maxlen=HANDLED_IDS)
        self.answer = ""   # HTML: the stacks, or the profile's table
        self._summary: Summary = {}

    # ------------------------------------------------------------------ what the page shows
    def state(self, summary: Summary) -> dict[str, Any]:
        """The control row as the page draws it, for the run as ``summary`` says it stands."""
        self._summary = summary
        live = summary.get("state") in LIVE_STATES
        hyper = summary.get("hyper") or {}
        fields = []
        for key in ADJUSTABLE:
            values = hyper.get(key)
            if values is None:
                continue
            text = shown(values)
            fields.append({"key": key, "value": text,
                           "tooltip": f"{key} per param group: {text}" if len(values) > 1 else key})
        points = summary.get("restore_points") or []
        steps = ", ".join(map(str, points))
        said = [describe_guard(summary["guard"])] if summary.get("guard") else []
        if summary.get("rewinds"):
            said.append(f"rewound {summary['rewinds']}x")
        with self._lock:
            for key in [key for key, asked in self.pending.items() if not live or self._acted(asked, summary)]:
                del self.pending[key]
            pending = {key: asked.text for key, asked in self.pending.items()}
            handled = list(self.handled)
        return {"live": live, "paused": summary.get("paused_at") is not None,
                "stopped": summary.get("state") == "stopped", "fields": fields,
                "rewind": {"enabled": bool(points),
                           "placeholder": f"latest ({points[-1]})" if points else "no restore point yet",
                           "tooltip": (f"Every rank back to a restore point in place (steps {steps})" if points
                                       else "Rewind needs a restore point: one is taken at each checkpoint")},
                "guards": " · ".join(said), "pending": pending, "handled": handled, "profile_steps": PROFILE_STEPS}

    @staticmethod
    def _acted(asked: Pending, summary: Summary) -> bool:
        return asked.returned and (asked.reported is None or asked.reported(summary))

    # ------------------------------------------------------------------ what a click does
    def act(self, message: dict[str, Any]) -> None:
        """Do what the page's ``message`` asks; a message this kernel does not know is said, never raised."""
        name = str(message.get("action"))
        handler = ACTIONS.get(name)
        if handler is None:
            self._say(f"The dashboard sent an action this kernel does not know ({name!r}); nothing was done. "
                      "Run the cell again to get a dashboard of this nbtrain version.")
            return
        handler(self, message)
        if message.get("id") is not None:
            with self._lock:
                self.handled.append(str(message["id"]))
        self._changed()

    def _adjust(self, message: dict[str, Any]) -> None:
        key, text = str(message.get("key")), str(message.get("value", "")).strip()
        if key not in ADJUSTABLE:
            self._say(f"{key!r} is not a setting a run can change ({', '.join(ADJUSTABLE)}); nothing was changed.")
            return
        try:
            value: Any = None if text.lower() in ("", "none", "off") and key == "grad_clip" else _parse(key, text)
        except ValueError:
            self._say(f"{key}: {text!r} is not a number{' pair' if key == 'betas' else ''}; nothing was changed.")
            return
        before = _setting(self._summary, key)
        unchanged = value is not None and shown([list(value) if isinstance(value, tuple) else value]) == before
        self._call(key, Pending(text, None if unchanged else lambda summary: _setting(summary, key) != before),
                   lambda: self.run.adjust(**{key: value}), f"{key} → {text} asked")

    def _pause(self, _message: dict[str, Any]) -> None:
        self._call("pause", Pending("", lambda summary: summary.get("paused_at") is not None), self.run.pause)

    def _resume(self, _message: dict[str, Any]) -> None:
        self._call("resume", Pending("", lambda summary: summary.get("paused_at") is None), self.run.resume)

    def _checkpoint(self, _message: dict[str, Any]) -> None:
        self._call("checkpoint", Pending(""), self.run.checkpoint_now, "checkpoint asked")

    def _rewind(self, message: dict[str, Any]) -> None:
        step, skip = str(message.get("step") or "").strip(), str(message.get("skip") or "0").strip()
        if step and not step.isdigit():
            self._say(f"Rewind: the step must be a whole number of a restore point, or empty for the latest; "
                      f"got {step!r}. Nothing was changed.")
            return
        if not skip.isdigit():
            self._say(f"Rewind: skip must be a whole number of batches; got {skip!r}. Nothing was changed.")
            return
        self._call("rewind", Pending(""),
                   lambda: self.run.rewind(step=int(step) if step else None, skip_batches=int(skip)), "rewind asked")

    def _stop(self, _message: dict[str, Any]) -> None:
        self._call("stop", Pending(""), self.run.stop)

    def _stacks(self, _message: dict[str, Any]) -> None:
        self._look("stacks", "taking every rank's stacks…", lambda: self.run.stacks().html(compact=True))

    def _profile(self, _message: dict[str, Any]) -> None:
        self._look("profile", f"profiling rank 0 for the next {PROFILE_STEPS} steps…",
                   lambda: self.run.profile(steps=PROFILE_STEPS).html(top=PROFILE_ROWS))

    # ------------------------------------------------------------------ internals
    def _call(self, key: str, asked: Pending, call: Callable[[], Any], said: str = "") -> None:
        """``call()`` on a thread of its own, ``key`` pending meanwhile; its outcome said in the notice."""
        with self._lock:
            self.pending[key] = asked

        def go() -> None:
            try:
                result = call()
            except Exception as exc:  # noqa: BLE001 - the refusal says what to do: shown, never raised in a handler
                with self._lock:
                    self.pending.pop(key, None)
                self._say(str(exc))
                self._changed()
                return
            asked.returned = True
            if said:
                self._say(said + (f" (step {result})" if isinstance(result, int) else ""), colour=CHANGE_COLOUR)
            self._changed()
        self._start(go)

    def _look(self, key: str, waiting: str, answer: Callable[[], str]) -> None:
        """Stacks or a profile: shown under the row once they come (the button is pending meanwhile)."""
        self.answer = f"<i>{html.escape(waiting)}</i>"

        def call() -> None:
            try:
                self.answer = answer()
            except Exception:
                self.answer = ""
                raise
        self._call(key, Pending(""), call)


ACTIONS: dict[str, Callable[[Controls, dict[str, Any]], None]] = {
    "adjust": Controls._adjust, "pause": Controls._pause, "resume": Controls._resume,
    "checkpoint": Controls._checkpoint, "rewind": Controls._rewind, "stop": Controls._stop,
    "stacks": Controls._stacks, "profile": Controls._profile,
}


def _setting(summary: Summary, key: str) -> str | None:
    values = (summary.get("hyper") or {}).get(key)
    return None if values is None else shown(values)


def shown(values: list[Any]) -> str:
    """A setting's values across param groups as its field shows them: ``"0.1"``, ``"0.1; 0.01"``, ``"off"``."""
    distinct = []
    for value in values:
        if value not in distinct:
            distinct.append(value)
    return "; ".join(_one(value) for value in distinct)


def _one(value: Any) -> str:
    if value is None:
        return "off"
    if isinstance(value, list | tuple):
        return ", ".join(f"{item:g}" for item in value)
    return f"{value:g}"


def _parse(key: str, text: str) -> Any:
    if key == "betas":
        parts = [float(part) for part in text.replace("(", "").replace(")", "").split(",")]
        if len(parts) != 2:
            raise ValueError(text)
        return tuple(parts)
    return float(text)
