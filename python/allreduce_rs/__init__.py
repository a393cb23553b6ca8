"""allreduce_rs: intra-node allreduce for PyTorch and numpy.

A :class:`Communicator` per rank runs allreduce, reduce-scatter and all-gather on your tensors and, on a GPU, on
torch's current stream, with no host synchronisation (so ``torch.cuda.graph`` captures it), choosing the algorithm
per size from a table tuned on this machine. Every algorithm sums in float32 in rank order and rounds once, so
results are the same bits whatever the size picks.

Importing this package loads no GPU library and imports neither torch nor numpy: a driver's library is loaded when
a communicator opens it, and a tensor is read through its own methods.

    comm = allreduce_rs.Communicator.from_env(capacity_bytes=64 << 20)   # under torchrun or any launcher
    comm.all_reduce(x)                                                   # in place, on the current stream

A job over several nodes takes :class:`Across` instead: the same designs within each node, NCCL/RCCL across them.
"""

from . import errors
from ._native import (
    DEFAULT_CAPACITY_BYTES,
    Across,
    Communicator,
    GraphCapture,
    Placement,
    PreparedCall,
    RankDevice,
    RegisteredBuffer,
    __version__,
    new_job_id,
)
from .errors import (
    AllreduceError,
    ArgumentError,
    CapacityError,
    LauncherError,
    MismatchError,
    PeerError,
    UnsupportedError,
)

__all__ = [
    "Communicator",
    "Across",
    "RegisteredBuffer",
    "PreparedCall",
    "GraphCapture",
    "Placement",
    "RankDevice",
    "new_job_id",
    "DEFAULT_CAPACITY_BYTES",
    "AllreduceError",
    "ArgumentError",
    "CapacityError",
    "MismatchError",
    "PeerError",
    "UnsupportedError",
    "LauncherError",
    "errors",
    "__version__",
]
