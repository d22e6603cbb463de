"""Every error nbtrain raises derives from :class:`NbtrainError`.

The tree::

    NbtrainError
    ├── ConnectionFailedError     the cluster address cannot be reached or refuses us
    ├── InvalidOptionError        a launch option has the wrong type or value (also a ValueError)
    ├── StorageError              a run's storage directory cannot be created or written
    ├── VersionMismatchError      notebook and cluster run different Ray/Python versions
    ├── ResourcesUnavailableError the cluster cannot hold the requested workers
    ├── NotSerializableError      something the training function uses cannot be sent
    ├── RunNotFoundError          attach()/stop() named a run the cluster does not know
    ├── RunExistsError            launch() named a run that is still going
    ├── NotConnectedError         an operation needs connect() first
    └── RunFailedError            a rank raised or died and the run ended failed

Errors travel between actors and the notebook, so each keeps its message as its
only constructor argument and pickles by that (``__reduce__``).
"""

from __future__ import annotations


class NbtrainError(Exception):
    """Root of nbtrain's errors: ``except nbtrain.NbtrainError`` catches them all.

    Every message says what happened, which rank or object caused it, and what to do next.
    What to do: read the message; the classes below say more about each kind.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> tuple[type[NbtrainError], tuple[str]]:
        return (type(self), (self.message,))

    def __str__(self) -> str:
        return self.message


class ConnectionFailedError(NbtrainError):
    """The cluster address cannot be reached, or it refused the connection.

    Raised by ``connect()`` / ``%ray_connect`` (and by ``nbtrain cluster`` for the embedded
    cluster) when the host does not resolve, nothing listens on the port, the port is not a
    Ray Client server (the GCS or dashboard port was given), the cluster rejected or needs a
    token, or the embedded cluster could not start.
    What to do: follow the message: check the ``ray://host:10001`` address and the tunnel
    or port-forward to it, pass the cluster's token (``--token-file``, ``$RAY_AUTH_TOKEN``;
    ``ray get-auth-token`` on the head prints it), or ``nbtrain cluster stop`` and connect again.
    """


class InvalidOptionError(NbtrainError, ValueError):
    """A launch option (keyword or ``%%ray_train`` flag) has the wrong type or value; nothing was started.

    Raised by ``launch()``, ``tune()``, the magics and the launch panel before anything is
    sent to the cluster; the message names the option, its flag, what it must be and what
    it got. It is also a ``ValueError``.
    What to do: fix that option (the options reference lists each one's values).
    """


class StorageError(NbtrainError):
    """A run's storage directory (``storage=`` or nbtrain's home on the head node) cannot be written.

    Raised at launch when the cluster cannot create or write ``storage=`` (a path not
    shared by every node, no permission, a URI whose credentials the cluster lacks), and by
    ``run.delete()`` when some of a run's files could not be deleted.
    What to do: give a directory every node can write, or a URI whose credentials the
    notebook and every node have (pass them to the ranks with ``env=``); after a failed
    delete, remove the directory the message names by hand.
    """


class VersionMismatchError(NbtrainError):
    """The notebook's Ray or Python version differs from the cluster's.

    Raised by ``connect()`` when the notebook and the cluster run different Ray, Python or
    nbtrain versions, a Ray nbtrain is not tested with, or (embedded cluster) another
    environment's head.
    What to do: install the versions the message names (it gives the ``pip`` command) on
    the side that differs, or ``nbtrain cluster stop`` and connect again from this
    environment.
    """


class ResourcesUnavailableError(NbtrainError):
    """The run asks for more CPUs/GPUs/workers than the cluster has.

    Raised at launch, before anything starts, when ``workers`` times ``cpus_per_worker`` /
    ``gpus_per_worker`` (the minimum, for an elastic run) exceeds the whole cluster, or
    leaves no CPU for the run's Ray ``datasets``. (Ranks that fit the cluster but not what
    other runs leave free wait ``placement_timeout_s``, then the run fails saying so.)
    What to do: ask for fewer or smaller workers, add nodes, or stop runs you no longer
    need (``%ray_status``).
    """


class NotSerializableError(NbtrainError):
    """A value the training function needs cannot be pickled and sent to workers.

    Raised at launch, before any rank starts, naming the value and the chain that reaches
    it (``train`` → ``model`` → ``_lock``): an open file, a lock, a socket, a CUDA context, a
    live Ray object, or a module too big (over 100 MB) or compiled to ship by value.
    What to do: create that value inside the training function instead of capturing it
    from the notebook, or install the module on the cluster.
    """


class RunNotFoundError(NbtrainError):
    """No run of that name exists on the connected cluster.

    Raised by ``attach()``, ``%ray_attach``, ``%ray_stop``, ``attach_sweep()`` and
    ``launch(resume=True)`` for a name the cluster does not know (or a deleted run).
    What to do: check the name with ``nbtrain.runs()`` or ``%ray_status``, and that you are
    connected to the cluster the run was launched on.
    """


class RunExistsError(NbtrainError):
    """A run (or sweep) of that name is still going on the cluster.

    Raised by ``launch()``, ``%%ray_train``, ``tune()`` and ``%%ray_tune`` when ``name=`` is a live
    run's (or sweep's), and by ``run.fork()`` when its ``name=`` is any run's. An *ended* run keeps its
    name without raising this: launching that name again starts a new run ``NAME-2`` (then ``NAME-3``…)
    and says so, leaving the ended run as it was (``attach(NAME)`` still means it).
    What to do: choose another name, attach to the live run (``attach(name)``) and stop it, or, once
    it has ended, continue it with ``resume=True`` (``--resume``).
    """


class NotConnectedError(NbtrainError):
    """The operation needs a cluster connection; call ``nbtrain.connect()``.

    Raised by ``launch()``, ``attach()``, ``runs()`` and the magics before ``connect()``
    (or after ``disconnect()``).
    What to do: ``nbtrain.connect()`` or ``%ray_connect`` first.
    """


class RunFailedError(NbtrainError):
    """The run ended failed; the message lists every failing rank with its traceback.

    Raised by ``run.wait()``, ``run.raise_if_failed()`` and ``launch(wait=True)`` when a
    rank raised or its process died and no restart was left (``max_failures``).
    What to do: fix the code the traceback points at (``%ray_debug`` / ``run.debug()`` shows
    the failing rank's variables) and launch again; ``max_failures=K`` with checkpoints
    lets a run survive a lost worker.
    """


class SweepFailedError(NbtrainError):
    """A sweep as a whole failed (a failed trial does not fail its sweep; see ``sweep.trials``).

    Raised by ``sweep.wait()`` and ``sweep.raise_if_failed()`` when the sweep itself failed,
    e.g. rank 0 never reported the sweep's ``metric``, or Ray Tune raised.
    What to do: follow the message (it names the metric and what was reported), fix the
    training function or the sweep's options, and start the sweep again.
    """
