"""The TrainWorker actor: one process per rank that runs the user's function.

The supervisor creates N of these inside a placement group (or leases them,
warm, from the notebook session's :mod:`~nbtrain._cluster.warm.warm_pool`), asks each where it
landed, then calls :meth:`TrainWorker.run` on all of them at once. ``run``
joins the ``torch.distributed`` process group, runs the function, and returns
an *outcome* dict instead of raising, so the supervisor gets the rank, step
and formatted traceback without unwrapping Ray's error types. A process that
dies shows up on the supervisor as ``RayActorError`` instead.

On a cluster whose nodes are on loopback (the embedded one) every socket a rank
listens on is bound to loopback too: a ``tcp://127.0.0.1`` rendezvous alone
still makes the TCPStore listen on all interfaces, and gloo picks the
hostname's interface.
"""

from __future__ import annotations

import datetime
import gc
import ipaddress
import os
import socket
import sys
import time
import traceback
import types
from typing import TYPE_CHECKING, Any

import cloudpickle
import ray

from nbtrain._cluster import working_folder
from nbtrain._cluster.launch_phases import FUNCTION_LOADED, GROUP_FORMED
from nbtrain._cluster.priority import BOOKKEEPING_NICENESS
from nbtrain._cluster.rank.actor.torch_warmup import load_lazy_torch, load_torch_for_a_launch
from nbtrain._cluster.rank.allocator import keep_freed_memory
from nbtrain._cluster.rank.inspection import post_mortem
from nbtrain._cluster.rank.rank_steering import RunStopped
from nbtrain._cluster.rank.ray_train import seam_watch
from nbtrain._cluster.rank.session import TrainingSession, set_session
from nbtrain._net import free_port
from nbtrain._packing import shipping

INIT_BARRIER_ENV = "TORCH_DIST_INIT_BARRIER"  # torch's switch for a store barrier at the end of init

if TYPE_CHECKING:
    from nbtrain._cluster.rank.payload import WorkerPayload

# Test-only fault injection: while the folder this names holds files, a rank process that starts removes one
# and exits at once, as a process lost while importing torch does (killing a PID cannot hit that moment).
FAULT_START_EXIT_ENV = "NBTRAIN_FAULT_RANK_START_EXIT"


class TrainWorker:
    def __init__(self, background: bool = False) -> None:
        """``background``: warmed ahead of any launch; torch is imported at a bookkeeping priority (see
        torch_warmup) so the notebook and the first launch's supervisor come first."""
        _fault_exit_while_starting()
        # Ray starts workers at a low CPU priority; training is the job, so ask for
        # normal priority when allowed (needs privileges; otherwise stay as we are).
        try:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
        except OSError:
            pass
        self._malloc_tuned = keep_freed_memory()  # before torch allocates anything; see allocator
        if background:  # ahead of any launch: what a first step would load, at a bookkeeping priority
            load_lazy_torch(BOOKKEEPING_NICENESS)
        else:  # on a launch's path: what every rank needs (torch_warmup says why not more)
            load_torch_for_a_launch()
        import torch

        # what a fresh process starts from, for a warm worker's next run (see warm_pool)
        self._fresh_environ = dict(os.environ)
        self._fresh_torch_seed = torch.initial_seed()
        self._runs = 0
        self._tidied = False  # tidy() ran since the last run
        self._store_listener: socket.socket | None = None  # rank 0's rendezvous port, listening from placement

    def ping(self) -> bool:
        return True

    def tidy(self) -> None:
        """Between runs (the warm pool asks as a run gives its workers back): free the run's garbage and
        its CUDA cache, off the next run's path."""
        import torch

        gc.collect()
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        self._tidied = True

    def where(self) -> dict[str, Any]:
        """Where this rank landed, for local ranks, the worker table and MASTER_ADDR."""
        ctx = ray.get_runtime_context()
        node_ip = ray.util.get_node_ip_address()
        if self._store_listener is not None:
            self._store_listener.close()
        # On loopback the port listens from now on: a rank that reaches the rendezvous before rank 0
        # is queued instead of refused (a refusal costs the TCPStore client's ~0.5 s retry back-off).
        self._store_listener = _listener(node_ip) if _is_loopback(node_ip) else None
        return {
            "node_ip": node_ip,
            "node_id": ctx.get_node_id(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "port": self._store_listener.getsockname()[1] if self._store_listener else free_port(node_ip),
            "malloc_tuned": self._malloc_tuned,
        }

    def run(self, payload: WorkerPayload) -> dict[str, Any]:
        import torch
        import torch.distributed as dist

        rank = payload.place.rank
        listener, self._store_listener = self._store_listener, None
        if self._runs:
            self._start_afresh()
        self._runs += 1
        self._tidied = False
        if payload.place.cuda_visible_devices is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = payload.place.cuda_visible_devices
        os.environ.update(_torchrun_environment(payload))
        torch.set_num_threads(max(1, int(payload.code.cpus_per_worker)))
        device = torch.device(payload.place.device_name)
        if device.type == "cuda" and torch.cuda.is_available():
            torch.cuda.set_device(device)
        elif device.type == "cuda":  # Ray gave a GPU (perhaps a custom resource) that this torch cannot use
            print(f"nbtrain: Ray gave this rank GPU(s) {payload.place.cuda_visible_devices}, but torch sees no CUDA "
                  f"device; code using {device} will fail. Install a CUDA build of torch on the cluster, or set "
                  "gpus_per_worker=0.", file=sys.stderr)
        session = TrainingSession(payload, device)
        context = session.context
        set_session(session)
        seam_watch.watch()
        session.start()
        back = working_folder.enter(payload.code.folder)  # this run's folder, left in the finally below
        try:
            _join_process_group(payload, listener)
            session.phases[GROUP_FORMED] = time.time()
            fn = shipping.loads(payload.code.fn_bytes)
            session.phases[FUNCTION_LOADED] = time.time()
            result = fn(context.config) if payload.code.fn_takes_config else fn()
            outcome: dict[str, Any] = {"ok": True, "rank": rank, "result": cloudpickle.dumps(result)}
        except RunStopped:  # every rank ends at the step run.stop() settled: nothing of the user's failed
            outcome = {"ok": True, "stopped": True, "rank": rank, "result": cloudpickle.dumps(None)}
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the supervisor
            user_code = _from_user_code(exc.__traceback__)
            text = "".join(traceback.format_exception(type(exc), exc, user_code))
            sys.stderr.write(text)
            captured = post_mortem.keep(exc, user_code, payload.report_to.supervisor, rank, payload.attempt,
                                        payload.debug_capture_mb)
            outcome = {
                "ok": False, "rank": rank, "type": type(exc).__name__, "message": str(exc)[:2000],
                "traceback": text, "step": session.current_step(),
                # a failure in the user's code leaves the process as a finished run does, unless it used
                # CUDA (an error there can leave the device unusable for the process's next run) or the
                # post-mortem's capture still runs on its thread
                "reusable": captured and not torch.cuda.is_initialized(),
            }
        finally:
            set_session(None)
            seam_watch.unwatch()
            working_folder.leave(back)
            if dist.is_initialized():
                try:
                    dist.destroy_process_group()
                except Exception:  # noqa: BLE001 - the group may be broken by the failure
                    pass
        session.close("stopped" if outcome.get("stopped") else "finished" if outcome["ok"] else "failed")
        # how many pushes this rank sent: the supervisor ends the attempt only once all have landed
        outcome["pushes"] = session.seq
        outcome["unsent"] = session.unsent()
        return outcome

    def _start_afresh(self) -> None:
        """A warm worker's next run starts as a fresh process would, except for modules already imported:
        the environment as the worker started, the same torch seed, new random seeds, no CUDA cache
        (tidy() has freed the previous run's objects, or this does). The function and its globals are
        unpickled anew for every run."""
        import random

        import torch

        os.environ.clear()
        os.environ.update(self._fresh_environ)
        torch.manual_seed(self._fresh_torch_seed)
        random.seed()
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()
        if not self._tidied:
            self.tidy()


def _fault_exit_while_starting() -> None:
    folder = os.environ.get(FAULT_START_EXIT_ENV)
    if not folder or not os.path.isdir(folder):
        return
    for token in sorted(os.listdir(folder)):
        try:
            os.unlink(os.path.join(folder, token))
        except FileNotFoundError:  # another starting rank took it
            continue
        print(f"nbtrain test fault: rank process {os.getpid()} exits while starting ({FAULT_START_EXIT_ENV})",
              file=sys.stderr, flush=True)
        os._exit(70)


def _torchrun_environment(payload: WorkerPayload) -> dict[str, str]:
    """The variables torchrun sets, so code written for it and libraries that read them (Lightning, Hugging Face,
    Accelerate, Ray's Lightning environment) see this rank; the process group is already joined when the function
    runs (see their_code.process_group). ``TORCHELASTIC_RUN_ID`` (the run's name) is torch's and Lightning's sign
    that the processes were started for them (``is_torchelastic_launched()``, ``TorchElasticEnvironment``);
    ``OMP_NUM_THREADS``, set by torchrun too unless given, keeps Accelerate from resetting torch's thread count."""
    place, join = payload.place, payload.process_group
    nodes = -(-place.world_size // max(1, place.local_world_size))  # as torchrun has it when nodes hold alike
    return {"RANK": str(place.rank), "WORLD_SIZE": str(place.world_size), "LOCAL_RANK": str(place.local_rank),
            "LOCAL_WORLD_SIZE": str(place.local_world_size), "GROUP_RANK": str(place.node_rank),
            "GROUP_WORLD_SIZE": str(nodes), "ROLE_RANK": str(place.rank), "ROLE_WORLD_SIZE": str(place.world_size),
            "ROLE_NAME": "default", "NODE_RANK": str(place.node_rank), "MASTER_ADDR": join.master_addr,
            "MASTER_PORT": str(join.master_port), "TORCHELASTIC_RUN_ID": payload.run_name,
            "TORCHELASTIC_RESTART_COUNT": str(max(0, payload.attempt - 1)),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or str(max(1, int(payload.code.cpus_per_worker)))}


def _join_process_group(payload: WorkerPayload, listener: socket.socket | None) -> None:
    """Join the run's group and return only once every rank has: torch's barrier after init (over the store,
    so it touches no device) keeps a rank whose function ends at once from closing its side of the mesh while
    a slower peer is still connecting, which fails that peer's ``init_process_group`` with "Connection closed
    by peer"."""
    previous = os.environ.get(INIT_BARRIER_ENV)
    os.environ[INIT_BARRIER_ENV] = "1"
    try:
        _init_process_group(payload, listener)
    finally:
        if previous is None:
            os.environ.pop(INIT_BARRIER_ENV, None)
        else:
            os.environ[INIT_BARRIER_ENV] = previous


def _init_process_group(payload: WorkerPayload, listener: socket.socket | None) -> None:
    import torch.distributed as dist

    place, join = payload.place, payload.process_group
    is_master = place.rank == 0
    own_port = listener is not None and is_master and listener.getsockname()[1] == join.master_port
    if listener is not None and not own_port:
        listener.close()
    timeout = datetime.timedelta(seconds=join.collective_timeout_s)
    host, port = join.master_addr, join.master_port
    if not _is_loopback(host):
        dist.init_process_group(backend=join.backend, init_method=f"tcp://{host}:{port}",
                                rank=place.rank, world_size=place.world_size, timeout=timeout)
        return
    loopback_interface = "lo0" if sys.platform == "darwin" else "lo"
    os.environ["GLOO_SOCKET_IFNAME"] = loopback_interface
    os.environ["NCCL_SOCKET_IFNAME"] = loopback_interface
    listen_fd = None
    if is_master:  # the TCPStore takes the listening socket over (and closes it)
        listen_fd = listener.detach() if own_port and listener is not None else _listener(host, port).detach()
    store = dist.TCPStore(host, port, place.world_size, is_master, timeout, master_listen_fd=listen_fd)
    dist.init_process_group(backend=join.backend, store=store, rank=place.rank,
                            world_size=place.world_size, timeout=timeout)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: a node of a real cluster
        return False


def _listener(host: str, port: int = 0) -> socket.socket:
    """A socket listening on ``host`` only (``port`` 0: one the system picks), for the TCPStore to take over."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def _from_user_code(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback from the first frame outside nbtrain: the rank's own call into the user's function
    (this module, a ``%%ray_train`` cell's runner) is not the user's to read. nbtrain frames deeper in
    (a ``report()`` the user called) stay."""
    first = tb
    while first is not None and first.tb_frame.f_code.co_filename.startswith(post_mortem.NBTRAIN_DIR):
        first = first.tb_next
    return first if first is not None else tb
