"""The exceptions allreduce_rs raises: every failure is an :class:`AllreduceError`, and its subclass says whose
fault it was (the caller's arguments, ranks that disagree, a peer that is gone, something the driver cannot do,
the launcher)."""

from typing import Iterable, Optional


class AllreduceError(RuntimeError):
    """Any failure of the communicator or its launcher (a driver call, a kernel, a closed communicator)."""


class ArgumentError(AllreduceError, ValueError):
    """A call's arguments were refused before any work: dtype, layout, device, alignment, size, overlap."""


class CapacityError(ArgumentError):
    """A message larger than the communicator's ``capacity_bytes``."""

    def __init__(self, message: str, nbytes: Optional[int] = None, capacity: Optional[int] = None) -> None:
        super().__init__(message)
        #: The bytes the call asked for.
        self.nbytes = nbytes
        #: The communicator's capacity in bytes.
        self.capacity = capacity


class MismatchError(AllreduceError):
    """Ranks disagree: their options, tables or registrations differ from rank 0's."""


class PeerError(AllreduceError):
    """A peer never arrived (it died, hung or was never started) or gave up; ``ranks`` names it."""

    def __init__(self, message: str, ranks: Iterable[int] = ()) -> None:
        super().__init__(message)
        #: The ranks that did not arrive (or the rank that aborted), as far as the wait could tell.
        self.ranks = tuple(ranks)


class UnsupportedError(AllreduceError):
    """The driver or the job cannot do this: no such driver here, memory that cannot be shared, too many ranks."""


class LauncherError(AllreduceError):
    """No launcher environment was found, or a launched job failed; ``rank`` is the first rank that failed."""

    def __init__(self, message: str, rank: Optional[int] = None) -> None:
        super().__init__(message)
        #: The first rank that failed, where a launched job failed.
        self.rank = rank


__all__ = [
    "AllreduceError",
    "ArgumentError",
    "CapacityError",
    "MismatchError",
    "PeerError",
    "UnsupportedError",
    "LauncherError",
]
