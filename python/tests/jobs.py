"""The bodies of the multi-rank tests: ``python jobs.py SCENARIO`` runs one as a rank of a job that
test_allreduce.py starts through ``python -m allreduce_rs.launch``. A rank fails (and so the job) on any wrong result
or unexpected exception; rank 0 prints ``SCENARIO ok`` when its checks all passed."""

import hashlib
import os
import sys
import threading
import time

import ml_dtypes
import numpy as np

import allreduce_rs as ar

CAPACITY = 1 << 20
DTYPES = [np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
# Half an output ulp: the sum is accumulated in float32 and rounded once (the library's check::tolerance).
HALF_ULP = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
# Element counts of every dtype: both sides of the built-in host table's hand-overs (2048, 6144 and 26624 bytes)
# and of the packet area's end (96 KiB), odd counts that no vector divides, and the capacity's end.
COUNTS = [1, 7, 13, 1023, 1024, 1025, 3071, 3073, 13311, 13313, 4099, 49151, 49153, 131071]
ALGORITHMS = [
    "car_1shot",
    "car_2shot",
    "symm_ll",
    "symm_epoch_1shot",
    "symm_zc_1shot",
    "symm_zc_2shot_ll",
    "symm_zc_2shot",
    "symm_zc_2shot_push",
    "symm_zc_2shot_pull",
]
# What a packet design asked for beyond its area runs instead (and last_algorithm reports).
STAND_IN = {"symm_ll": "symm_zc_1shot", "symm_zc_2shot_ll": "symm_zc_2shot"}


class Calls:
    """Fresh random inputs per call: the seed of call k derives from the test run's seed, the same on every rank."""

    def __init__(self):
        self.base = int(os.environ["ARX_PY_SEED"])
        self.k = 0

    def seed(self):
        self.k += 1
        return [self.base, self.k]


def inputs(seed, rank, count, dtype):
    """Rank ``rank``'s input: uniform in [0, 1) like torch.rand, rounded to ``dtype``."""
    return np.random.default_rng(seed + [rank]).random(count).astype(dtype)


def reference(seed, world, count, dtype):
    """The float64 sum of every rank's input."""
    return sum(inputs(seed, r, count, dtype).astype(np.float64) for r in range(world))


def check_sum(got, want, dtype, world, what):
    tol = HALF_ULP[dtype.name] + world * 2.0**-23
    got = got.astype(np.float64)
    bad = ~(np.abs(got - want) <= tol * np.abs(want) + 1e-30)
    assert (
        not bad.any()
    ), f"{what}: {bad.sum()} wrong elements, first at {np.argmax(bad)}: {got[bad][:4]} vs {want[bad][:4]}"


def same_on_every_rank(comm, array, what):
    digests = comm.all_gather_bytes(hashlib.sha256(array.tobytes()).digest())
    differ = [r for r, d in enumerate(digests) if d != digests[0]]
    assert not differ, f"{what}: rank(s) {differ} differ bitwise from rank 0"


def host_comm(**kw):
    return ar.Communicator.from_env(capacity_bytes=CAPACITY, backend="host", **kw)


def sums():
    """Every dtype and count, in place and out of place and with every algorithm forced: the float64 reference, the
    same bits on every rank and from every path; reduce-scatter likewise."""
    comm = host_comm()
    rank, world = comm.rank, comm.world_size
    calls = Calls()
    for dtype in DTYPES:
        for count in COUNTS:
            if count * dtype.itemsize > CAPACITY:
                continue
            seed = calls.seed()
            x = inputs(seed, rank, count, dtype)
            want = reference(seed, world, count, dtype)
            what = f"{dtype.name} x {count}"
            out = np.full(count, np.nan, dtype)
            assert comm.all_reduce(x, out=out) is out
            check_sum(out, want, dtype, world, what)
            same_on_every_rank(comm, out, what)
            assert comm.last_algorithm in ALGORITHMS, comm.last_algorithm
            inplace = x.copy()
            assert comm.all_reduce(inplace) is inplace
            assert inplace.tobytes() == out.tobytes(), f"{what}: in place differs from out of place"
            # An input at an odd element offset: not 16-byte aligned, staged by the library.
            shifted = np.empty(count + 1, dtype)[1:]
            shifted[:] = x
            comm.all_reduce(shifted)
            assert shifted.tobytes() == out.tobytes(), f"{what}: an unaligned view differs"
        for count in [8, 4096, 40000]:
            seed = calls.seed()
            x = inputs(seed, rank, count, dtype)
            bits = None
            for algo in ALGORITHMS:
                out = np.full(count, np.nan, dtype)
                comm.all_reduce(x, out=out, algorithm=algo)
                assert comm.last_algorithm in (algo, STAND_IN.get(algo)), (algo, comm.last_algorithm)
                bits = bits or out.tobytes()
                assert out.tobytes() == bits, f"{dtype.name} x {count}: {algo} differs from {ALGORITHMS[0]}"
            check_sum(out, reference(seed, world, count, dtype), dtype, world, f"{dtype.name} x {count}")
        for count in [world, world * 9, world * 4096]:
            seed = calls.seed()
            x = inputs(seed, rank, count, dtype)
            shard = np.full(count // world, np.nan, dtype)
            assert comm.reduce_scatter(x, shard) is shard
            assert comm.last_algorithm == "car_rs"
            lo = rank * (count // world)
            want = reference(seed, world, count, dtype)[lo : lo + count // world]
            check_sum(shard, want, dtype, world, f"reduce_scatter {dtype.name} x {count}")
    comm.close()
    return rank


def norms():
    """all_reduce_add_rms_norm: rows that do not divide among the ranks, odd row lengths, every dtype, in place and
    out of place, every algorithm forced (fused where its design carries the norm, and the unfused sequence after it)
    and auto; r and y against float64, the same bits on every rank and from every algorithm; then the refusals."""
    comm = host_comm()
    rank, world = comm.rank, comm.world_size
    calls = Calls()
    for dtype in DTYPES:
        tol = 6 * (HALF_ULP[dtype.name] + (world + 1) * 2.0**-23)
        for rows, hidden in [(1, 8), (5, 300), (7, 257), (13, 64)]:
            seed = calls.seed()
            x = inputs(seed, rank, rows * hidden, dtype).reshape(rows, hidden)
            res0 = inputs(seed, world, rows * hidden, dtype).reshape(rows, hidden)
            w = (inputs(seed, world + 1, hidden, dtype).astype(np.float64) + 0.5).astype(dtype)  # near 1, as a model's
            r64 = reference(seed, world, rows * hidden, dtype).reshape(rows, hidden) + res0.astype(np.float64)
            inv = 1.0 / np.sqrt((r64**2).mean(axis=1, keepdims=True) + 1e-5)
            y64 = r64 * inv * w.astype(np.float64)
            bits = None
            for algo in ALGORITHMS + [f"unfused:{a}" for a in ALGORITHMS] + [None]:
                res = res0.copy()
                out = np.full_like(x, np.nan)
                y, r = comm.all_reduce_add_rms_norm(x, res, w, 1e-5, out=out, algorithm=algo)
                assert y is out and r is res
                if algo and algo.startswith("unfused:"):
                    assert comm.last_algorithm.startswith("unfused:"), (algo, comm.last_algorithm)
                what = f"{dtype.name} {rows}x{hidden} {algo or 'auto'}"
                for part, got, want in [("r", r, r64), ("y", y, y64)]:
                    got = got.astype(np.float64)
                    bad = ~(np.abs(got - want) <= tol * np.abs(want) + 1e-30)
                    assert not bad.any(), f"{what}: {part}: {bad.sum()} wrong, first at {np.argmax(bad)}"
                    same_on_every_rank(comm, got, f"{what}: {part}")
                bits = bits or (r.tobytes(), y.tobytes())
                assert (r.tobytes(), y.tobytes()) == bits, f"{what} differs bitwise from {ALGORITHMS[0]}"
            inplace, res = x.copy(), res0.copy()
            y, _ = comm.all_reduce_add_rms_norm(inplace, res, w, 1e-5)
            assert y is inplace and (res.tobytes(), y.tobytes()) == bits, "in place differs"
    x, res, w = (np.ones(64, np.float32) for _ in range(3))
    A = ar.ArgumentError
    expect(A, lambda: comm.all_reduce_add_rms_norm(x, res, w[:7], 1e-5), "rows of 7 elements")
    expect(A, lambda: comm.all_reduce_add_rms_norm(x, res, w[:8], 0.0), "eps")
    expect(A, lambda: comm.all_reduce_add_rms_norm(x, res[:32], w[:8], 1e-5), "residual")
    expect(A, lambda: comm.all_reduce_add_rms_norm(x, res.astype(np.float16), w[:8], 1e-5), "residual: fp16")
    expect(A, lambda: comm.all_reduce_add_rms_norm(x, x, w[:8], 1e-5), "residual", "overlaps")
    expect(A, lambda: comm.all_reduce_add_rms_norm(x, res, w[:8], 1e-5, algorithm="unfused:car_rs"), "unfused:")
    expect(A, lambda: comm.all_reduce(x, algorithm="unfused:car_1shot"), "for all_reduce_add_rms_norm")
    comm.close()
    return rank


def gathers():
    """All-gather of fresh random inputs, every dtype and count (odd ones, unaligned views, the whole capacity):
    every rank's input in rank order, exact, the same bits on every rank; the refusals of its arguments."""
    comm = host_comm()
    rank, world = comm.rank, comm.world_size
    calls = Calls()
    for dtype in DTYPES:
        for count in [1, 7, 1025, 4099, CAPACITY // dtype.itemsize]:
            seed = calls.seed()
            what = f"all_gather {dtype.name} x {count}"
            out = np.full(world * count, np.nan, dtype)
            assert comm.all_gather(inputs(seed, rank, count, dtype), out) is out
            assert comm.last_algorithm == "car_ag", comm.last_algorithm
            want = np.concatenate([inputs(seed, r, count, dtype) for r in range(world)])
            assert out.tobytes() == want.tobytes(), f"{what}: not every rank's input in rank order"
            same_on_every_rank(comm, out, what)
            # Views at an odd element offset: not 16-byte aligned, staged by the library.
            x = np.empty(count + 1, dtype)[1:]
            x[:] = inputs(seed, rank, count, dtype)
            shifted = np.full(world * count + 1, np.nan, dtype)[1:]
            comm.all_gather(x, shifted)
            assert shifted.tobytes() == want.tobytes(), f"{what}: unaligned views differ"
    A = ar.ArgumentError
    x = np.zeros(8, np.float32)
    expect(A, lambda: comm.all_gather(x, np.zeros(8 * world + 1, np.float32)), f"{8 * world + 1} elements")
    expect(A, lambda: comm.all_gather(x, np.zeros(8 * world, np.float16)), "dtype fp16 differs")
    both = np.zeros(8 * world + 8, np.float32)
    expect(A, lambda: comm.all_gather(both[8:16], both[:8 * world]), "overlaps")
    big = CAPACITY // 4 + 1
    huge = (np.zeros(big, np.float32), np.zeros(world * big, np.float32))
    expect(ar.CapacityError, lambda: comm.all_gather(*huge), "capacity")
    comm.close()
    return rank


def prepared():
    """Prepared calls: checked once, issued many times on fresh inputs written into the same arrays, the same bits as
    the plain call; refusals at prepare time; a call after close refused."""
    comm = host_comm()
    rank, world = comm.rank, comm.world_size
    calls = Calls()
    for dtype in DTYPES:
        count = 3000
        x, out = np.empty(count, dtype), np.empty(count, dtype)
        inplace = np.empty(count, dtype)
        shard = np.empty(count // world, dtype) if count % world == 0 else None
        ar_out = comm.prepare_all_reduce(x, out=out)
        ar_in = comm.prepare_all_reduce(inplace)
        forced = comm.prepare_all_reduce(x, out=out, algorithm=ALGORITHMS[-1])
        assert "all_reduce" in repr(ar_out) and "in place" in repr(ar_in), (repr(ar_out), repr(ar_in))
        for _ in range(3):
            seed = calls.seed()
            x[:] = inputs(seed, rank, count, dtype)
            out[:] = np.nan
            assert ar_out() is out
            check_sum(out, reference(seed, world, count, dtype), dtype, world, f"prepared {dtype.name}")
            same_on_every_rank(comm, out, f"prepared {dtype.name}")
            inplace[:] = x
            assert ar_in() is inplace
            assert inplace.tobytes() == out.tobytes(), f"prepared {dtype.name}: in place differs"
            plain = comm.all_reduce(x, out=np.empty(count, dtype))
            assert plain.tobytes() == out.tobytes(), f"prepared {dtype.name}: differs from the plain call"
            out[:] = np.nan
            forced()
            assert comm.last_algorithm == ALGORITHMS[-1]
            assert out.tobytes() == plain.tobytes(), f"prepared {dtype.name}: forced algorithm differs"
        if shard is not None:
            rs = comm.prepare_reduce_scatter(x, shard)
            seed = calls.seed()
            x[:] = inputs(seed, rank, count, dtype)
            assert rs() is shard
            lo = rank * (count // world)
            want = reference(seed, world, count, dtype)[lo : lo + count // world]
            check_sum(shard, want, dtype, world, f"prepared reduce_scatter {dtype.name}")
    A = ar.ArgumentError
    expect(A, lambda: comm.prepare_all_reduce(np.zeros(8, np.float64)), "dtype float64")
    expect(A, lambda: comm.prepare_all_reduce(np.zeros(8, np.float32), out=np.zeros(9, np.float32)), "out: 9")
    expect(A, lambda: comm.prepare_all_reduce(np.zeros(8, np.float32), algorithm="nope"), "algorithm")
    expect(A, lambda: comm.prepare_reduce_scatter(np.zeros(world * 4 + 1, np.float32), np.zeros(4, np.float32)), "divide")
    expect(ar.CapacityError, lambda: comm.prepare_all_reduce(np.zeros(CAPACITY // 4 + 1, np.float32)), "capacity")
    late = comm.prepare_all_reduce(np.zeros(64, np.float32))
    comm.close()
    expect(ar.AllreduceError, late, "closed")
    return rank


def facts():
    """What a communicator says about itself."""
    comm = host_comm()
    assert (comm.backend, comm.capacity_bytes, comm.device) == ("host", CAPACITY, 0)
    assert comm.local_rank == int(os.environ["LOCAL_RANK"]) == comm.rank
    p = comm.placement
    assert p.ranks_per_device == comm.world_size and [d.rank for d in p.ranks] == list(range(comm.world_size))
    assert all(d.bus_id == "host" for d in p.ranks) and "bus id host" in str(p)
    for mode in ["eager", "graph"]:
        for residency in ["caller", "registered", "caller_registered"]:
            source = comm.table_source(mode, residency)
            assert source.startswith("built-in default: host") and f"{residency} buffers" in source, source
    assert comm.table_source() == comm.table_source("eager", "caller")
    assert any("no tune table" in n for n in comm.notes), comm.notes
    # Recording a capture in which nothing was captured (the host driver's calls from Python are not captured):
    # nothing to register, on every rank, and the recording can begin again.
    with comm.graph_capture():
        pass
    comm.begin_graph_capture()
    expect(ar.ArgumentError, comm.begin_graph_capture, "already being recorded")
    assert comm.end_graph_capture() == 0
    expect(ar.ArgumentError, comm.end_graph_capture, "without begin_graph_capture")
    assert comm.last_algorithm is None
    # A tune stores plain tables and, rows of norm_hidden fitting the sizes, the norm calls' own (none with 0).
    files = comm.tune(counts=[1024, 2048], norm_hidden=1024)
    assert len(files) == 12 and sum(str(f).endswith("-rms_norm.json") for f in files) == 6, files
    # ... which this communicator follows from now on.
    for mode in ["eager", "graph"]:
        for residency in ["caller", "registered", "caller_registered"]:
            source = comm.table_source(mode, residency)
            assert source.startswith("tuned on this machine") and source.endswith(f"{mode}-{residency}.json)"), source
    assert len(comm.tune(counts=[1024], norm_hidden=0)) == 6
    files = comm.tune(counts=[1024], norm_hidden=0, residencies=["caller"])
    assert len(files) == 2 and all(str(f).endswith("-caller.json") for f in files), files
    expect(ar.ArgumentError, lambda: comm.tune(counts=[1024], residencies=["shared"]), "expected one of caller")
    # A time budget past at once: the first table (eager, caller: residencies go in that order) is measured, no other.
    files = comm.tune(counts=[1024], norm_hidden=0, residencies=["registered", "caller"], max_seconds=1e-9)
    assert len(files) == 1 and str(files[0]).endswith("eager-caller.json"), files
    expect(ar.ArgumentError, lambda: comm.tune(counts=[1024], max_seconds=-1.0), "max_seconds")
    files = comm.tune(counts=[1024], norm_hidden=512, norm_only=True)
    assert len(files) == 6 and all(str(f).endswith("-rms_norm.json") for f in files), files
    expect(ar.ArgumentError, lambda: comm.tune(counts=[1024], norm_hidden=0, norm_only=True), "norm calls only")
    with comm:
        comm.all_reduce(np.ones(10, np.float32))
    assert comm.closed
    try:
        comm.all_reduce(np.ones(10, np.float32))
        raise AssertionError("a closed communicator ran a call")
    except ar.AllreduceError as e:
        assert "closed" in str(e)
    return comm.rank


def expect(error, call, *words):
    """Runs ``call``, which must raise ``error`` (exactly that class) with every one of ``words`` in its message."""
    try:
        call()
    except ar.AllreduceError as e:
        assert type(e) is error, f"{type(e).__name__} ({e}), not {error.__name__}"
        for w in words:
            assert w in str(e), f"{w!r} not in {str(e)!r}"
        return e
    raise AssertionError(f"no {error.__name__} from a call that should raise it ({words})")


def bad_arguments():
    """Every refusal of the Python layer, by its class and words; then a call still works."""
    comm = host_comm()
    world = comm.world_size
    A = ar.ArgumentError
    f32 = np.zeros(64, np.float32)
    expect(A, lambda: comm.all_reduce(np.zeros(8, np.float64)), "dtype float64")
    expect(A, lambda: comm.all_reduce(np.zeros(8, np.int32)), "dtype int32")
    expect(A, lambda: comm.all_reduce(np.zeros(8, ">f4")), "dtype")
    expect(A, lambda: comm.all_reduce(f32[::2]), "not C-contiguous")
    expect(A, lambda: comm.all_reduce(np.zeros((4, 4), np.float32, order="F")), "not C-contiguous")
    expect(A, lambda: comm.all_reduce(np.zeros(0, np.float32)), "empty")
    expect(A, lambda: comm.all_reduce([1.0, 2.0]), "a list is neither")
    expect(A, lambda: comm.all_reduce(np.frombuffer(bytearray(68), np.uint8)[1:65].view(np.float32)), "not aligned")
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    expect(A, lambda: comm.all_reduce(ro), "read-only")
    comm.all_reduce(ro, out=np.zeros(8, np.float32))
    expect(A, lambda: comm.all_reduce(f32, out=ro), "out: ")
    expect(A, lambda: comm.all_reduce(f32, out=np.zeros(64, np.float16)), "dtype fp16 differs")
    expect(A, lambda: comm.all_reduce(f32, out=np.zeros(63, np.float32)), "63 elements")
    expect(A, lambda: comm.all_reduce(f32[:32], out=f32[16:48]), "overlaps")
    expect(A, lambda: comm.all_reduce(f32, bias=np.zeros(63, np.float32)), "bias: 63 elements")
    expect(A, lambda: comm.all_reduce(f32, bias=f32), "bias", "overlaps the output")
    expect(A, lambda: comm.all_reduce(f32, stream=0), "takes no stream")
    expect(A, lambda: comm.all_reduce(f32, algorithm="nccl"), "not one of")
    e = expect(ar.CapacityError, lambda: comm.all_reduce(np.zeros(CAPACITY // 4 + 1, np.float32)), "capacity_bytes")
    assert (e.nbytes, e.capacity) == (CAPACITY + 4, CAPACITY)
    assert isinstance(e, ar.ArgumentError) and isinstance(e, ValueError)
    expect(A, lambda: comm.reduce_scatter(np.zeros(world * 4 + 1, np.float32), np.zeros(4, np.float32)), "divide")
    expect(A, lambda: comm.reduce_scatter(np.zeros(world * 4, np.float32), np.zeros(5, np.float32)), "5 elements")
    both = np.zeros(world * 8, np.float32)
    expect(A, lambda: comm.reduce_scatter(both, both[:8]), "overlaps")
    expect(A, lambda: comm.registered_input("int8"), "dtype int8")
    expect(ar.CapacityError, lambda: comm.registered_input(np.float32, CAPACITY), "holds 1 to")
    expect(A, lambda: comm.table_source("lazy"), "eager")
    expect(A, lambda: comm.table_source("eager", "gpu"), "caller_registered")
    # Host memory of this process is private: the host driver cannot share it, and every rank is told why.
    expect(ar.UnsupportedError, lambda: comm.register(np.zeros(1024, np.float32)), "cannot be shared")
    x = np.ones(100, np.float32)
    comm.all_reduce(x)
    assert (x == world).all()
    comm.close()
    return comm.rank


def wrong_construction():
    """Arguments a communicator refuses before it joins its peers (one rank, no launcher needed)."""
    A = ar.ArgumentError
    expect(A, lambda: ar.Communicator(0, 1, 0, "not-hex"), "job_id")
    expect(A, lambda: ar.Communicator(2, 2, 0, ar.new_job_id()), "rank 2 >= world 2")
    expect(A, lambda: ar.Communicator(0, 1, 0, ar.new_job_id(), backend="tpu"), "unknown backend")
    expect(A, lambda: ar.Communicator(0, 1, 0, ar.new_job_id(), timeout_s=-1), "timeout_s")
    expect(A, lambda: ar.Communicator(0, 1, 0, ar.new_job_id(), capacity_bytes=0, backend="host"), "capacity_bytes")
    expect(ar.UnsupportedError, lambda: ar.Communicator(0, 9, 0, ar.new_job_id(), backend="host"), "9 ranks")
    expect(A, lambda: ar.Communicator(0, 1, 0, ar.new_job_id(), backend="host", device_shared_by=0), "device_shared_by")
    with ar.Communicator(0, 1, 0, ar.new_job_id(), backend="host", device_shared_by=3) as solo:
        solo.all_reduce(np.ones(16, np.float32))
    return 0


def registered():
    """The registered buffers as numpy views through DLPack: input written in place, the zero-copy algorithms' output
    read in place; close() refused while a view lives."""
    comm = host_comm()
    rank, world = comm.rank, comm.world_size
    calls = Calls()
    for dtype in DTYPES:
        count = 40000
        # numpy has no bfloat16 of its own: view bf16 buffers as fp16 and reinterpret them (ml_dtypes).
        as_numpy = "fp16" if dtype.name == "bfloat16" else dtype
        inp = np.from_dlpack(comm.registered_input(as_numpy, count)).view(dtype)
        out = np.from_dlpack(comm.registered_output(as_numpy, count)).view(dtype)
        assert inp.shape == (count,) and inp.dtype == dtype and not np.shares_memory(inp, out)
        for algo in ["symm_zc_1shot", "symm_zc_2shot", None]:
            seed = calls.seed()
            inp[:] = inputs(seed, rank, count, dtype)
            out[:] = np.nan
            comm.all_reduce(inp, out=out, algorithm=algo)
            check_sum(out, reference(seed, world, count, dtype), dtype, world, f"registered {dtype.name} {algo}")
            same_on_every_rank(comm, out, f"registered {dtype.name} {algo}")
        del inp, out
    buf = comm.registered_input("fp32")
    assert buf.count == CAPACITY // 4 and buf.nbytes == CAPACITY and buf.dtype == "fp32"
    assert buf.__dlpack_device__() == (1, 0)
    # A consumer of DLPack before 1.0 gets the unversioned capsule (numpy makes that view read-only); both kinds
    # view the same memory.
    legacy = np.from_dlpack(Unversioned(buf))
    np.from_dlpack(buf)[:3] = [1.0, 2.0, 3.0]
    assert list(legacy[:3]) == [1.0, 2.0, 3.0]
    assert type(buf.__dlpack__()).__name__ == "PyCapsule"
    expect(ar.AllreduceError, comm.close, "still alive")
    del legacy
    view = np.from_dlpack(buf)
    expect(ar.AllreduceError, comm.close, "still alive")
    del view
    comm.close()
    expect(ar.AllreduceError, lambda: np.from_dlpack(buf), "closed")
    return rank


class Unversioned:
    """Asks for the capsule as DLPack consumers before 1.0 do (no max_version)."""

    def __init__(self, buf):
        self.buf = buf

    def __dlpack__(self, **_):
        return self.buf.__dlpack__()

    def __dlpack_device__(self):
        return self.buf.__dlpack_device__()


def fake_torch_tensors():
    """The torch path (with tests/fake_torch.py standing in for torch): CPU tensors summed on the host driver, and
    a wrong dtype, a non-contiguous tensor and a tensor on another device refused by name."""
    import fake_torch

    fake_torch.install()
    import torch

    comm = host_comm()
    rank, world = comm.rank, comm.world_size
    calls = Calls()
    for dtype in DTYPES:
        seed = calls.seed()
        t = torch.Tensor(inputs(seed, rank, 5000, dtype))
        out = torch.Tensor(np.full(5000, np.nan, dtype))
        assert comm.all_reduce(t, out=out) is out
        check_sum(out.array, reference(seed, world, 5000, dtype), dtype, world, f"torch cpu {dtype.name}")
        comm.all_reduce(t)
        assert t.array.tobytes() == out.array.tobytes()
    A = ar.ArgumentError
    expect(A, lambda: comm.all_reduce(torch.Tensor(np.zeros(8, np.float64))), "dtype torch.float64")
    expect(A, lambda: comm.all_reduce(torch.Tensor(np.zeros(16, np.float32)[::2])), "not contiguous", "(2,)")
    on_gpu = torch.Tensor(np.zeros(8, np.float32), "cuda", 3)
    expect(A, lambda: comm.all_reduce(on_gpu), "on torch device cuda:3", "driver (host) reads host memory")
    expect(A, lambda: comm.all_reduce(torch.Tensor(np.zeros(8, np.float32), "mps", 0)), "torch mps device")
    expect(A, lambda: comm.all_reduce(torch.Tensor(np.zeros(8, np.float32)), out=on_gpu), "out: on torch device")
    comm.close()
    return rank


def mismatch():
    """Ranks that disagree on the capacity: the rank that differs from rank 0 raises MismatchError naming both
    values; the others learn that it gave up (PeerError naming it)."""
    rank = int(os.environ["RANK"])
    try:
        ar.Communicator.from_env(capacity_bytes=CAPACITY + 4096 * (rank == 1), backend="host")
    except ar.MismatchError as e:
        assert rank == 1 and "capacity_bytes" in str(e) and "rank 0" in str(e), e
        return rank
    except ar.PeerError as e:
        assert rank != 1 and e.ranks == (1,), (e, e.ranks)
        return rank
    raise AssertionError("ranks of different capacities built a communicator")


def different_kernels():
    """Rank 0 forces the zero-copy two-shot and rank 1 the epoch one-shot on one call: each rank's call raises
    PeerError naming the other rank and both kernels (or, if the other's abort came first, naming no rank), instead
    of returning a sum of buffers its peer never wrote."""
    comm = host_comm(timeout_s=10.0)
    rank = comm.rank
    algorithm = "symm_zc_2shot" if rank == 0 else "symm_epoch_1shot"
    e = expect(ar.PeerError, lambda: comm.all_reduce(np.ones(4096, np.float32), algorithm=algorithm))
    if "where this rank ran" in str(e):
        other = "symm_epoch_1shot" if rank == 0 else "symm_zc_2shot"
        assert f"ran {other} where this rank ran {algorithm}" in str(e), e
        assert e.ranks == (1 - rank,), (e, e.ranks)
    else:
        assert e.ranks == (), (e, e.ranks)
    return rank


def peer_dies():
    """Rank 1 exits after set-up; every other rank's next call raises PeerError naming it within 2 s (the deadline is
    10 s), and every later call too; abort() from another thread is refused nothing; then the survivors allreduce
    exactly with a communicator of their own (a new job id)."""
    comm = host_comm(timeout_s=10.0)
    rank, world = comm.rank, comm.world_size
    comm.barrier()
    if rank == 1:
        os._exit(0)
    start = time.monotonic()
    e = expect(ar.PeerError, lambda: comm.all_reduce(np.ones(4096, np.float32)), "rank(s) [1]")
    took = time.monotonic() - start
    assert e.ranks == (1,), e.ranks
    assert took < 2.0, f"rank 1's death took {took:.2f} s to be reported"
    print(f"PeerError named rank 1 after {took:.2f} s", flush=True)
    expect(ar.PeerError, lambda: comm.all_reduce(np.ones(8, np.float32)), "rank(s) [1]")
    expect(ar.PeerError, comm.check, "rank(s) [1]")
    comm.close()
    me = rank - (rank > 1)
    job = os.environ["ALLREDUCE_JOB_ID"] + "2"
    with ar.Communicator(me, world - 1, me, job, backend="host", capacity_bytes=CAPACITY) as survivors:
        x = np.ones(100, np.float32)
        survivors.all_reduce(x)
        assert (x == world - 1).all(), x[:4]
    return rank


def aborted():
    """abort() (from any thread; here between calls, since a host-driver call holds the interpreter) ends the
    communicator on this rank: its calls and check() raise PeerError; the others go on to close."""
    comm = host_comm()
    comm.all_reduce(np.ones(64, np.float32))
    if comm.rank == 0:
        t = threading.Thread(target=comm.abort)
        t.start()
        t.join()
        e = expect(ar.PeerError, lambda: comm.all_reduce(np.ones(64, np.float32)), "aborted by the caller")
        assert e.ranks == (), e.ranks
        expect(ar.PeerError, comm.check, "aborted")
    comm.barrier()
    comm.abort()
    comm.close()
    return comm.rank


def peer_never_comes():
    """Rank 1 exits before set-up; the others' set-up raises PeerError naming it."""
    if os.environ["RANK"] == "1":
        os._exit(0)
    e = expect(ar.PeerError, lambda: host_comm(timeout_s=1.0, setup_timeout_s=1.0), "1")
    assert e.ranks == (1,), e.ranks
    return 0


def across_refused():
    """Two emulated nodes on the host driver: every rank raises UnsupportedError at set-up saying NCCL/RCCL is
    needed, at once, waiting for no peer."""
    world = int(os.environ["WORLD_SIZE"])
    os.environ["ALLREDUCE_NODES"] = "2"
    os.environ["ALLREDUCE_NODE_ID"] = str(int(os.environ["RANK"]) // (world // 2))
    start = time.monotonic()
    expect(ar.UnsupportedError, lambda: ar.Across.from_env(backend="host", setup_timeout_s=30.0), "NCCL/RCCL")
    assert time.monotonic() - start < 10, time.monotonic() - start
    return int(os.environ["RANK"])


if __name__ == "__main__":
    scenario = sys.argv[1]
    if globals()[scenario]() == 0:
        print(f"{scenario} ok", flush=True)
