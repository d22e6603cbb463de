"""A rank's part in steering a live run: it learns the notebook's commands and applies them at their step.

A thread of its own waits on the supervisor for new commands (a long poll, answered the moment one is
issued); in a wide run it asks its node's relay, which holds one such question for the node's ranks
(:mod:`~nbtrain._cluster.relay.node_question`). Each command carries the step at which it takes effect;
torch's global optimizer step pre-hook, registered while the rank's session runs
(:meth:`RankSteering.hook`), applies what is due before that step's update, on every rank at the same
step, so DDP replicas stay identical: the supervisor proposes the step, and each rank settles it with the
supervisor as it gets there (:mod:`~nbtrain._cluster.rank.step_agreement`), so a rank that learnt a command
late moves it on for all rather than apply it alone. Being global, the hook reaches every optimizer the code steps,
with no nbtrain call: the first time one steps it is adopted (``prepare_optimizer``,
``nbtrain.steerable`` and the Lightning / Hugging Face integrations adopt theirs earlier, with their LR
schedulers). Wrappers are seen through: an optimizer whose step does not fire torch's hooks
(Accelerate's ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``, nbtrain's
``ScaledOptimizer``) is adopted as the optimizer it holds; one whose step does and steps an inner
optimizer (``ZeroRedundancyOptimizer``) is adopted itself and its inner one left alone, so a change is
applied once. With nothing pending the hook is a set lookup and one truth test. User commands
(``@nbtrain.on_command``) run in the step post-hook, after the update, when the model is consistent, and
so does a profile (:mod:`.profiling`), which stays in the pending list, one step ahead, until its last
step. ``stacks`` is answered on the listener's thread as soon as it is learnt (:mod:`.inspection.thread_stacks`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from nbtrain._cluster.command_kinds.kind import AFTER_UPDATE, BEFORE_UPDATE, ON_LEARNING
from nbtrain._cluster.command_kinds.table import command_kind, learn
from nbtrain._cluster.commands import AS_SOON_AS_BACK, DECLINED, IN_PARAM_GROUPS, Command, SteeringBeat
from nbtrain._cluster.rank import exec_and_patch, optimizer_settings, rewinding
from nbtrain._cluster.rank.guarding import RankGuard
from nbtrain._cluster.rank.inspection import thread_stacks
from nbtrain._cluster.rank.inspection.profiling import StepProfile
from nbtrain._cluster.rank.step_agreement import StepAgreement
from nbtrain._cluster.rank.their_code import optimizers as wrappers

CONTROL_WAIT_S = 1.0   # a rank's question for new commands waits this long for one (elastic runs: also a checkpoint)
CALL_TIMEOUT_S = 10.0
RETRY_S = 1.0
PAUSE_CHECK_S = 0.5    # a paused rank looks again this often (a resume wakes it at once)

_handlers: dict[str, Callable[..., Any]] = {}  # @on_command registrations in this process


class RunStopped(BaseException):
    """Raised at the step every rank agreed to stop at (the ``stop`` command), out of the hook that applies it:
    the training function ends there, and the rank's process goes back to the warm pool. A BaseException, as
    KeyboardInterrupt is, so that the user's ``except Exception`` does not take it for an error of theirs."""

    def __init__(self, step: int) -> None:
        super().__init__(f"run.stop() at step {step}")
        self.step = step


def on_command(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn`` as this rank's handler of the command ``name`` sent by ``run.send(name, **payload)``."""
    if not isinstance(name, str) or not name:
        raise TypeError("on_command(name): name must be a non-empty string, e.g. @nbtrain.on_command('eval')")

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        _handlers[name] = fn
        return fn
    return register


class RankSteering:
    """The commands one rank knows, applied by the optimizers' step hooks; made by its session."""

    def __init__(self, session: Any, known: list[Command], agreement: StepAgreement | None = None) -> None:
        self.session = session
        self.agreement = agreement or StepAgreement(session)
        self._settled: set[int] = set()            # ids of commands whose step every rank knows: applied when due
        self.pending: list[Command] = []   # not yet applied, by (at_step, id): the hooks' fast path
        self.seen = 0                              # the last command id learnt
        self.optimizers: list[Any] = []            # adopted: the ones a change is applied to
        self._met: set[Any] = set()                # every optimizer the hooks saw: adopted, or inside one
        self._state_loaded: set[int] = set()       # id() of adopted optimizers whose load_state_dict ran
        self._counted: Any = None                  # the first adopted: its updates are counted
        self._hooks: tuple[Any, ...] = ()          # torch's handles of the global hooks, while hooked
        self.updates = 0                           # optimizer updates this attempt (a step for loops that count none)
        self.grad_clip: float | None = None
        self.paused_at: int | None = None
        self.checkpoint_wanted = False
        self.stop_after_epoch: int | None = None
        self.held_after_epoch: int | None = None   # this rank finished that epoch and waits for the run's stop
        self.epochs_counted = False                 # a prepared loader or an integration counts epochs
        self.resumed = threading.Event()           # set while no pause holds (cleared by a pause, set by resume)
        self.resumed.set()
        self._stacks_asked: list[Command] = []     # answered once learn() lets go of the lock
        self._poked = threading.Event()            # a command came: a paused rank looks at it
        self._beat_mark = (0, time.monotonic())
        self._rate: float | None = None            # steps per second, smoothed over heartbeats
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self.training_thread = threading.get_ident()  # made by the session, on the thread that runs the function
        self.profiling: StepProfile | None = None
        self.points = rewinding.RestorePoints(session, self)  # what run.rewind() goes back to, taken at checkpoints
        self.guard: RankGuard | None = None         # run.guard()'s, checked at reports and updates
        self.rewinds = 0                            # rewinds applied this attempt: the branch a guard's trip is on
        # what an earlier attempt's ranks were asked (stacks, profiles under way): not this one's to answer
        self._earlier = {c.id for c in known if command_kind(c.kind).asks_ranks}
        # a new attempt: the run's steered state (the changes made so far but those a rewind went back from, the
        # last guard); those applied before are re-applied here without a word (RunSteering.new_attempt)
        self._replayed = {c.id for c in known if c.applied_step is not None}
        replayed = [c for c in known if command_kind(c.kind).replayed == "each" and not c.superseded
                    and c.dropped is None]
        for kind in {command_kind(c.kind) for c in known if command_kind(c.kind).replayed == "last"}:
            replayed.append([c for c in known if c.kind == kind.name][-1])
        self.learn(sorted(replayed, key=lambda c: c.id), from_payload=True)
        # the rest (pauses, checkpoints asked, user commands) belonged to earlier attempts: never again
        self.seen = max((c.id for c in known), default=0)

    # ------------------------------------------------------------------ its own thread
    def start(self) -> None:
        threading.Thread(target=self._listen, name="nbtrain-steering", daemon=True).start()

    def stop(self) -> None:
        """The attempt's function is over (on its thread): a profile in progress ends with the steps it has."""
        self._stopped.set()
        profiling, self.profiling = self.profiling, None
        if profiling is not None:
            profiling.finish(self.session, f"the training function ended after {profiling.done} of "
                                           f"{profiling.steps} steps", wait=True)

    def _listen(self) -> None:
        """Wait on the supervisor (or the node's relay) for new commands: a long poll answered as soon as one is
        issued, else after ``CONTROL_WAIT_S``, so a command reaches every rank within milliseconds."""
        import ray

        session = self.session
        relay_failed = False
        while not self._stopped.is_set():
            relay = None if relay_failed else session.relay  # it asks the supervisor for the node (node_question)
            try:
                checkpoint, commands = ray.get((relay or session.supervisor).control.remote(
                    session.context.attempt, self.seen, CONTROL_WAIT_S), timeout=CONTROL_WAIT_S + CALL_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - a relay failed: the supervisor from now on; it restarting: ask again
                if relay is None:
                    self._stopped.wait(RETRY_S)
                relay_failed = relay_failed or relay is not None
                continue
            session.checkpoint_requested = bool(checkpoint)
            self.learn(commands)

    def learn(self, commands: list[Command], from_payload: bool = False) -> None:
        """New commands from the supervisor: each kind says what learning it does (``learnt``), and those due at
        a step wait in ``pending`` for their hook point. Those every rank learnt from its payload are settled;
        for the others the supervisor hears from which step on this rank can apply them."""
        rank = self.session.context.rank
        to_settle: list[int] = []
        declined: list[int] = []
        with self._lock:
            pending = list(self.pending)
            for command in commands:
                if command.id <= self.seen:
                    continue
                self.seen = command.id
                kind = learn(command.kind, command.definition)
                if kind.asks_ranks and (command.id in self._earlier or rank not in command.ranks):
                    continue
                if not kind.learnt(self, command, pending):
                    if kind.hook != ON_LEARNING and not from_payload:  # the others do not wait for this rank's word
                        declined.append(command.id)
                    continue
                if command.id in self._replayed and command.applied_step is not None:  # where it was before
                    command = command.due_at(command.applied_step)
                if from_payload:  # the same on every rank from the start
                    self._settled.add(command.id)
                else:
                    to_settle.append(command.id)
                pending.append(command)
            pending.sort(key=lambda c: (c.at_step, c.id))
            self._set_pending(pending)
            first_step = self._first_step_now()  # after the swap: the training thread sees them from this step on
            asked, self._stacks_asked = self._stacks_asked, []
        if to_settle:
            self.agreement.learnt(to_settle, first_step)
        if declined:
            self.agreement.learnt(declined, DECLINED)
        self._poked.set()  # a paused rank looks at once
        for command in asked:  # here, on the listener's thread: a rank stuck in its step still answers
            self._answer_stacks(command)

    def _first_step_now(self) -> int:
        """The first step whose hook points are sure to see a command put in ``pending`` just now: a rank held by a
        pause is inside its step's (it applies what is due there, or between that step's batches and the next);
        else the training thread may be in this step's, or past the next batch's, so two steps on."""
        held = self.paused_at
        return held if held is not None else self.step() + 2

    def ask_stacks(self, command: Command) -> None:
        """A ``stacks`` command learnt: answered as soon as :meth:`learn` lets go of its lock."""
        self._stacks_asked.append(command)

    def set_guard(self, guard: dict[str, Any]) -> None:
        """The run's guards now (``{}``: none), in force at once."""
        self.guard = RankGuard(guard, self._guard_tripped) if guard else None

    def rearm_guard(self) -> None:
        """A resume: the guard watches again (a trip paused the run)."""
        if self.guard is not None:
            self.guard.rearm()

    def _set_pending(self, pending: list[Command]) -> None:
        """With ``_lock`` held: one reference swap (the training thread reads either list whole); tells report()."""
        self.pending = pending
        self.session.commands_due(bool(pending))

    def _answer_stacks(self, command: Command) -> None:
        timing = self.session.timing
        value: Any
        try:
            ok, value = True, thread_stacks.take_stacks(self.training_thread, paused_at=self.paused_at,
                                                 allreduce_in_flight=bool(timing and timing.allreduce_in_flight))
        except Exception as exc:  # noqa: BLE001 - the notebook gets why
            ok, value = False, f"its stacks could not be taken: {type(exc).__name__}: {exc}"
        self.session.supervisor.command_result.remote(command.id, self.session.context.rank, ok, value)

    # ------------------------------------------------------------------ the training thread
    def hook(self) -> None:
        """Register torch's global optimizer step hooks (once): every optimizer stepped in this process from now
        on is steered. The session calls it as it starts, :meth:`unhook` as it ends (a warm worker runs other
        runs later)."""
        if self._hooks:
            return
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._hooks = (register_optimizer_step_pre_hook(self._before_update),
                       register_optimizer_step_post_hook(self._after_update))

    def unhook(self) -> None:
        hooks, self._hooks = self._hooks, ()
        for handle in hooks:
            handle.remove()

    def steer(self, optimizer: Any, schedulers: tuple[Any, ...] = ()) -> Any:
        """Adopt ``optimizer`` now, rather than at its first step, with ``schedulers``: LR schedulers of it that
        hold it through a wrapper (Accelerate's), where a change cannot find them itself. A wrapper is adopted as
        the optimizer inside it (see the module's docstring). Returns ``optimizer`` as given."""
        self.hook()
        inner = wrappers.stepped(optimizer)
        inner._nbtrain_schedulers = [*getattr(inner, "_nbtrain_schedulers", []), *schedulers]
        if inner not in self._met:
            self._adopt(inner)
        return optimizer

    def _adopt(self, optimizer: Any) -> None:
        """Off the step's fast path: the first step of an optimizer not met before (or ``steer``)."""
        self._met.add(optimizer)
        self._met.update(wrappers.inside(optimizer))  # a ZeroRedundancyOptimizer's local one: steered through it
        self.optimizers.append(optimizer)
        hook = getattr(optimizer, "register_load_state_dict_post_hook", None)
        if hook is not None:
            hook(lambda loaded: self._state_loaded.add(id(loaded)))
        if self._counted is None:
            self._counted = optimizer

    def step(self) -> int:
        """The step being taken, as the run's rows will number it: the loader's batch count, else the one after
        the last reported step, else the update count (one past the updates made)."""
        session = self.session
        if session.uses_loader:
            return int(session.step)
        return int(session.last_step) + 1 if session.report_calls else self.updates + 1

    def _before_update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # every optimizer step in the process comes here: with nothing pending, one lookup and one test
        if optimizer not in self._met:
            self._adopt(optimizer)
        if self.pending or self.grad_clip is not None or self.guard is not None:
            self._before_adopted(optimizer)

    def _before_adopted(self, optimizer: Any) -> None:
        if optimizer not in self.optimizers:
            return  # inside an adopted one, whose own hook applied what was due
        if self.guard is not None and not self.guard.gradients_finite(optimizer, self.step()):
            optimizer_settings.drop_gradients(optimizer)  # the same on every rank (DDP averaged them): no rank updates
        if self.pending:
            self._apply_due(user=False)
        if self.grad_clip is not None:
            import torch

            params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            torch.nn.utils.clip_grad_norm_(params, self.grad_clip)

    def _after_update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if optimizer is self._counted:
            self.updates += 1
        if self.pending and optimizer in self.optimizers:  # not inside a step (ZeRO syncs after its inner one)
            self._apply_due(user=True)

    def at_batch(self) -> None:
        """A prepared loader is about to take the next step's batch, with commands pending: a rewind due at that
        step is applied here, between two whole steps (the loader then starts again at its point's place)."""
        step = self.session.step + 1
        applied: set[int] = set()
        while (command := self._next_due(step, lambda c: c.id not in applied
                                         and command_kind(c.kind).between_batches)) is not None:
            applied.add(command.id)
            with self._lock:
                self._set_pending([c for c in self.pending if c.id != command.id])
            self._apply(command, step)

    def at_report(self) -> None:
        """``nbtrain.report()`` with commands pending: a loop that gives nbtrain no optimizer can still be paused,
        checkpointed and sent commands (at its reports; changing an optimizer needs the optimizer)."""
        self._apply_due(user=False, adjust=False)
        self._apply_due(user=True)

    def _apply_due(self, user: bool, adjust: bool = True) -> None:
        step = self.step()
        hook = AFTER_UPDATE if user else BEFORE_UPDATE
        uses_loader = self.session.uses_loader
        applied: set[int] = set()  # once each here (a profile goes back in pending, for its next step)

        def applies_here(command: Command) -> bool:
            kind = command_kind(command.kind)
            return command.id not in applied and kind.hook == hook and not (kind.needs_optimizer and not adjust) \
                and not (kind.between_batches and uses_loader)

        while (command := self._next_due(step, applies_here)) is not None:
            applied.add(command.id)
            with self._lock:
                self._set_pending([c for c in self.pending if c.id != command.id])
            self._apply(command, step)

    def _next_due(self, step: int, applies_here: Callable[[Command], bool]) -> Command | None:
        """The next pending command due at ``step`` that ``applies_here``, its step settled with
        the other ranks; one the supervisor moves on waits in ``pending`` for its new step. Read afresh each
        time: a pause's hold in between learns more."""
        for command in self.pending:
            if command.at_step > step and command.at_step != AS_SOON_AS_BACK:
                return None
            if not applies_here(command):
                continue
            if command.id in self._settled:
                return command
            settled = self.agreement.step_for(command, step)
            with self._lock:
                if settled > step:  # the step moved on: due there (it was the same list unless learn() swapped it)
                    moved = [command.due_at(settled) if c.id == command.id else c for c in self.pending]
                    moved.sort(key=lambda c: (c.at_step, c.id))
                    self._set_pending(moved)
                else:
                    self._settled.add(command.id)
            return command if settled <= step else self._next_due(step, applies_here)
        return None

    def _in_loaded_state(self, command: Command) -> bool:
        """A change an earlier attempt applied at or before the step of the checkpoint this attempt loaded its
        optimizers' state from: that state holds it already (with the LR schedule's progress since, which
        applying it again would undo)."""
        if command.id not in self._replayed or not command_kind(command.kind).held_by_optimizer_state \
                or command.applied_step is None:
            return False
        resumed = self.session.resumed_step
        return (resumed is not None and command.applied_step <= resumed and bool(self.optimizers)
                and all(id(opt) in self._state_loaded for opt in self.optimizers))

    def _apply(self, command: Command, step: int) -> None:
        if self._in_loaded_state(command):  # but a rank's gradient clipping is no optimizer's state
            self.grad_clip = command.settings.get("grad_clip", self.grad_clip)
            return
        kind = command_kind(command.kind)
        before = kind.apply(self, command, step)
        if kind.says_applied:
            self._say_applied(command, step, before)
        kind.after_said(self, command, step)

    def _say_applied(self, command: Command, step: int, before: dict[str, Any] | None) -> None:
        """Every rank says at which step it applied a change (the supervisor checks they agree); not again for a
        change an earlier attempt applied (the run's state, re-applied here)."""
        if command.id not in self._replayed:
            self.session.supervisor.command_applied.remote(command.id, self.session.context.rank, step, before,
                                                           time.time())

    def replayed(self, command: Command) -> bool:
        """Whether ``command`` is an earlier attempt's change, applied again here as the run's state."""
        return command.id in self._replayed

    def has_step_boundary(self) -> bool:
        """Whether this rank has a point between two steps to apply a command at: an optimizer it steers, or a
        loop that calls ``report()``."""
        return bool(self.optimizers) or bool(self.session.report_calls)

    def answer(self, command: Command, ok: bool, value: Any) -> None:
        """This rank's answer to a command the notebook waits on (``send``, ``exec``, ``patch``...)."""
        self.session.supervisor.command_result.remote(command.id, self.session.context.rank, ok, value)

    def run_code(self, command: Command) -> None:
        """``run.exec``: the source in the training code's namespace, here on the training thread; the answer is
        its value and output, or its exception's traceback (training goes on either way)."""
        rank = self.session.context.rank
        value: Any
        try:
            ok, value = True, exec_and_patch.run_source(command.args["source"], command.id)
        except Exception as exc:  # noqa: BLE001 - the notebook gets it; training goes on
            ok, value = False, exec_and_patch.failure(rank, exc, exec_and_patch.source_name("exec", command.id))
        self.answer(command, ok, value)

    def patch_code(self, command: Command, step: int) -> None:
        """``run.patch``: its definitions rebound in the training code's globals, or rank 0's refusal (then it
        never applies: nothing was rebound)."""
        rank = self.session.context.rank
        try:
            refusal = exec_and_patch.patch_globals(command.args["source"], command.args["names"],
                                              bool(command.args.get("new")), command.id)
        except Exception as exc:  # noqa: BLE001 - a definition that raises as it runs: nothing else rebound
            refusal = exec_and_patch.failure(rank, exc, exec_and_patch.source_name("patch", command.id))
        if self.replayed(command):
            return
        if refusal is not None:  # a name it lacks (said as such to the notebook), or the definitions raised
            self.answer(command, False, {"refused": refusal} if refusal.startswith("its training code has no ")
                        else refusal if refusal.startswith("Rank ") else f"Rank {rank}: {refusal}")
            return
        self._say_applied(command, step, None)
        self.answer(command, True, step)

    def end_function(self, step: int) -> None:
        """``run.stop()`` at ``step``: the training function ends here, on every rank at the same step."""
        raise RunStopped(step)

    def adjust(self, settings: dict[str, Any], group_index: int | None) -> None:
        """Apply settings checked by the notebook (:func:`nbtrain._cluster.commands.checked_settings`)."""
        for key, value in settings.items():
            if key == "grad_clip":
                self.grad_clip = value
            else:
                for optimizer in self.optimizers:
                    for index, group in enumerate(optimizer.param_groups):
                        if group_index is None or index == group_index:
                            optimizer_settings.set_value(optimizer, group, key, value)

    def rewind(self, command: Command) -> None:
        """Back to the restore point at the rewind's step, the learning rate scaled by its factor, if any."""
        to_step, skip = command.rewind
        self.points.restore(to_step, skip)
        factor = command.args.get("lr_factor")
        if factor:
            for optimizer in self.optimizers:
                optimizer_settings.rescale_lr(optimizer, factor)
        self.rewinds += 1
        if self.guard is not None:
            self.guard.rearm(forget=True)
        self.session.last_progress = time.time()

    def _guard_tripped(self, step: int, kind: str, message: str) -> None:
        """A guard saw trouble on this rank: the supervisor decides what every rank does about it (not waited for)."""
        ctx = self.session.context
        self.session.supervisor.guard_tripped.remote(ctx.attempt, ctx.rank, self.rewinds, step, kind,
                                                     f"rank {ctx.rank}: {message}")

    def hold(self, step: int) -> None:
        """Every rank waits here, at the same step, until the notebook resumes the run (its resources stay).
        Commands sent meanwhile are due at this step (see the supervisor's steering): they run here."""
        self.paused_at = step
        try:
            while not self.resumed.is_set():
                self._poked.wait(PAUSE_CHECK_S)
                self._poked.clear()
                if self.pending and not self.resumed.is_set():
                    self._apply_due(user=False)
                    self._apply_due(user=True)
        finally:
            self.paused_at = None
            self.session.last_progress = time.time()  # the time paused is not a stall

    def profile(self, command: Command, step: int) -> None:
        """Start the profile, or count one more of its steps; until its last, it waits in ``pending`` for the
        next step (so the hooks' fast path stays one test)."""
        profiling = self.profiling
        if profiling is None:
            try:
                self.profiling = StepProfile(command, self.session.context.device)
            except Exception as exc:  # noqa: BLE001 - e.g. the code runs a profiler of its own: training goes on
                self.session.supervisor.command_result.remote(
                    command.id, self.session.context.rank, False,
                    f"Rank {self.session.context.rank} could not start torch.profiler: {type(exc).__name__}: {exc}")
                return
        elif profiling.command_id != command.id:
            self.session.supervisor.command_result.remote(
                command.id, self.session.context.rank, False,
                f"Rank {self.session.context.rank} is profiling already (profile {profiling.command_id}, "
                f"{profiling.done} of {profiling.steps} steps done); ask again once it has answered.")
            return
        elif profiling.step():
            self.profiling = None
            profiling.finish(self.session)
            return
        with self._lock:
            pending = [*self.pending, command.due_at(step + 1)]
            pending.sort(key=lambda c: (c.at_step, c.id))
            self._set_pending(pending)

    def run_handler(self, command: Command) -> None:
        name, payload = command.handler
        handler = _handlers.get(name)
        rank = self.session.context.rank
        if handler is None:
            ok, value = False, (f"Rank {rank} has no handler for {name!r}: decorate one with "
                                f"@nbtrain.on_command({name!r}) in the training function.")
        else:
            try:
                ok, value = True, handler(**payload)
            except Exception as exc:  # noqa: BLE001 - the notebook gets it; training goes on
                ok, value = False, f"Rank {rank}: {name!r} raised {type(exc).__name__}: {exc}"
        try:
            self.session.supervisor.command_result.remote(command.id, rank, ok, value)
        except Exception as exc:  # noqa: BLE001 - a value that cannot be sent
            self.session.supervisor.command_result.remote(command.id, rank, False,
                                                          f"Rank {rank}: its answer could not be sent: {exc}")

    def stop_requested(self) -> bool:
        """Whether ``run.stop(after="epoch")`` named the epoch this rank is in (or one before it)."""
        return self.stop_after_epoch is not None and self.session.epoch >= self.stop_after_epoch

    def at_epoch_start(self, epoch: int) -> None:
        """Called as a prepared loader (or an integration) begins ``epoch``: past the epoch ``run.stop(after=
        "epoch")`` named, the rank holds here and says so; the supervisor stops the run once every rank does."""
        if self.stop_after_epoch is None or epoch <= self.stop_after_epoch:
            self.session.epoch = epoch
            return
        self.held_after_epoch = self.stop_after_epoch
        threading.Event().wait()  # never set: the run's stop ends this process

    def saved_checkpoint(self) -> bool:
        """``save_checkpoint`` on this rank; False when it must not be kept: a guard tripped and its action is on
        its way (the state may be diverged: the rewind goes back before it, to a point taken earlier)."""
        self.checkpoint_wanted = False
        if self.guard is not None and self.guard.tripped:
            return False
        self.points.capture()
        return True

    # ------------------------------------------------------------------ what the heartbeat says
    def values(self) -> dict[str, list[Any]]:
        """The adjustable settings now, per param group of every steered optimizer (betas as lists)."""
        found: dict[str, list[Any]] = {}
        groups = [group for optimizer in self.optimizers for group in optimizer.param_groups]
        for key in IN_PARAM_GROUPS:
            if groups and all(key in group for group in groups):
                found[key] = [list(group[key]) if key == "betas" else group[key] for group in groups]
        if self.optimizers:
            found["grad_clip"] = [self.grad_clip]
        return found

    def beat(self) -> SteeringBeat:
        """What the heartbeat carries for steering: the step being taken and the rate of steps (measured here,
        on the flusher's thread, from one beat to the next), so the supervisor can pick a step ahead."""
        step, now = self.step(), time.monotonic()
        last_step, last_time = self._beat_mark
        if now - last_time >= 0.05 and step >= last_step:
            rate = (step - last_step) / (now - last_time)
            self._rate = rate if self._rate is None else 0.7 * self._rate + 0.3 * rate
        self._beat_mark = (step, now)
        return SteeringBeat(step=step, rate=self._rate, epoch=self.session.epoch,
                            settings=self.values() if self.optimizers else None, paused_at=self.paused_at,
                            held_after_epoch=self.held_after_epoch,
                            epochs_counted=self.epochs_counted or self.session.uses_loader,
                            restore_points=self.points.steps(), rewind_refusal=self.points.refusal())
