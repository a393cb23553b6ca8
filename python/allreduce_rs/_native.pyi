"""Type stubs of the extension module behind ``allreduce_rs`` (import from ``allreduce_rs``, not from here)."""

import os
from typing import Any, List, Literal, Optional, Sequence, Tuple, TypeVar, Union

#: Anything ``dtype=`` takes: ``"bf16"``/``"bfloat16"``, ``"fp16"``/``"float16"``/``"half"``, ``"fp32"``/``"float32"``,
#: ``torch.bfloat16`` and friends, ``numpy.float16`` / ``numpy.dtype("float32")``, ``ml_dtypes.bfloat16``.
DTypeLike = Any
#: A torch.Tensor (CUDA/ROCm on a GPU driver, CPU on the host driver) or an array with ``__array_interface__``
#: (numpy, ml_dtypes' bfloat16; host driver) of bfloat16, float16 or float32, contiguous.
TensorLike = Any
#: A raw stream handle (``torch.cuda.current_stream().cuda_stream``) or an object with ``cuda_stream``.
StreamLike = Union[int, Any]
Mode = Literal["eager", "graph"]
Residency = Literal["caller", "registered", "caller_registered"]
T = TypeVar("T")

DEFAULT_CAPACITY_BYTES: int
__version__: str

class Communicator:
    """One rank's endpoint of an intra-node allreduce job.

    Built from the launcher's environment (:meth:`from_env`) or explicit coordinates (the constructor), it opens
    its local rank's device (``backend="auto"``: HIP, then CUDA, where the library loads and sees a device, else the
    host driver), agrees on the placement with its peers, and runs allreduce, reduce-scatter and all-gather on your
    tensors: on a GPU driver, enqueued on torch's current stream without host synchronisation (so
    ``torch.cuda.graph`` captures the call and every replay runs it again); on the host driver, to completion before
    the call returns. The
    algorithm is chosen per size from a table tuned on this machine (:meth:`table_source`, :meth:`tune`); every
    algorithm gives the same bits.

    Every call is collective: all ranks make the same calls, with the same sizes and dtypes, in the same order
    (each either capturing a graph or not), as with torch.distributed. It works beside torch.distributed (it uses
    its own rendezvous in shared memory and none of torch's) and without it.

    Errors are :class:`allreduce_rs.AllreduceError` subclasses: ``ArgumentError`` (``CapacityError``),
    ``MismatchError``, ``PeerError`` (``.ranks``), ``UnsupportedError``, ``LauncherError``.

    A communicator's calls run one at a time: a call from a second thread while one runs raises AllreduceError.
    Use it as a context manager, or call :meth:`close`, to end it collectively.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        local_rank: int,
        job_id: str,
        *,
        capacity_bytes: int = ...,
        backend: Literal["auto", "host", "cuda", "hip"] = "auto",
        timeout_s: Optional[float] = None,
        setup_timeout_s: Optional[float] = None,
        tune_dir: Optional[Union[str, os.PathLike[str]]] = None,
        tune_table: Optional[Union[str, os.PathLike[str]]] = None,
        device_shared_by: Optional[int] = None,
    ) -> None:
        """A communicator at an explicit place, without a launcher. Collective: every rank of the job calls it.

        Args:
            rank: this rank, in ``[0, world_size)``.
            world_size: ranks in the job (1 to 8, one host).
            local_rank: this rank's index on its host; picks its device.
            job_id: 16 to 64 lowercase hex digits, the same on every rank (:func:`new_job_id` makes one); it names
                the job's shared memory.
            capacity_bytes: the largest message (every rank the same); the registered buffers are this large.
            backend: which driver.
            timeout_s: how long a rank waits for a peer inside a call [``ALLREDUCE_TIMEOUT_S``, else 10 s].
            setup_timeout_s: how long set-up waits [``ALLREDUCE_SETUP_TIMEOUT_S``, else 6x timeout_s, >= 60 s].
            tune_dir: where tune tables are cached [``ALLREDUCE_TUNE_DIR``, ``$XDG_CACHE_HOME/allreduce-rs/tune``,
                ``~/.cache/allreduce-rs/tune``].
            tune_table: one table file for both modes instead of the cached or built-in ones.
            device_shared_by: how many ranks in all run kernels on this rank's device at once, where other jobs or
                communicators share it; the launch caps then leave room for them all [this job's ranks per device].

        Raises:
            ArgumentError: a bad job id, place, backend name, capacity or timeout.
            UnsupportedError: the driver asked for is not here, or more than 8 ranks.
            MismatchError: ranks gave different options (the rank that differs from rank 0).
            PeerError: a peer never arrived or gave up during set-up (``ranks`` names it).
        """

    @staticmethod
    def from_env(
        capacity_bytes: int = ...,
        backend: Literal["auto", "host", "cuda", "hip"] = "auto",
        timeout_s: Optional[float] = None,
        setup_timeout_s: Optional[float] = None,
        tune_dir: Optional[Union[str, os.PathLike[str]]] = None,
        tune_table: Optional[Union[str, os.PathLike[str]]] = None,
        device_shared_by: Optional[int] = None,
    ) -> "Communicator":
        """This rank's communicator, its place read from the launcher's environment: ``python -m
        allreduce_rs.launch``, ``comm-bench launch``, torchrun, OpenMPI's mpirun, srun, MPICH / Intel MPI (with
        ``ALLREDUCE_JOB_ID`` set to the same hex id on every rank). Collective. Options as the constructor's.

        Raises:
            LauncherError: no launcher environment found.
            and as the constructor.
        """

    def all_reduce(
        self,
        tensor: T,
        out: Optional[T] = None,
        *,
        bias: Optional[T] = None,
        stream: Optional[StreamLike] = None,
        algorithm: Optional[str] = None,
    ) -> T:
        """Sums ``tensor`` over every rank, in place, or into ``out`` (same dtype and element count; the same
        tensor, or disjoint memory). Returns the tensor that holds the sum. ``bias`` (same dtype and element count,
        the same values on every rank, apart from ``out``) is added to every sum after the ranks' inputs, inside
        the kernel, in one fixed order, as FBGEMM car's ``z`` (on the host driver it needs 16-byte alignment).

        On a GPU driver ``tensor`` is a contiguous CUDA (ROCm) tensor of this communicator's device, 16-byte aligned,
        and the call is enqueued on ``stream`` (default: torch's current stream of the device) and returns at once:
        read the result in stream order, as after any kernel. Passing another stream than the one the tensors were
        made on asks, as for any side-stream work, for ``tensor.record_stream(stream)``. On the host driver the
        tensor is a numpy array (float16, float32, ml_dtypes.bfloat16) or a CPU tensor, any alignment, and the sum
        is there when the call returns.

        ``algorithm`` forces one algorithm (``car_1shot``, ``car_2shot``, ``symm_ll``, ``symm_epoch_1shot``,
        ``symm_zc_1shot``, ``symm_zc_2shot_ll``, ``symm_zc_2shot``, ``symm_zc_2shot_push``,
        ``symm_zc_2shot_pull``), every rank alike, as NCCL_ALGO does.

        Raises:
            ArgumentError: a dtype other than bfloat16/float16/float32, a non-contiguous or empty tensor, a tensor
                on another device or driver, a misaligned address, an ``out`` of another dtype or size or partly
                overlapping, a read-only array written, a stream on the host driver, an unknown algorithm.
            CapacityError: more bytes than ``capacity_bytes``.
            PeerError: a peer did not arrive (it died, or the deadline passed) or the communicator was aborted:
                ``ranks`` names them; the communicator has failed, and every later call raises the same.
        """

    def all_reduce_add_rms_norm(
        self,
        tensor: T,
        residual: T,
        weight: T,
        eps: float = 1e-6,
        *,
        out: Optional[T] = None,
        stream: Optional[StreamLike] = None,
        algorithm: Optional[str] = None,
    ) -> Tuple[T, T]:
        """The allreduce serving stacks follow with a residual add and RMSNorm, in one call: ``residual += sum of
        tensor over every rank`` (in place), then each row of ``weight.numel()`` elements of the residual normalised,
        ``residual / sqrt(mean(residual**2) + eps) * weight``, into ``out`` (default: ``tensor``). Returns ``(y,
        residual)``. The designs that carry the norm do it in their kernel, the others run their allreduce, then a
        norm kernel; ``algorithm="unfused:<name>"`` forces that sequence after any design (``auto`` chooses between
        the two by the norm calls' tune table): every rank and every algorithm gives the same bits. Tensors as
        :meth:`all_reduce`'s, all of one dtype, 16-byte aligned; the element count a whole number of rows.

        Raises:
            ArgumentError: as :meth:`all_reduce`, and a residual of another dtype or size or read-only, a weight of
                another dtype, rows that do not divide the count or exceed 65,536 elements, ``eps`` not positive and
                finite, a residual overlapping the tensor, out or weight.
            CapacityError, PeerError: as :meth:`all_reduce`.
        """

    def reduce_scatter(
        self, input: TensorLike, out: T, *, split_last_dim: bool = False, stream: Optional[StreamLike] = None
    ) -> T:
        """Rank r receives elements ``[r * n / W, (r + 1) * n / W)`` of the sum of every rank's ``input`` (``n``
        elements, divisible by the world size ``W``) in ``out`` (``n / W`` elements, disjoint from ``input``).
        With ``split_last_dim``, ``input`` of shape ``[..., N]`` (``N`` divisible by ``W``) gives rank r the columns
        ``[r * N / W, (r + 1) * N / W)`` of every row, densely in ``out`` (car's ``split_last_dim``, in the kernel).
        Returns ``out``. Devices, streams and errors as :meth:`all_reduce`."""

    def all_gather(self, input: TensorLike, out: T, *, stream: Optional[StreamLike] = None) -> T:
        """Every rank receives every rank's ``input`` (``n`` elements) in rank order in ``out`` (``W * n`` elements
        of the same dtype, disjoint from ``input``): rank r's at ``out[r * n:(r + 1) * n]``. Returns ``out``.
        Devices, streams and errors as :meth:`all_reduce`."""

    def prepare_all_reduce(
        self, tensor: T, out: Optional[T] = None, *, bias: Optional[T] = None, algorithm: Optional[str] = None
    ) -> "PreparedCall":
        """``all_reduce(tensor, out, algorithm=...)`` checked once and bound, for a loop that reduces the same
        buffers every step: ``call = comm.prepare_all_reduce(x, out=y)``, then ``call()`` issues it on torch's
        current stream (or ``call(stream=...)``) and returns ``y``, reading no tensor attribute again (the cost of
        reading them is most of a plain call's Python overhead). The call holds the tensors' storage and always
        reduces the memory they had when prepared, even if a tensor is later re-pointed (``set_``, ``resize_``).
        Collective when called, as the plain call. Raises as :meth:`all_reduce`, at prepare time."""

    def prepare_reduce_scatter(self, input: TensorLike, out: T) -> "PreparedCall":
        """``reduce_scatter(input, out)`` checked once and bound, as :meth:`prepare_all_reduce`."""

    def register(self, tensor: TensorLike) -> int:
        """Shares the memory of ``tensor`` (a CUDA / ROCm tensor of this device) with every peer, so calls whose
        input or output lies inside it read and write it in place on every rank (as vLLM registers its
        graph-captured buffers). The allocation holding it is exported (its IPC handle, or a VMM allocation's POSIX
        fd) with the offset. Collective: every rank registers a tensor of the same size, in the same order, and
        later calls name the same offsets on every rank. The tensor is kept alive as long as the communicator.
        Returns the registration's index.

        Raises:
            UnsupportedError: memory the driver cannot share (host memory of this process; pool allocations).
            MismatchError: ranks registered different sizes.
        """

    def registered_input(self, dtype: Optional[DTypeLike] = None, count: Optional[int] = None) -> "RegisteredBuffer":
        """The communicator's registered input buffer, ``count`` elements of ``dtype`` [bf16; the whole buffer], as a
        DLPack exporter: ``x = torch.from_dlpack(comm.registered_input(torch.bfloat16, n))``. Writing the input
        there and passing ``x`` (from its start) saves the zero-copy algorithms their copy-in. Collective use: where
        one rank passes its registered input, every rank must pass its own (the algorithm is chosen by where the
        input lies; ranks that chose differently fail the call with a ``PeerError`` naming each other and both
        kernels, or at the deadline, and the communicator with it). On the host driver
        ``numpy.from_dlpack`` takes fp16 and fp32 views (view a bf16 buffer as fp16, then
        ``.view(ml_dtypes.bfloat16)``).

        Raises:
            CapacityError: ``count`` beyond the buffer.
        """

    def registered_output(self, dtype: Optional[DTypeLike] = None, count: Optional[int] = None) -> "RegisteredBuffer":
        """The registered output buffer, which the zero-copy two-shot's peers write into directly; as
        :meth:`registered_input`."""

    def tune(
        self,
        dtype: Optional[DTypeLike] = None,
        counts: Optional[List[int]] = None,
        norm_hidden: int = 4096,
        norm_only: bool = False,
        residencies: Optional[List[str]] = None,
        max_seconds: Optional[float] = None,
    ) -> List[str]:
        """Measures every algorithm at ``counts`` [comm_bench.py's sizes and the powers of two from 1024 to
        16,777,216, up to the capacity], eagerly and in graph replays, on each residency (your tensors, the
        registered buffers, registered tensors), each checked against a float64 reference first, and stores the
        fastest per size as this machine's tables in the tune cache, where later communicators find them; this one
        follows them at once (unless ``tune_table`` named a file). Calls with the residual add and RMSNorm get
        tables of their own, measured at rows of ``norm_hidden`` elements (your model's hidden size; 0: not
        measured); with ``norm_only`` those alone (no plain table is measured or written). ``residencies``: which
        of "caller", "registered" and "caller_registered" are measured [all]; the others' tables stay as they are.
        Each table is stored as soon as it is measured, so a tune stopped part-way keeps the tables it finished;
        ``max_seconds``: no table is started once this many seconds have passed (by rank 0's clock), and the files
        returned are those of the tables finished. Collective. Returns the files written (rank 0 writes them)."""

    def begin_graph_capture(self) -> None:
        """Begins recording a graph capture on your own tensors (prefer :meth:`graph_capture`): calls captured until
        :meth:`end_graph_capture` read every rank's tensors in place at each replay, once the end has shared them.
        Memory that cannot be shared (a stream-ordered pool allocation) keeps its copy, and :attr:`notes` says so.
        Collective; call it before the capture begins."""

    def end_graph_capture(self) -> int:
        """Ends the recording after the capture has ended: every rank shares and maps the captured calls' tensors
        (kept alive with the communicator from then on) and fills each call's peer table. Ranks that captured
        different calls raise :class:`MismatchError` on every rank. Replay the graph only after it returns.
        Collective; returns how many calls were registered."""

    def graph_capture(self) -> "GraphCapture":
        """``with comm.graph_capture(): with torch.cuda.graph(g): ...``: :meth:`begin_graph_capture` on entry,
        :meth:`end_graph_capture` on exit (also when the body raised, since the peers wait in theirs), so every
        replay of ``g`` runs zero-copy on the captured tensors (vLLM's graph-buffer registration)."""

    def barrier(self) -> None:
        """Waits until every rank has called it (host side, through the rendezvous; not ordered with any stream)."""

    def all_gather_bytes(self, data: bytes) -> List[bytes]:
        """Every rank's ``data`` (at most 64 KiB), in rank order: small host messages for tests and timing."""

    def table_source(self, mode: Mode = "eager", residency: Residency = "caller") -> str:
        """Where the tune table came from that calls issued in ``mode`` on buffers in ``residency`` follow (``caller``:
        your tensors; ``registered``: the registered buffers; ``caller_registered``: tensors shared by
        :meth:`register` or a graph capture): ``tuned on this machine (PATH)``, a file, or ``built-in default: ...``
        saying what was measured where it differs from this job (then :attr:`notes` says so too)."""

    def abort(self) -> None:
        """Ends the communicator from any thread, at once, as ncclCommAbort: every wait of its kernels ends (their
        results undefined) and every later call raises :class:`PeerError`. Then :meth:`close` it (no barrier is
        waited for) and build a new communicator, with a new job id, to go on."""

    def check(self) -> None:
        """Raises :class:`PeerError` (its ``ranks`` the peers that did not arrive) if any call so far failed, for a
        program that looks after a graph replay; synchronise the stream first. The next call raises it anyway."""

    def close(self) -> None:
        """Ends the communicator: a barrier with every peer (which may still read this rank's buffers; none after a
        failure), then its buffers are unmapped. Collective. Refused (AllreduceError) while tensors made from the registered buffers
        are alive. Later calls raise AllreduceError; closing twice does nothing."""

    def __enter__(self) -> "Communicator": ...
    def __exit__(self, *exc: object) -> None: ...
    @property
    def rank(self) -> int:
        """This rank."""

    @property
    def world_size(self) -> int:
        """The number of ranks."""

    @property
    def local_rank(self) -> int:
        """This rank's index on its host."""

    @property
    def capacity_bytes(self) -> int:
        """The largest message, in bytes."""

    @property
    def backend(self) -> Literal["host", "cuda", "hip"]:
        """The driver in use."""

    @property
    def device(self) -> int:
        """The device ordinal (torch's ``cuda:N``) on a GPU driver; 0 on the host driver."""

    @property
    def device_name(self) -> str:
        """The device's name."""

    @property
    def last_algorithm(self) -> Optional[str]:
        """The algorithm the last call ran (``car_rs`` for reduce-scatter, ``car_ag`` for all-gather; after
        :meth:`all_reduce_add_rms_norm`, ``unfused:<name>`` where the norm ran after the allreduce), None before the
        first."""

    @property
    def notes(self) -> List[str]:
        """What set-up decided on the caller's behalf (drivers passed over, built-in tables in use, kernels the device
        fits no block of, dropped, and what runs instead)."""

    @property
    def placement(self) -> "Placement":
        """Where every rank runs."""

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""

class Across:
    """One rank's endpoint of an allreduce job over several nodes.

    Within each node the intra-node :class:`Communicator`'s designs run; across nodes NCCL (RCCL on AMD), loaded at
    run time, whose ids travel over TCP to ``MASTER_ADDR:MASTER_PORT`` (set by torchrun and srun setups). The job's
    nodes come from the launcher (torchrun's ``GROUP_RANK`` / ``LOCAL_WORLD_SIZE``, srun, OpenMPI, MPICH); ranks
    are node-major. A GPU driver is needed: on the host driver every rank raises ``UnsupportedError`` at set-up.
    Every call is collective and enqueued on torch's current stream.
    """

    @staticmethod
    def from_env(
        capacity_bytes: int = ...,
        backend: Literal["auto", "host", "cuda", "hip"] = "auto",
        timeout_s: Optional[float] = None,
        setup_timeout_s: Optional[float] = None,
        store: Optional[Any] = None,
    ) -> "Across":
        """This rank's endpoint, its place and the job's nodes read from the launcher's environment. Collective.

        The set-up blobs (NCCL's ids) go through ``store`` (``set``/``check``/``get`` as torch.distributed.Store),
        else torch.distributed's default store when a process group is initialised, else over TCP at
        ``MASTER_ADDR:MASTER_PORT``. A rank that never comes is named (``PeerError.ranks``) at the set-up deadline."""

    def all_reduce(
        self,
        tensor: TensorLike,
        out: Optional[TensorLike] = None,
        *,
        path: Optional[Literal["nccl", "hierarchical"]] = None,
        stream: Optional[StreamLike] = None,
    ) -> TensorLike:
        """Allreduces ``tensor`` over the whole job, in place or into ``out``; returns the tensor with the sum.
        ``path``: the path table's for the size (:meth:`tune`; NCCL without one), ``"nccl"`` or ``"hierarchical"`` (reduce-scatter in the node, the shard across nodes
        over NCCL, all-gather in the node; the count must divide by the node's ranks)."""

    def reduce_scatter(self, input: TensorLike, out: TensorLike, *, stream: Optional[StreamLike] = None) -> TensorLike:
        """Rank r receives elements ``[r * n / W, (r + 1) * n / W)`` of the sum in ``out``; returns ``out``."""

    def all_gather(self, input: TensorLike, out: TensorLike, *, stream: Optional[StreamLike] = None) -> TensorLike:
        """``out`` receives every rank's ``input`` in rank order; returns ``out``."""

    def check(self) -> None:
        """Raises the error that ended this endpoint (``PeerError``), if any: a wait in this node's kernels (naming the
        peer), or an NCCL step not done by the set-up deadline after its enqueue, or a communicator's asynchronous
        error (the watchdog then aborted every NCCL communicator, so the streams drain). Every later call raises it
        too."""

    def tune(
        self, dtype: Optional[DTypeLike] = None, counts: Optional[Sequence[int]] = None, iters: int = 20, repeats: int = 3
    ) -> List[Tuple[Optional[int], Literal["nccl", "hierarchical"]]]:
        """Times both paths per size (the slowest rank's median) and makes the fastest per size the path of every
        later :meth:`all_reduce` without ``path=``; rank 0 stores the table in the tune cache for later endpoints of
        this job's shape. Collective."""

    @property
    def path_table(self) -> Optional[List[Tuple[Optional[int], Literal["nccl", "hierarchical"]]]]:
        """The path table every rank follows, or None (then NCCL over the whole job)."""

    @property
    def last_path(self) -> Optional[Literal["nccl", "hierarchical"]]:
        """The path the last :meth:`all_reduce` took."""

    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def node(self) -> int:
        """This rank's node, of :attr:`nodes`."""

    @property
    def nodes(self) -> int: ...
    @property
    def local_rank(self) -> int:
        """This rank's place in its node, of :attr:`local_world_size`."""

    @property
    def local_world_size(self) -> int: ...
    def placement(self) -> str:
        """The placement report: the nodes, this rank's node group and rail, its node's devices."""

    def close(self) -> None:
        """Releases the endpoint; later calls raise. Idempotent."""

    def __enter__(self) -> "Across": ...
    def __exit__(self, *exc: object) -> None: ...

class GraphCapture:
    """The context manager :meth:`Communicator.graph_capture` returns."""

    def __enter__(self) -> None: ...
    def __exit__(self, *exc: object) -> bool: ...

class PreparedCall:
    """One all_reduce or reduce_scatter checked once (:meth:`Communicator.prepare_all_reduce`,
    :meth:`Communicator.prepare_reduce_scatter`) and issued by calling it."""

    def __call__(self, *, stream: Optional[StreamLike] = None) -> Any:
        """Issues the call (collective) on ``stream`` (default: torch's current stream of the device) and returns
        the tensor that holds the result. Raises AllreduceError once the communicator is closed."""

class RegisteredBuffer:
    """A view of one of a communicator's registered buffers, exported through DLPack (``torch.from_dlpack``,
    ``numpy.from_dlpack``) by reference. A tensor made from it keeps the communicator alive."""

    def __dlpack__(
        self,
        *,
        stream: Optional[int] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """A DLPack capsule (``dltensor``, or ``dltensor_versioned`` when ``max_version`` is 1.x or later).
        ``copy=True`` and another ``dl_device`` raise BufferError."""

    def __dlpack_device__(self) -> Tuple[int, int]:
        """(1, 0) for host memory, (2, N) for CUDA device N, (10, N) for ROCm device N."""

    @property
    def data_ptr(self) -> int:
        """The buffer's address."""

    @property
    def count(self) -> int:
        """Its elements."""

    @property
    def nbytes(self) -> int:
        """Its bytes."""

    @property
    def dtype(self) -> Literal["bf16", "fp16", "fp32"]:
        """Its element type."""

class Placement:
    """Where every rank runs, as the ranks agreed at construction; ``str()`` gives a readable table."""

    @property
    def ranks_per_device(self) -> int:
        """The most ranks any one device carries (8 for 8 ranks on one GPU under MPS)."""

    @property
    def ranks(self) -> List["RankDevice"]:
        """Every rank's device, in rank order."""

class RankDevice:
    """One rank's device."""

    rank: int
    local_rank: int
    host: str
    ordinal: int
    #: The PCI bus id (``host`` on the host driver).
    bus_id: str
    #: Devices this rank's process sees.
    visible: int

def launch(
    world: int, argv: Sequence[str], env: Optional[Sequence[Tuple[str, str]]] = None, prefix_output: bool = True
) -> None:
    """Runs ``argv`` as the ``world`` ranks of a fresh job and waits for them (see ``allreduce_rs.launch.run``)."""

def new_job_id() -> str:
    """A fresh job id (32 random hex digits) for the constructor: give every rank the same one."""
