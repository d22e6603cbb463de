"""Every use nbtrain makes of Ray's private or internal APIs, in this one module (issue 36).

Nothing else in ``nbtrain`` imports ``ray._private``, ``ray._raylet``, ``ray.core.generated``,
``ray.experimental.internal_kv`` or ``ray.train.v2._internal``, or reads a private attribute of a Ray
object (``tests/test_ray_compat.py``). Each entry says which internal it uses, the public API it uses
instead where Ray has one, and what degrades, visibly, when it fails (a probe never fails a run; a
fallback taken says so once on stderr, :func:`say_once`).

Every entry was read in each Ray release nbtrain supports (``TESTED_RAY_MINORS``: 2.54 to 2.60, each
release's wheel; the oldest-Ray tier runs 2.54): they are the same in all of them but two, both on the
Ray Train seam, which ``NbtrainTrainFnUtils`` absorbs by taking any arguments: ``TrainFnUtils.get_preemption_info``
is abstract from Ray 2.58 (absent before), and ``get_all_reported_checkpoints`` takes ``timeout_s`` from 2.56.
One public API differs too, absorbed here: ``ray.train.Result`` takes ``return_value`` from 2.56 on
(:func:`train_result`). Ray's own
``_enable_token_auth`` (2.59 on) is not used: :func:`driver_token` does what it does, as 2.54 allows.
One concept, kept whole: every reach into Ray's internals, in one file that a new Ray release is read
against, entry by entry.

The entries, by the process that calls them:

- every process: ``HEAD_NODE_RESOURCE``, ``on_head_node``, ``is_head_node``;
- the notebook's kernel: ``init_with_metadata``, ``init_driver`` (with ``quiet_shutdown_notices``, fed by
  ``note_rank_processes``), ``driver_token``,
  ``forget_driver_token``,
  ``client_session_lost``,
  ``kernel_ray_lacks_token``,
  ``ping_client_server``, ``cluster_metadata``, ``turn_off_auto_init``, ``upload_local_paths``, ``uploads_missing``;
- the local cluster's head process: ``no_api_server_without_dashboard``;
- an added local node's process: ``start_worker_node``, ``stop_node``;
- a run's supervisor and the warm pool: ``prestart_worker``, ``worker_setup_hook_env``, ``ready_to_deserialize``
  (in a spare process for the next supervisor), ``actor_key``,
  ``draining_nodes`` (``Draining``), ``free_resources_outside``, ``drain_node``, ``standing_request``;
- a session's anchor: ``driver_pid``;
- the notebook's Ray Train shim: ``train_result``;
- the ranks' Ray Train seam: ``TrainFnUtils``, ``set_train_fn_utils``, ``LocalTrainContext``, imported
  on first use (:func:`__getattr__`), so that importing this module does not import Ray Train.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Hashable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # at run time, read on first use (__getattr__): importing this must not import Ray Train
    from ray.train.v2._internal.execution.train_fn_utils import TrainFnUtils, set_train_fn_utils
    from ray.train.v2.api.context import LocalTrainContext

__all__ = [
    "HEAD_NODE_RESOURCE",
    "Draining",
    "LocalTrainContext",
    "TrainFnUtils",
    "actor_key",
    "client_session_lost",
    "cluster_metadata",
    "drain_node",
    "draining_nodes",
    "driver_pid",
    "driver_token",
    "forget_driver_token",
    "free_resources_outside",
    "init_driver",
    "init_with_metadata",
    "is_head_node",
    "kernel_ray_lacks_token",
    "no_api_server_without_dashboard",
    "note_rank_processes",
    "on_head_node",
    "ping_client_server",
    "prestart_worker",
    "quiet_shutdown_notices",
    "ready_to_deserialize",
    "reason",
    "say_once",
    "set_train_fn_utils",
    "standing_request",
    "start_worker_node",
    "stop_node",
    "train_result",
    "turn_off_auto_init",
    "upload_local_paths",
    "uploads_missing",
    "worker_setup_hook_env",
]


_said: set[str] = set()


def say_once(message: str) -> None:
    """Write ``nbtrain: <message>`` to stderr the first time this process meets ``message``.

    On a rank, a supervisor or a warm worker that stderr is the actor's log (``nbtrain logs``); in the
    notebook's kernel it is the cell's output.
    """
    if message not in _said:
        _said.add(message)
        sys.stderr.write(f"nbtrain: {message}\n")


def reason(exc: BaseException) -> str:
    """An exception in one line, for a fallback's message."""
    return f"{type(exc).__name__}: {exc}"


HEAD_NODE_RESOURCE = "node:__internal_head__"


def on_head_node() -> dict[str, float]:
    """Ray ``resources=`` that place an actor or task on the head node (a sliver: it takes no slot).

    Public instead: none that works without the dashboard in Ray 2.60 (``ray.util.state.list_nodes``'
    ``is_head_node`` asks the dashboard, which the embedded cluster runs without; Ray sets no head label).
    Degrades: on a Ray that stops giving the head this resource, a supervisor never places, and
    ``launch()`` times out saying the run stayed pending.
    """
    return {HEAD_NODE_RESOURCE: 0.001}


def is_head_node(node: dict[str, Any]) -> bool:
    """Whether an entry of ``ray.nodes()`` is the head node.

    Public instead: as for :func:`on_head_node`. Degrades: no node is the head, so ``Cluster.nodes()``
    marks none and ``run.drain(node=...)`` naming the head is not refused before Ray is asked.
    """
    return HEAD_NODE_RESOURCE in node.get("Resources", {})


def init_with_metadata(address: str, metadata: Sequence[tuple[str, str]], **kwargs: Any) -> Any:
    """``ray.init(address, **kwargs)`` that sends ``metadata`` (gRPC headers: the token) with every call.

    Public instead: none in Ray 2.60 (Ray's own token mode reads ``RAY_AUTH_MODE`` once, at ``import ray``:
    see :mod:`nbtrain._client.connecting.auth`). Degrades: a Ray that refuses ``_metadata`` makes ``connect()`` fail
    with Ray's error for the argument; ``tests/test_import_order.py`` pins it against the installed Ray.
    """
    import ray

    return ray.init(address, _metadata=list(metadata), **kwargs)


def init_driver(address: str, node_ip_address: str | None, **kwargs: Any) -> Any:
    """``ray.init(address, **kwargs)`` as a driver of the cluster whose GCS is ``address`` (this process must be
    on one of its nodes), on ``node_ip_address`` where given (a loopback cluster's ``127.0.0.1``).

    Public instead: ``ray.init(address)``, which picks the node's address itself: on a cluster bound to
    127.0.0.1 it picks the machine's other address, finds no raylet there and fails. It also rewrites a
    loopback GCS address to that other address (``services.resolve_ip_for_localhost``) unless
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` was in the environment when Ray was imported, which a user's
    kernel does not have: it then retries that address for minutes. So while joining a loopback cluster,
    Ray's constant for that variable reads off. Degrades: a Ray that refuses ``_node_ip_address`` makes
    ``connect()`` fail with Ray's error for the argument; one without the constant, Ray's own behaviour.
    """
    import ray

    if not node_ip_address:
        return ray.init(address, **kwargs)
    from ray._private import ray_constants

    kwargs["_node_ip_address"] = node_ip_address
    before = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    if before is not None and node_ip_address == "127.0.0.1":
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        return ray.init(address, **kwargs)
    finally:
        if before is not None:
            ray_constants.ENABLE_RAY_CLUSTER = before
        quiet_shutdown_notices()


# Ray's notices, published to every driver, that say an expected shutdown in Ray's words of a failure.
# ``serve.shutdown()``: Serve's controller exits while its own ``graceful_shutdown`` call, which has infinite
# retries, is still open, so every driver's cell gets "(raylet) Task ServeController.graceful_shutdown failed.
# There are infinite retries remaining…" although Serve shut down as asked (Ray 2.54 to 2.60).
# And nbtrain's processes by design: warm ranks, a spare process for the next supervisor, the session's anchor
# and pool reserve no CPU, so a 2-CPU laptop cluster soon holds more Python workers than Ray expects for its
# CPUs, and every driver's cell got "(raylet) WARNING: 16 PYTHON worker processes have been started on node …
# 4x the maximum expected startup concurrency (2) …", about nothing the user did or can change.
EXPECTED_NOTICES = (re.compile(r"Task ServeController\.graceful_shutdown failed"),
                    re.compile(r"WARNING: \d+ PYTHON worker processes have been started on node\b"))
# A rank's process that dies is told by its run, in nbtrain's words and naming the rank ("Rank 1's worker process
# died (pid 18995 on 127.0.0.1) …", in its events, the dashboard and the run's error); Ray's notice of that death
# ("(raylet) A worker died or was killed while executing a task … Worker IP address: … Worker PID: …") would say
# it again, in Ray's words and ids, in whatever cell runs at that moment (05_fault_tolerance's page showed it).
RANK_DEATH_NOTICE = re.compile(r"A worker died or was killed while executing a task\b.*?"
                               r"Worker IP address: (\S+) .*?Worker PID: (\d+)\b", re.DOTALL)
_rank_processes: set[tuple[str, int]] = set()  # (node IP, pid) of every rank the kernel has seen in a summary


def note_rank_processes(workers: Iterable[dict[str, Any]]) -> None:
    """Remember the ranks' processes in a run's summary (``workers``), so that Ray's notice of one's death
    stays out of the cells: the run tells it itself.

    Internal, as for :func:`quiet_shutdown_notices`, which reads what this remembers. Degrades as it does: where
    Ray's printer is not found, Ray's notice is printed beside the run's own words."""
    for worker in workers:
        if isinstance(worker.get("pid"), int) and worker.get("node"):
            _rank_processes.add((str(worker["node"]).split(" ", 1)[0], worker["pid"]))  # "IP (node 1a2b3c)" too


def _said_by_nbtrain(line: str) -> bool:
    if any(notice.match(line) for notice in EXPECTED_NOTICES):
        return True
    death = RANK_DEATH_NOTICE.match(line)
    return death is not None and (death.group(1), int(death.group(2))) in _rank_processes


def quiet_shutdown_notices() -> None:
    """Keep :data:`EXPECTED_NOTICES` and the deaths of ranks nbtrain reports itself (:data:`RANK_DEATH_NOTICE`)
    out of the notebook's cells; every other notice of Ray's is printed as before.

    Internal: ``ray._private.worker.print_to_stdstream``, which the driver's thread that listens for Ray's
    error notices (``listen_error_messages``) calls with ``pid == "raylet"``; it is wrapped once.
    Public instead: none filters those notices (``log_to_driver=False`` does not: they are not logs).
    Degrades: a Ray without the function prints the notice, as it does without nbtrain.
    """
    from ray._private import worker

    printer = getattr(worker, "print_to_stdstream", None)
    if printer is None or getattr(printer, "nbtrain_quiet", False):
        return

    def print_unless_expected(data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        lines = data.get("lines") if isinstance(data, dict) and data.get("pid") == "raylet" else None
        if lines and all(_said_by_nbtrain(str(line)) for line in lines):
            return
        printer(data, *args, **kwargs)

    print_unless_expected.nbtrain_quiet = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = print_unless_expected


_token_held: list[bool] = []  # non-empty while this process's Ray holds a token driver_token gave it


@contextlib.contextmanager
def driver_token(token: str | None) -> Iterator[None]:
    """While ``ray.init`` joins a cluster as a driver: this process's Ray in token mode with ``token`` (a
    driver's channels are Ray's own, so the per-call header of :func:`init_with_metadata` cannot reach them).

    Ray's token loader reads ``RAY_AUTH_MODE`` and ``RAY_AUTH_TOKEN`` from the environment: they are set,
    Ray's config re-read and the loader's cache emptied and filled (what Ray's own ``_enable_token_auth``
    does from 2.59 on), and on leaving the variables are put back as they were: Ray keeps the mode and
    the token it read, and no process the kernel starts later inherits the token.
    :func:`forget_driver_token` ends the mode, after ``ray.shutdown()``.

    Public instead: the same two variables set before ``import ray`` and left there, which a kernel that
    imported Ray first cannot do, and which every process it starts would inherit. Degrades: where the
    config or loader cannot be reached, said once on stderr; then Ray's own error (``UNAUTHENTICATED``)
    comes from ``connect()``.
    """
    names = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
    before = {name: os.environ.get(name) for name in names}
    if token is not None:
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
        _reload_token_state(load=True)
        _token_held.append(True)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def forget_driver_token() -> None:
    """After ``ray.shutdown()``: this process's Ray back to what its environment says (as for
    :func:`driver_token`); nothing when no token was given. Degrades: as for :func:`driver_token`."""
    if _token_held:
        _token_held.clear()
        _reload_token_state(load=False)


def _reload_token_state(load: bool) -> None:
    import importlib

    try:
        raylet: Any = importlib.import_module("ray._raylet")  # compiled; its stub lacks these names
        raylet.Config.initialize("")
        loader = raylet.AuthenticationTokenLoader.instance()
        loader.reset_cache()
        if load:
            loader.has_token()  # read now, while the environment holds it
    except (ImportError, AttributeError) as exc:
        say_once(f"cannot make this kernel's Ray use the cluster's token ({reason(exc)})")


def cluster_metadata(host: str, port: int, metadata: Sequence[tuple[str, str]], timeout_s: float,
                     credentials: Any = None) -> dict[str, Any]:
    """What the GCS at ``host:port`` says the cluster runs (``ray_version``, ``python_version``, ...): the record
    every ``ray start --head`` writes (Ray's ``CLUSTER_METADATA`` key), read with one ``InternalKVGet`` on a
    channel of nbtrain's, sending ``metadata`` (the token); raises ``grpc.RpcError`` as the server answers
    (``UNIMPLEMENTED``: not a GCS; ``UNAUTHENTICATED``: the token).

    Public instead: none before connecting (``ray.init`` checks the same record, but only after it has
    started its own connection, and says a mismatch after the cluster's protocol may already have failed).
    Degrades: without the GCS's protos, ``{}`` (said once): versions are compared once connected.
    """
    import grpc

    try:
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError as exc:
        say_once(f"cannot read the cluster's versions before connecting ({reason(exc)})")
        return {}
    target = f"{host}:{port}"
    channel = grpc.insecure_channel(target) if credentials is None else grpc.secure_channel(target, credentials)
    try:
        reply = gcs_service_pb2_grpc.InternalKVGcsServiceStub(channel).InternalKVGet(
            gcs_service_pb2.InternalKVGetRequest(key=b"CLUSTER_METADATA", namespace=b"cluster"),
            timeout=timeout_s, metadata=list(metadata))
    finally:
        channel.close()
    try:
        found: dict[str, Any] = json.loads(reply.value.decode())
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def train_result(return_value: Any = None, **fields: Any) -> Any:
    """``ray.train.Result(**fields)`` with the training function's ``return_value``, on every supported Ray.

    Public instead: ``Result(..., return_value=)`` itself, from Ray 2.56 on (2.54 and 2.55 have no such
    field). Degrades: on those, the value is set as the result's attribute of that name, so
    ``result.return_value`` reads the same; ``dataclasses.fields(result)`` does not list it.
    """
    import dataclasses

    from ray.train import Result

    if any(field.name == "return_value" for field in dataclasses.fields(Result)):
        return Result(**fields, return_value=return_value)
    result = Result(**fields)
    result.return_value = return_value  # Ray 2.54-2.55: no such field
    return result


def client_session_lost() -> bool:
    """Whether this process's Ray Client session failed for good: its data channel gave up reconnecting
    (the session's server ended, or the connection was gone longer than Ray Client's grace period).

    Public instead: ``ray.is_initialized()``, which stays True after that, so a lost session looked
    connected (every call then raised Ray's ConnectionError, and ``connect()`` kept the dead session).
    Degrades: False, said once on stderr: a lost session is found by the first call that fails.
    """
    try:
        from ray.util.client import ray as client

        if not client.is_connected():
            return False  # not a Ray Client session (a driver, or nothing)
        data_client = client.get_context().client_worker.data_client
        return bool(data_client._in_shutdown)
    except Exception as exc:  # noqa: BLE001 - a probe: a failure is reported, never raised
        say_once(f"cannot tell whether the Ray Client session is alive ({reason(exc)})")
        return False


def kernel_ray_lacks_token() -> bool:
    """Whether this process's Ray has its own token mode on (``RAY_AUTH_MODE=token``) and no token to send.

    Public instead: none (Ray's token loader lives in ``ray._raylet``). Degrades: where the loader
    cannot be read, False, said once on stderr: ``connect()`` skips its fast, explained refusal and Ray's
    own error comes instead.
    """
    import importlib

    try:
        raylet: Any = importlib.import_module("ray._raylet")  # compiled; its stub lacks these names
        from ray.exceptions import AuthenticationError

        if raylet.get_authentication_mode() != raylet.AuthenticationMode.TOKEN:
            return False
    except (ImportError, AttributeError) as exc:
        say_once(f"cannot read Ray's own token mode in this kernel ({reason(exc)}); not checked before connecting")
        return False
    loader = raylet.AuthenticationTokenLoader.instance()
    loader.reset_cache()  # the loader keeps what it read first; the user may have set a token since
    try:
        return not loader.has_token()
    except AuthenticationError:
        return True


def ping_client_server(host: str, port: int, metadata: Sequence[tuple[str, str]], timeout_s: float,
                       credentials: Any = None) -> None:
    """One Ray Client ``ClusterInfo(PING)`` on a channel of nbtrain's (Ray's adds its own token in token
    mode), TLS with ``credentials`` where given; raises ``grpc.RpcError`` as the server answers.

    Public instead: none (``ray.init`` reports a dead address and a missing or wrong token alike, as a
    timeout after ~30 s). Degrades: without Ray Client's protos, no ping (said once): that timeout.
    """
    import grpc

    try:
        from ray.core.generated import ray_client_pb2, ray_client_pb2_grpc
    except ImportError as exc:
        say_once(f"cannot ping the Ray Client server before connecting ({reason(exc)})")
        return
    target = f"{host}:{port}"
    channel = grpc.insecure_channel(target) if credentials is None else grpc.secure_channel(target, credentials)
    try:
        stub = ray_client_pb2_grpc.RayletDriverStub(channel)
        stub.ClusterInfo(ray_client_pb2.ClusterInfoRequest(type=ray_client_pb2.ClusterInfoType.PING),
                         timeout=timeout_s, metadata=list(metadata))
    finally:
        channel.close()


def turn_off_auto_init() -> None:
    """Make a Ray call in this process raise while not connected, instead of starting a Ray inside it.

    Else a call after ``disconnect()`` (a dashboard's follower thread) starts a private Ray in the kernel:
    not loopback-only, no token, ignored by the sidebar, and dying with the kernel.

    Public instead: ``RAY_ENABLE_AUTO_CONNECT=0``, read only at ``import ray`` (too late in a kernel that
    imported it first). Degrades: said once on stderr; then the kernel behaves as with plain Ray.
    """
    try:
        from ray._private import auto_init_hook

        auto_init_hook.enable_auto_connect = False
    except ImportError as exc:
        say_once(f"cannot turn off Ray's auto-init in this kernel ({reason(exc)}): a Ray call made while "
                 f"disconnected may start a Ray inside it")


def no_api_server_without_dashboard() -> None:
    """Have a head node started without the dashboard (``--include-dashboard=false``) start no API server.

    Ray starts one anyway, a Python process that loads only the usage-stats module there (usage stats are off
    on the embedded cluster, and the jobs and state modules load only with the dashboard), and the head's
    raylet starts only once it answers: about 1 s of a 2-core laptop's cluster start, and ~100 MB kept. So
    :meth:`Node.start_api_server` does nothing in this process when the dashboard is off.

    Public instead: none (``ray start`` has no switch for it). Degrades: where the method is missing, says
    so once on stderr (the head's log) and the head starts as Ray starts it.
    """
    import ray._private.node

    start = getattr(ray._private.node.Node, "start_api_server", None)
    if start is None:
        say_once("Ray's head node has no start_api_server here: it starts its API server as usual")
        return

    def start_unless_no_dashboard(node: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("include_dashboard", args[0] if args else None) is not False:
            return start(node, *args, **kwargs)
        return None

    ray._private.node.Node.start_api_server = start_unless_no_dashboard


def start_worker_node(gcs_address: str, num_cpus: int, num_gpus: int | None, ports: dict[str, int]) -> Any:
    """Start a raylet, object store and agents bound to 127.0.0.1 that join ``gcs_address`` with the head's
    token; returns the node, for :func:`stop_node`.

    Public instead: ``ray start --address``, which cannot join a loopback head (see
    :mod:`nbtrain._client.local.local_node_process`). Degrades: the node process exits with Ray's error,
    and adding a local node fails showing it; ``tests/test_multi_node.py`` pins it.
    """
    import ray._private.node
    from ray._private.authentication.authentication_token_setup import ensure_token_if_auth_enabled
    from ray._private.parameter import RayParams

    params = RayParams(
        node_ip_address="127.0.0.1", gcs_address=gcs_address, num_cpus=num_cpus, num_gpus=num_gpus,
        min_worker_port=0, max_worker_port=0, node_manager_port=ports["node_manager"],
        object_manager_port=ports["object_manager"], dashboard_agent_listen_port=ports["dashboard_agent_listen"],
        metrics_agent_port=ports["metrics_agent"], metrics_export_port=ports["metrics_export"],
        runtime_env_agent_port=ports["runtime_env_agent"], include_log_monitor=False,
    )
    ensure_token_if_auth_enabled(None, create_token_if_missing=False)
    return ray._private.node.Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True)


def stop_node(node: Any) -> None:
    """End the processes of a node :func:`start_worker_node` started (its raylet leaves the cluster).

    Public instead: as for :func:`start_worker_node`. Degrades: the node process exits with the error and
    Ray's reaper, started with the node, ends what it leaves.
    """
    node.kill_all_processes(check_alive=False, allow_graceful=True)


def prestart_worker(keep_alive_s: float, timeout_s: float, runtime_env: dict[str, Any] | None = None) -> None:
    """Ask this node's raylet for one idle worker process of the caller's job and runtime env, or of
    ``runtime_env`` (as Ray serializes an actor's: ``RuntimeEnv(...).serialize()``, what the actor then sees
    in ``get_runtime_env_string()``) (its ``PrestartWorkers`` RPC); raises whatever the call raises.

    Public instead: none. Degrades: the caller (:func:`nbtrain._cluster.warm.spare_process.prestart_for_this_job`)
    says once on stderr that there is no spare process, and a relaunch's supervisor starts its own.
    """
    import ray
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc
    from ray.runtime_env import RuntimeEnv

    context = ray.get_runtime_context()
    node = next(n for n in ray.nodes() if n["NodeID"] == context.get_node_id())
    request = node_manager_pb2.PrestartWorkersRequest(
        language=common_pb2.PYTHON, job_id=bytes.fromhex(context.get_job_id()), num_workers=1,
        keep_alive_duration_secs=max(int(keep_alive_s), 1))
    # a process serves one env
    request.runtime_env_info.serialized_runtime_env = (context.get_runtime_env_string() if runtime_env is None
                                                       else RuntimeEnv(**runtime_env).serialize())
    channel = init_grpc_channel(f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}")
    try:
        node_manager_pb2_grpc.NodeManagerServiceStub(channel).PrestartWorkers(request, timeout=timeout_s)
    finally:
        channel.close()


def worker_setup_hook_env(hook: str) -> dict[str, str]:
    """Environment variables that make a Ray worker process call ``hook`` ("module.function") as it starts
    (the hook must never raise: Ray ends a process whose setup hook fails).

    Public instead: ``runtime_env={"worker_process_setup_hook": ...}``, which Ray applies to a job's
    processes only, not to one actor's. Degrades: ``{}`` where Ray no longer names the variable: the
    supervisor imports its code when it is created, as without a spare process (0.2 s of a relaunch).
    """
    try:
        from ray._private.ray_constants import WORKER_PROCESS_SETUP_HOOK_ENV_VAR
    except ImportError:
        return {}
    return {WORKER_PROCESS_SETUP_HOOK_ENV_VAR: hook}


def ready_to_deserialize() -> None:
    """Build this Ray worker process's serialization context now, not when its first task's arguments arrive: Ray
    builds it on first use, importing pydantic and Ray Data's Arrow serializers for it (about 0.2 s on a 2-core
    machine, 94% of the time a new actor took on an idle process before its constructor ran). A process started
    ahead of need (a spare for the next supervisor) calls this while it waits.

    Public instead: none. Degrades: nothing is prepared, and the first task pays for it, as without this.
    """
    try:
        import ray._private.worker

        ray._private.worker.global_worker.get_serialization_context()
    except Exception as exc:  # noqa: BLE001 - a setup hook must not raise (Ray would end the process)
        say_once(f"a spare process did not prepare Ray's serialization ({type(exc).__name__}: {exc})")


def actor_key(handle: Any) -> Hashable:
    """What two handles of one actor have in common (one passed through Ray is another object).

    Public instead: the handle itself, where its class compares and hashes by actor id (Ray 2.60's
    ``ActorHandle`` does); else its ``_actor_id``. Degrades: else the object's identity: a warm worker
    given back by a run is ended instead of kept idle, and ``nbtrain.release_warm`` shows it without a pid.
    """
    kind: Any = type(handle)
    key: Hashable = handle
    if kind.__eq__ is object.__eq__ or kind.__hash__ is None:
        key = getattr(handle, "_actor_id", None) or id(handle)
    return key


def upload_local_paths(runtime_env: dict[str, Any]) -> dict[str, Any]:
    """``runtime_env`` with its local ``working_dir`` and ``py_modules`` uploaded to the cluster (``gcs://`` URIs
    in their place), so that ranks on any node — and a cluster on another machine — find them.

    Public instead: none — Ray uploads local paths only for a Ray Client session's own
    ``ray.init(runtime_env=)``; the ranks are created by the supervisor, where these paths do not exist.
    Degrades: a failed upload refuses the launch, naming the folder (and Ray's reason).
    """
    import logging
    import tempfile

    from ray._private.ray_constants import RAY_RUNTIME_ENV_URI_PIN_EXPIRATION_S_ENV_VAR as pin_variable
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    quiet = logging.getLogger("nbtrain.upload")
    # The upload first asks the server to pin the package for a while, which Ray Client's server does not
    # implement (it retries for ever); 0 skips the pin. The run's supervisor holds the packages instead
    # (see _packing.runtime_env.packages_to_hold).

    before = os.environ.get(pin_variable)
    os.environ[pin_variable] = "0"
    try:
        with tempfile.TemporaryDirectory(prefix="nbtrain-upload-") as scratch:
            uploaded: dict[str, Any] = upload_py_modules_if_needed(dict(runtime_env), include_gitignore=True,
                                                                   scratch_dir=scratch, logger=quiet)
            uploaded = upload_working_dir_if_needed(uploaded, include_gitignore=True, scratch_dir=scratch,
                                                    logger=quiet)
    finally:
        if before is None:
            os.environ.pop(pin_variable, None)
        else:
            os.environ[pin_variable] = before
    uploaded.pop("excludes", None)  # applied by the upload
    return uploaded


def uploads_missing(places: Sequence[str]) -> list[str]:
    """The ``gcs://`` packages among a runtime_env's ``places`` that the cluster no longer has (Ray deletes an
    upload once no live process's environment names it: a run's supervisor holds its own until the run ends).

    Public instead: none. Internal: ``ray._private.runtime_env.packaging.package_exists`` (the GCS's key-value
    store, which Ray Client serves too). Degrades: a Ray without it reports none missing, and a missing one
    fails the ranks' start with Ray's own error.
    """
    try:
        from ray._private.runtime_env.packaging import package_exists
    except ImportError:
        return []
    return [uri for uri in places if uri.startswith("gcs://") and not package_exists(uri)]



class Draining(NamedTuple):
    """The nodes Ray reports as draining, or none and why Ray's node state could not be read."""

    nodes: frozenset[str]
    unreadable: str = ""  # empty when the nodes were read


def draining_nodes() -> Draining:
    """The live nodes Ray reports as draining (a cloud's preemption notice, the autoscaler, a raylet told
    to stop): each node's state snapshot in the GCS node table (what ``tests/test_elastic.py`` pins).

    Public instead: autoscaler v2's status (nodes ``DRAINING``), when the node table cannot be read.
    Degrades: never raises; no nodes and the reason, which an elastic run says once, keeping its size.
    """
    try:
        return Draining(_draining_from_node_table())
    except Exception as exc:  # noqa: BLE001 - a probe: a failure is reported, never raised
        first = reason(exc)
    try:
        return Draining(_draining_from_autoscaler_status())
    except Exception as exc:  # noqa: BLE001 - as above
        return Draining(frozenset(), f"{first}; autoscaler status: {reason(exc)}")


def _draining_from_node_table() -> frozenset[str]:
    import ray
    from ray.core.generated import gcs_pb2

    gcs = ray._private.worker.global_worker.gcs_client
    draining = gcs_pb2.NodeSnapshot.State.Value("DRAINING")
    return frozenset(node_id.hex() for node_id, info in gcs.get_all_node_info().items()
                     if info.state == gcs_pb2.GcsNodeInfo.ALIVE and info.state_snapshot.state == draining)


def _draining_from_autoscaler_status() -> frozenset[str]:
    import ray
    from ray.autoscaler.v2.sdk import get_cluster_status

    status = get_cluster_status(ray.get_runtime_context().gcs_address)
    return frozenset(str(node.node_id) for node in status.active_nodes + status.idle_nodes
                     if node.node_status == "DRAINING" and node.node_id)


def free_resources_outside(nodes: set[str]) -> dict[str, float]:
    """The cluster's free resources, not counting those of ``nodes``.

    Public instead: none per node in Ray 2.60 without the dashboard (``ray.available_resources()`` is the
    sum). Degrades: where the per-node view cannot be read, the sum less all of ``nodes``' resources
    (``ray.nodes()``), said once on the supervisor's stderr: a run leaving a draining node may shrink
    further than it had to, never onto the node.
    """
    import ray

    try:
        per_node = ray._private.state.available_resources_per_node()
    except Exception as exc:  # noqa: BLE001 - a probe: fall back to the public sum
        say_once(f"cannot read Ray's free resources per node ({reason(exc)}); counting draining nodes as full")
        free = dict(ray.available_resources())
        for node in ray.nodes():
            if node["Alive"] and node["NodeID"] in nodes:
                for key, amount in node.get("Resources", {}).items():
                    free[key] = max(0.0, free.get(key, 0.0) - amount)
        return free
    free = {}
    for node_id, resources in per_node.items():
        if node_id not in nodes:
            for key, amount in resources.items():
                free[key] = free.get(key, 0.0) + amount
    return free


def drain_node(node_id: str, why: str, deadline_s: float) -> tuple[bool, str]:
    """Tell Ray that ``node_id`` is about to go (a preemption): (accepted, Ray's reason when it refused).

    Public instead: none in Python (``ray drain-node`` from a shell). Degrades: ``run.drain()`` raises it.
    """
    import ray
    from ray.core.generated import autoscaler_pb2

    gcs = ray._private.worker.global_worker.gcs_client
    accepted, refusal = gcs.drain_node(node_id, autoscaler_pb2.DrainNodeReason.DRAIN_NODE_REASON_PREEMPTION,
                                       why, int((time.time() + deadline_s) * 1000))
    return bool(accepted), str(refusal)


def standing_request() -> list[dict[str, float]]:
    """The cluster's standing ``request_resources`` bundles, where its autoscaler reads them: v2 from the
    GCS's resource constraints, v1 from a key of the GCS's internal KV store.

    Public instead: autoscaler v2's status (``get_cluster_status``'s cluster constraint demand), first;
    v1 has none. Degrades: raises; an elastic run then says in its events that it could not withdraw
    its request of the autoscaler.
    """
    from ray.autoscaler.v2.utils import is_autoscaler_v2

    if not is_autoscaler_v2():
        from ray._private.ray_constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
        from ray.experimental.internal_kv import _internal_kv_get

        stored = _internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
        return [dict(bundle) for bundle in json.loads(stored)] if stored else []
    import ray

    try:
        from ray.autoscaler.v2.sdk import get_cluster_status

        demands = get_cluster_status(ray.get_runtime_context().gcs_address).resource_demands
        return [dict(by_count.bundle) for constraint in demands.cluster_constraint_demand
                for by_count in constraint.bundles_by_count for _ in range(by_count.count)]
    except Exception as exc:  # noqa: BLE001 - the public status failed: the GCS's own reply, as Ray reads it
        say_once(f"cannot read autoscaler v2's status ({reason(exc)}); reading the GCS's resource state")
    from ray.autoscaler.v2.sdk import get_cluster_resource_state

    state = get_cluster_resource_state(ray._private.worker.global_worker.gcs_client)
    return [dict(by_count.request.resources_bundle) for constraint in state.cluster_resource_constraints
            for by_count in constraint.resource_requests for _ in range(by_count.count)]


def driver_pid(job_id: str) -> int | None:
    """The pid of job ``job_id``'s driver (for a Ray Client session, the session's server), if known.

    Public instead: ``ray.util.state.list_jobs`` (asks the dashboard, which the embedded cluster runs
    without), when the job table cannot be read. Degrades: None, said once on stderr: the session's
    server keeps its CPU priority (ranks may lose a few percent of throughput on a laptop).
    """
    import ray

    try:
        jobs: list[dict[str, Any]] = ray._private.state.jobs()
        return next((int(job["DriverPid"]) for job in jobs if job["JobID"] == job_id and job["DriverPid"]), None)
    except Exception as exc:  # noqa: BLE001 - a convenience: try the public listing
        first = reason(exc)
    try:
        from ray.util.state import list_jobs

        pids = [job.driver_info.pid for job in list_jobs(detail=True) if job.job_id == job_id and job.driver_info]
        return int(pids[0]) if pids and pids[0] else None
    except Exception as exc:  # noqa: BLE001 - as above
        say_once(f"cannot find the Ray Client session's server ({first}; list_jobs: {reason(exc)}): "
                 f"it keeps its CPU priority")
        return None


_RAY_TRAIN_SEAM = {"TrainFnUtils": "ray.train.v2._internal.execution.train_fn_utils",
                   "set_train_fn_utils": "ray.train.v2._internal.execution.train_fn_utils",
                   "LocalTrainContext": "ray.train.v2.api.context"}


def __getattr__(name: str) -> Any:
    """Ray Train v2's seam: ``TrainFnUtils`` / ``set_train_fn_utils`` (what every ``ray.train.*`` call
    reaches) and ``LocalTrainContext`` (what ``get_context()`` returns in local mode), on first use.

    Public instead: none (Ray Train's public API assumes its own controller). Degrades: an untested Ray's
    ``ray.train.*`` calls raise naming the Ray to install (``seam.untested_ray``); where the seam is
    gone, the rank fails naming this module.
    """
    if name not in _RAY_TRAIN_SEAM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_RAY_TRAIN_SEAM[name]), name)
