"""How nbtrain holds up as runs get long, wide and many: memory, CPU, feed latency, redraw, processes left.

Starts its own loopback cluster (a throwaway ``NBTRAIN_HOME``), then measures three things
and prints one markdown table each:

* **rows** — one rank reports N rows of 3 values as fast as it can (N = 10^5 … 10^7). The
  benchmark process follows the run as a dashboard does (``run.refresh(wait_s=1)``, at most one
  per ``FOLLOW_POLL_S``, feeding a ``WidgetDashboard``'s history). Figures: the supervisor's
  peak RSS and CPU seconds, the notebook's (this process's) RSS growth, feed latency (report →
  row in the notebook, p50/p95), and the dashboard's redraw time at the end.
* **ranks** — a SIMULATION of wide runs: 256 ranks do not fit on 2 cores, so 2 real workers
  each run ``ranks/2`` reporter threads, and every thread is a simulated rank with its own
  worker-side reporting session (``report()`` and the flusher that pushes to the supervisor:
  nbtrain's own code), reporting 10 times a second, without DDP. Figures: the supervisor's
  CPU (cores) while ingesting, the feed latency p50/p95, the notebook's RSS growth and the
  redraw time of the band drawing.
* **steering** — a SIMULATION of wide runs steered: 2 real workers each run ``ranks/2`` simulated ranks
  (threads), each with its own worker-side session — reporter, flusher and the steering listener
  whose standing question waits on the supervisor, or on its simulated node's relay that asks once for the
  node (``--relay``): nbtrain's own code — a tiny model and optimizer,
  10 steps a second and a restore point every 20 steps. torch's optimizer step hooks are called
  directly around each update (torch's are global to a process: they would cross the simulated
  ranks). The notebook adjusts, pauses (then resumes), rewinds and runs ``run.exec`` on every rank a few times each
  (exec's "notebook's call" is its round trip: call → every rank's value).
  Figures: call → learnt and call → applied on every rank (p50/p95), whether every rank applied
  each command at the same step, the supervisor's threads and its CPU while the ranks only stand.
* **finished runs** — N short runs launched and ended: supervisor processes left afterwards
  (target 0), Ray worker processes on the head before and after, and ``attach()`` time of a
  finished run.

::

    python benchmarks/scale.py                               # rows 1e5,1e6,2e6; ranks 2,16,64,256; 20 runs
    python benchmarks/scale.py --rows 1e7 --ranks 256 --finished-runs 100
    python benchmarks/scale.py --only ranks --ranks 64,256 --relay both
    python benchmarks/scale.py --only steering --steered-ranks 64,256 --relay both
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import threading
import time
from typing import Any

import psutil

from _own_cluster import own_cluster


def supervisor_processes() -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if " ".join(process.info["cmdline"] or []).startswith("ray::RunSupervisor"):
            found.append(process)
    return found


def ray_worker_processes() -> int:
    count = 0
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if line.startswith("ray::") or "default_worker.py" in line:
            count += 1
    return count


class SupervisorWatch:
    """Samples the run's supervisor process: peak RSS, and its CPU seconds between two marks."""

    def __init__(self) -> None:
        self.peak_rss = 0.0
        self.peak_uss = 0.0  # private memory: RSS also counts pages of Ray's shared object store it read
        self.cpu = 0.0
        self._process: psutil.Process | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> SupervisorWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def cpu_now(self) -> float:
        return self.cpu

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            if self._process is None:
                found = supervisor_processes()
                if not found:
                    continue
                self._process = found[0]
            try:
                memory = self._process.memory_full_info()
                self.peak_rss = max(self.peak_rss, memory.rss / 2**20)
                self.peak_uss = max(self.peak_uss, memory.uss / 2**20)
                times = self._process.cpu_times()
                self.cpu = times.user + times.system
            except psutil.Error:  # the run ended and its supervisor exited
                return


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def follow(run: Any, dashboard: Any, until: Any) -> list[float]:
    """Follow ``run`` like a dashboard; returns report → notebook latencies (s) of the rows seen live."""
    from nbtrain._views.dashboard.follower import FOLLOW_POLL_S

    latencies: list[float] = []
    while True:
        began = time.monotonic()
        rows = run.refresh(wait_s=1.0)
        now = time.time()
        latencies.extend(now - row["time"] for row in rows[-2000:])
        history = dashboard.history
        history.rows_seen = max(history.rows_seen, run.reader.row_window_start)
        history.add(run.reader.rows_since(history.rows_seen))
        if until():
            return latencies
        time.sleep(max(0.0, FOLLOW_POLL_S - (time.monotonic() - began)))  # a dashboard's pace


def redraw_ms(dashboard: Any) -> float:
    dashboard._draw_curves()
    times = []
    for _ in range(10):
        start = time.perf_counter()
        dashboard._draw_curves()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ------------------------------------------------------------------ the training functions
def simulated_session(real: Any, rank: int, ranks: int, relay: Any) -> Any:
    """SIMULATION: a worker-side session of its own for simulated ``rank`` of ``ranks``, made from the real
    rank's payload (its supervisor, its run), as the worker actor makes one."""
    from nbtrain._cluster.rank import session as sessions

    payload = real.payload
    simulated = dataclasses.replace(
        payload, commands=[],
        place=dataclasses.replace(payload.place, rank=rank, world_size=ranks, local_rank=rank, local_world_size=ranks,
                                  node_rank=0),
        code=dataclasses.replace(payload.code, config={}, datasets={}),
        checkpoints=dataclasses.replace(payload.checkpoints, storage=None),
        report_to=dataclasses.replace(payload.report_to, relay=relay))
    return sessions.TrainingSession(simulated, real.context.device)


def in_threads(target: Any, ranks: list[int]) -> None:
    """``target(rank)`` for each rank, each on a thread of its own; returns once all have."""
    threads = [threading.Thread(target=target, args=(rank,)) for rank in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def report_rows(config: dict[str, Any]) -> None:
    import math

    import nbtrain

    for step in range(config["rows"]):
        nbtrain.report(step=step, loss=1.0 / (step + 1), accuracy=math.sin(step), lr=1e-3)


def start_node_relay(real: Any, node_ranks: int) -> None:
    """Each worker is a simulated node of ``node_ranks`` ranks: its relay, as the worker group makes one, for the
    real rank's session and the simulated ones made after it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from nbtrain._cluster.relay.push_relay import PushRelay

    node = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    real.relay = ray.remote(PushRelay).options(num_cpus=0, scheduling_strategy=node).remote(
        real.supervisor, node_ranks, real.context.attempt)
    # up before the ranks report, as a run's relays start before its ranks run: its process start is not feed time
    ray.get(real.relay.socket_address.remote())


def simulate_ranks(config: dict[str, Any]) -> None:
    """SIMULATION: this worker runs ranks/2 reporter threads, each a simulated rank with its own session."""
    import time as t

    from nbtrain._cluster.rank import session as sessions

    real = sessions.current_session()
    ranks, seconds, per_s = config["ranks"], config["seconds"], config["reports_per_s"]
    mine = [rank for rank in range(ranks) if rank % real.context.world_size == real.context.rank]
    if config["relay"]:
        start_node_relay(real, len(mine))

    def reporter(rank: int) -> None:
        if rank == real.context.rank:  # the real rank's own session reports for it
            fake = real
        else:
            fake = simulated_session(real, rank, ranks, real.relay)
            fake._thread.start()  # the flusher only: the simulated ranks share the real rank's stdout
        began = t.time()
        step = 0
        while t.time() - began < seconds:
            step += 1
            fake.report({"step": step, "loss": 1.0 / step + rank * 1e-3, "accuracy": 0.5, "lr": 1e-3})
            t.sleep(max(0.0, began + step / per_s - t.time()))
        if fake is not real:
            fake.close("finished")

    in_threads(reporter, mine)


def simulate_steered_ranks(config: dict[str, Any]) -> list[tuple[int, int, str, int, float, float]]:
    """SIMULATION: this worker runs ranks/2 steered ranks (threads), each with its own session and steering.
    Returns what each of them saw: (rank, command id, kind, step applied at, time learnt, time applied)."""
    import os as o
    import threading as th
    import time as t

    import torch

    import nbtrain
    from nbtrain._cluster.rank import session as sessions

    torch.set_num_threads(1)
    real = sessions.current_session()
    ranks, per_s = config["ranks"], config["steps_per_s"]
    mine = [rank for rank in range(ranks) if rank % real.context.world_size == real.context.rank]
    seen: list[tuple[int, int, str, int, float, float]] = []
    learnt: dict[tuple[int, int], float] = {}
    if config["relay"]:
        start_node_relay(real, len(mine))
    in_step = th.Barrier(len(mine))
    ending = [False]

    def lockstep() -> bool:
        """Every simulated rank at the same step, as DDP's allreduce holds real ones: the threads here, and the
        two workers by an allreduce of the real rank's process group; True once the benchmark says to end (all
        ranks end at the same step, none left waiting for the others)."""
        if in_step.wait() == 0:
            done = torch.tensor([float(o.path.exists(config["done"]))])
            if torch.distributed.is_initialized():
                torch.distributed.all_reduce(done, op=torch.distributed.ReduceOp.MAX)
            ending[0] = bool(done.item())
        in_step.wait()
        return ending[0]

    def steered(rank: int) -> None:
        if rank == real.context.rank:
            session = real
        else:
            session = simulated_session(real, rank, ranks, relay=real.relay)
            session._thread.start()     # its flusher: rows and heartbeats (steps, restore points)
            session.steering.start()    # its standing question on the supervisor
        steering = session.steering
        learn, apply = steering.learn, steering._apply

        def learning(commands: list[Any]) -> None:  # the time each command reached this rank
            now = t.time()
            for command in commands:
                learnt.setdefault((rank, command.id), now)
            learn(commands)

        def applying(command: Any, step: int) -> None:
            seen.append((rank, command.id, command.kind, step, learnt.get((rank, command.id), float("nan")),
                         t.time()))
            apply(command, step)

        steering.learn, steering._apply = learning, applying  # type: ignore[method-assign]
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        steering.steer(optimizer)           # what prepare_optimizer does
        if session is not real:
            steering.unhook()               # torch's hooks are the real rank's (global): called directly below
        steering.points.models.append(model)  # what prepare_model does: a rewind restores it
        session.uses_loader = True            # a prepared loader numbers the steps; a rewind is applied before one
        x = torch.randn(8, 4)
        while not lockstep():
            if steering.pending:
                steering.at_batch()         # what a prepared loader calls before it takes a batch
            session.step += 1
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            steering._before_update(optimizer, (), {})  # torch's optimizer step pre-hook: pauses and changes
            with torch.no_grad():
                for param in model.parameters():
                    param -= optimizer.param_groups[0]["lr"] * param.grad
            steering._after_update(optimizer, (), {})
            session.report({"step": session.step, "loss": loss.item(), "lr": optimizer.param_groups[0]["lr"]})
            if session.step % 20 == 0:
                if session is real:
                    nbtrain.save_checkpoint({"model": model.state_dict(), "step": session.step})
                else:
                    steering.saved_checkpoint()  # save_checkpoint's part on a rank that stores nothing
            t.sleep(1 / per_s)
        if session is not real:
            session.close("finished")

    in_threads(steered, mine)
    return seen


def quick(config: dict[str, Any]) -> int:
    import nbtrain

    nbtrain.report(step=1, loss=1.0)
    return 1


# ------------------------------------------------------------------ the three measurements
def measure_rows(rows: int) -> dict[str, Any]:
    import nbtrain
    from nbtrain._views.dashboard.dashboard import WidgetDashboard

    before = rss_mb()
    with SupervisorWatch() as watch:
        run = nbtrain.launch(report_rows, workers=1, config={"rows": rows}, total_steps=rows,
                             name=f"rows-{rows}")
        dashboard = WidgetDashboard(run)
        started = time.monotonic()
        latencies = follow(run, dashboard, lambda: run.reader.summary.get("state") in ("succeeded", "failed"))
        took = time.monotonic() - started
        grown = rss_mb() - before
    drawn = redraw_ms(dashboard)
    run.raise_if_failed()
    stored = run.reader.rows_fetched
    run.delete()
    return {"rows": rows, "received": stored, "supervisor_mb": watch.peak_rss, "supervisor_uss": watch.peak_uss,
            "supervisor_cpu_s": watch.cpu,
            "notebook_mb": grown, "p50_ms": 1000 * percentile(latencies, 0.5),
            "p95_ms": 1000 * percentile(latencies, 0.95), "redraw_ms": drawn, "seconds": took}


def measure_ranks(ranks: int, seconds: float, relay: bool) -> dict[str, Any]:
    import nbtrain
    from nbtrain._views.dashboard.dashboard import WidgetDashboard

    before = rss_mb()
    with SupervisorWatch() as watch:
        run = nbtrain.launch(simulate_ranks, workers=2, name=f"ranks-{ranks}", feed_relay="never",
                             config={"ranks": ranks, "seconds": seconds, "reports_per_s": 10, "relay": relay})
        dashboard = WidgetDashboard(run)
        dashboard.wide = ranks > 8
        # CPU over the steady middle of the run: from the first rows until 80 % of its time
        marks: dict[str, float] = {}

        def until() -> bool:
            now = time.monotonic()
            if "start" not in marks and run.reader.rows_fetched > ranks:
                marks["start"], marks["cpu0"] = now, watch.cpu_now()
            if "start" in marks and "end" not in marks and now - marks["start"] > 0.8 * seconds - 2:
                marks["end"], marks["cpu1"] = now, watch.cpu_now()
            return run.reader.summary.get("state") in ("succeeded", "failed")

        latencies = follow(run, dashboard, until)
        grown = rss_mb() - before
    run.raise_if_failed()
    drawn = redraw_ms(dashboard)
    rows = run.reader.rows_fetched
    run.delete()
    cores = (marks.get("cpu1", 0.0) - marks.get("cpu0", 0.0)) / max(marks.get("end", 1.0) - marks.get("start", 0.0),
                                                                   1e-9)
    return {"ranks": ranks, "relay": relay, "rows": rows, "supervisor_cores": cores, "supervisor_mb": watch.peak_rss,
            "supervisor_uss": watch.peak_uss,
            "notebook_mb": grown, "p50_ms": 1000 * percentile(latencies, 0.5),
            "p95_ms": 1000 * percentile(latencies, 0.95), "redraw_ms": drawn}


def measure_steering(ranks: int, repeats: int, relay: bool) -> dict[str, Any]:
    import nbtrain

    done = os.path.join(tempfile.mkdtemp(prefix="nbtrain-scale-"), "done")
    run = nbtrain.launch(simulate_steered_ranks, workers=2, name=f"steered-{ranks}", feed_relay="never",
                         config={"ranks": ranks, "steps_per_s": 10, "done": done, "relay": relay})
    try:
        def standing() -> bool:  # every rank stepping, with a restore point to go back to
            last: dict[int, int] = {}
            for row in run.metrics:
                last[row["rank"]] = max(last.get(row["rank"], 0), row["step"])
            return len(last) == ranks and min(last.values()) > 25
        deadline = time.monotonic() + float(os.environ.get("SCALE_STANDING_S", "300"))
        while not standing():
            run.refresh(wait_s=1.0)
            run.raise_if_failed()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{ranks} simulated ranks did not all take 25 steps in time")
        supervisor = supervisor_processes()[0]
        threads = supervisor.num_threads()
        cpu_before, quiet_began, step_before = sum(supervisor.cpu_times()[:2]), time.monotonic(), run.summary()["step"]
        import ray

        from nbtrain._cluster.names import find_supervisor

        actor = find_supervisor(run.name)
        questions = []  # the questions for commands waiting on the supervisor, sampled while the ranks only stand
        while time.monotonic() - quiet_began < 5:  # the supervisor's cost of their questions and pushes
            questions.append(ray.get(actor.standing_questions.remote()))
            time.sleep(0.25)
        quiet = time.monotonic() - quiet_began
        standing_cores = (sum(supervisor.cpu_times()[:2]) - cpu_before) / quiet
        steps_per_s = (run.summary()["step"] - step_before) / quiet
        print(f"  {ranks} ranks standing: {steps_per_s:.1f} steps/s, supervisor {standing_cores:.2f} cores, "
              f"{threads} threads, {max(questions)} questions waiting at most", flush=True)
        calls: list[tuple[str, float, float]] = []  # (kind, time called, the notebook's wait), in order

        failures: list[str] = []

        def called(kind: str, act: Any) -> None:
            began = time.time()
            try:
                act()
            except nbtrain.NbtrainError as refused:  # e.g. not applied by rank 0 in 30 s: said in the table
                failures.append(f"{kind}: {refused}")
                print(f"  {kind} failed: {refused}", flush=True)
            calls.append((kind, began, time.time() - began))

        for index in range(repeats):
            lr = 0.1 / (index + 2)
            called("adjust", lambda: run.adjust(lr=lr, wait=True))  # noqa: B023 - called at once
            called("pause", lambda: run.pause(wait=True))
            run.resume()  # also a pause that did not apply in time: called off
            time.sleep(2.5)  # past the next restore point (20 steps at 10/s): a rewind goes back to a fresh one
            called("rewind", lambda: run.rewind(wait=True))
            time.sleep(1.0)
            called("exec", lambda: run.exec("step", timeout=60, show_output=False))  # every rank's answer
        open(done, "w").close()
        run.wait(timeout=300)
        run.raise_if_failed()
        seen = [entry for worker in run.result for entry in worker]
    finally:
        open(done, "w").close()
        if not run.state.is_terminal:
            run.stop()
    figures: dict[str, Any] = {"ranks": ranks, "relay": relay, "supervisor_threads": threads,
                               "questions": max(questions),
                               "standing_cores": standing_cores, "steps_per_s": steps_per_s, "failures": failures}
    for kind in ("adjust", "pause", "rewind", "exec"):
        # the n-th call of a kind is the n-th command of that kind the ranks applied (ids are issued in order)
        ids = sorted({entry[1] for entry in seen if entry[2] == kind})
        began = dict(zip(ids, [at for k, at, _wait in calls if k == kind]))  # a command never issued has no id
        applied = [entry for entry in seen if entry[1] in began]
        to_learn = [learnt - began[command_id] for _rank, command_id, _k, _step, learnt, _at in applied]
        to_apply = [at - began[command_id] for _rank, command_id, _k, _step, _learnt, at in applied]
        by_command = {command_id: [entry[3] for entry in applied if entry[1] == command_id] for command_id in ids}
        same_step = sum(len(steps) == ranks and len(set(steps)) == 1 for steps in by_command.values())
        figures[kind] = {"commands": len(ids), "same_step": same_step, "applied": len(applied),
                         "learn_p50": percentile(to_learn, 0.5), "learn_p95": percentile(to_learn, 0.95),
                         "apply_p50": percentile(to_apply, 0.5), "apply_p95": percentile(to_apply, 0.95),
                         "notebook_wait": statistics.median(wait for k, _at, wait in calls if k == kind)}
    run.delete()
    return figures


def measure_finished(count: int) -> dict[str, Any]:
    import nbtrain

    workers_before = ray_worker_processes()
    names = [f"finished-{index}" for index in range(count)]
    batch = 4  # a few at a time: 4 one-CPU runs fill the 4 logical CPUs
    for start in range(0, count, batch):
        runs = [nbtrain.launch(quick, workers=1, name=name) for name in names[start:start + batch]]
        for run in runs:
            run.wait(timeout=300)
        print(f"  {min(start + batch, count)}/{count} runs finished", flush=True)
    deadline = time.monotonic() + 60
    while supervisor_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = len(supervisor_processes())
    attach_s = []
    for name in names[:5]:
        start = time.perf_counter()
        run = nbtrain.attach(name)
        assert run.state == nbtrain.RunState.SUCCEEDED and run.result == [1]
        attach_s.append(time.perf_counter() - start)
    listed = len(nbtrain.runs())
    for name in names:
        nbtrain.attach(name).delete()
    return {"runs": count, "supervisors_left": left, "listed": listed, "ray_workers_before": workers_before,
            "ray_workers_after": ray_worker_processes(), "attach_s": statistics.median(attach_s),
            "attach_max_s": max(attach_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1e5,1e6,2e6", help="rows of the long runs, comma-separated (1e5,1e6,2e6)")
    parser.add_argument("--ranks", default="2,16,64,256", help="simulated ranks of the wide runs (2,16,64,256)")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long each wide run reports (20)")
    parser.add_argument("--relay", choices=("both", "on", "off"), default="both",
                        help="wide and steered runs with a relay per simulated node, without, or both (both)")
    parser.add_argument("--steered-ranks", default="64,256", help="simulated ranks of the steered runs (64,256)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="adjusts, pauses, rewinds and execs of each steered run (3)")
    parser.add_argument("--finished-runs", type=int, default=20, help="short runs launched and ended (20)")
    parser.add_argument("--only", choices=("rows", "ranks", "steering", "finished"), help="measure one of them only")
    args = parser.parse_args()
    relays = {"both": (False, True), "on": (True,), "off": (False,)}[args.relay]
    long_runs: list[dict[str, Any]] = []
    wide: list[dict[str, Any]] = []
    steered: list[dict[str, Any]] = []
    finished: dict[str, Any] | None = None
    with own_cluster("nbtrain-scale-", num_cpus=4):
        measure_rows(1000)  # imports and first widgets: not counted in the first size's notebook memory
        for size in args.rows.split(",") if args.only in (None, "rows") else []:
            long_runs.append(measure_rows(int(float(size))))
            print(f"done: {long_runs[-1]}", flush=True)
        for ranks in args.ranks.split(",") if args.only in (None, "ranks") else []:
            for relay in relays:
                wide.append(measure_ranks(int(ranks), args.seconds, relay))
                print(f"done: {wide[-1]}", flush=True)
        for ranks in args.steered_ranks.split(",") if args.only in (None, "steering") else []:
            for relay in relays:
                steered.append(measure_steering(int(ranks), args.repeats, relay))
            print(f"done: {steered[-1]}", flush=True)
        if args.only in (None, "finished"):
            finished = measure_finished(args.finished_runs)
            print(f"done: {finished}", flush=True)

    if long_runs:
        print_long(long_runs)
    if wide:
        print_wide(wide, args.seconds)
    if steered:
        print_steered(steered)
    if finished:
        print_finished(finished)


def print_long(long_runs: list[dict[str, Any]]) -> None:
    print("\n**Long runs** (1 rank, 3 values per row, reported as fast as it can)\n")
    print("| rows | received | supervisor peak RSS (private) | supervisor CPU | notebook RSS growth "
          "| feed p50 / p95 | redraw | run took |")
    print("|---|---|---|---|---|---|---|---|")
    for r in long_runs:
        print(f"| {r['rows']:,} | {r['received']:,} | {r['supervisor_mb']:.0f} MB ({r['supervisor_uss']:.0f} MB) | "
              f"{r['supervisor_cpu_s']:.1f} s | "
              f"{r['notebook_mb']:+.0f} MB | {r['p50_ms']:.0f} / {r['p95_ms']:.0f} ms | {r['redraw_ms']:.1f} ms | "
              f"{r['seconds']:.0f} s |")


def print_wide(wide: list[dict[str, Any]], seconds: float) -> None:
    print(f"\n**Wide runs** (SIMULATED ranks: reporter threads in 2 workers, 10 reports/s each, "
          f"{seconds:g} s)\n")
    print("| ranks | push relay per node | rows | supervisor CPU (cores) | supervisor peak RSS (private) "
          "| notebook RSS growth | feed p50 / p95 | redraw |")
    print("|---|---|---|---|---|---|---|---|")
    for r in wide:
        relay = "yes" if r["relay"] else "no"
        print(f"| {r['ranks']} | {relay} | {r['rows']:,} | {r['supervisor_cores']:.2f} | {r['supervisor_mb']:.0f} MB "
              f"({r['supervisor_uss']:.0f} MB) | "
              f"{r['notebook_mb']:+.0f} MB | {r['p50_ms']:.0f} / {r['p95_ms']:.0f} ms | {r['redraw_ms']:.1f} ms |")


def print_steered(steered: list[dict[str, Any]]) -> None:
    print("\n**Steering wide runs** (SIMULATED ranks: threads in 2 workers, each with its own session and steering, "
          "10 steps/s)\n")
    print("| ranks | relay per node (one question for its ranks) | steps/s | supervisor threads "
          "| questions waiting on it (max) "
          "| supervisor CPU, ranks standing | command | every rank at one step "
          "| call → learnt p50 / p95 | call → applied p50 / p95 | notebook's call (wait=True) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in steered:
        for kind in ("adjust", "pause", "rewind", "exec"):
            k = r[kind]
            print(f"| {r['ranks']} | {'yes' if r['relay'] else 'no'} | {r['steps_per_s']:.1f} | "
                  f"{r['supervisor_threads']} | {r['questions']} | "
                  f"{r['standing_cores']:.2f} cores | {kind} | "
                  f"{k['same_step']}/{k['commands']} | {1000 * k['learn_p50']:.0f} / {1000 * k['learn_p95']:.0f} ms | "
                  f"{1000 * k['apply_p50']:.0f} / {1000 * k['apply_p95']:.0f} ms | {k['notebook_wait']:.2f} s |")
        for failure in r["failures"]:
            print(f"\n{r['ranks']} ranks, relay {'yes' if r['relay'] else 'no'}: {failure}")


def print_finished(f: dict[str, Any]) -> None:
    print("\n**Finished runs**\n")
    print("| runs ended | supervisors left | listed by runs() | Ray worker processes before / after "
          "| attach() of a finished run (median / max) |")
    print("|---|---|---|---|---|")
    print(f"| {f['runs']} | {f['supervisors_left']} | {f['listed']} | {f['ray_workers_before']} / "
          f"{f['ray_workers_after']} | {f['attach_s']:.2f} / {f['attach_max_s']:.2f} s |")


if __name__ == "__main__":
    main()
