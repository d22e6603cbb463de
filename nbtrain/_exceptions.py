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
    ├── RunExistsError            launch() named a run that already exists
    ├── NotConnectedError         an operation needs connect() first
    └── RunFailedError            a rank raised or died and the run ended failed

Errors travel between actors and the notebook, so each keeps its message as its
only constructor argument and pickles by that (``__reduce__``).
"""

from __future__ import annotations


class NbtrainError(Exception):
    """Root of nbtrain's errors: ``except nbtrain.NbtrainError`` catches them all."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> tuple[type[NbtrainError], tuple[str]]:
        return (type(self), (self.message,))

    def __str__(self) -> str:
        return self.message


class ConnectionFailedError(NbtrainError):
    """The cluster address cannot be reached, or it refused the connection."""


class InvalidOptionError(NbtrainError, ValueError):
    """A launch option (keyword or ``%%ray_train`` flag) has the wrong type or value; nothing was started."""


class StorageError(NbtrainError):
    """A run's storage directory (``storage=`` or nbtrain's home on the head node) cannot be written."""


class VersionMismatchError(NbtrainError):
    """The notebook's Ray or Python version differs from the cluster's."""


class ResourcesUnavailableError(NbtrainError):
    """The run asks for more CPUs/GPUs/workers than the cluster has."""


class NotSerializableError(NbtrainError):
    """A value the training function needs cannot be pickled and sent to workers."""


class RunNotFoundError(NbtrainError):
    """No run of that name exists on the connected cluster."""


class RunExistsError(NbtrainError):
    """A run of that name already exists on the cluster."""


class NotConnectedError(NbtrainError):
    """The operation needs a cluster connection; call ``nbtrain.connect()``."""


class RunFailedError(NbtrainError):
    """The run ended failed; the message lists every failing rank with its traceback."""


class SweepFailedError(NbtrainError):
    """A sweep as a whole failed (a failed trial does not fail its sweep; see ``sweep.trials``)."""
