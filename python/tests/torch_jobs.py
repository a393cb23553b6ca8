"""The bodies of test_torch_ops.py's multi-rank tests, with real torch: ``python torch_jobs.py SCENARIO`` runs one as
a rank of a job started through ``python -m allreduce_rs.launch``, like jobs.py's scenarios, whose seeds, tolerance
and checks these share. A rank fails (and so the job) on any wrong result or unexpected exception; rank 0 prints
``SCENARIO ok`` when its checks all passed."""

import hashlib
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

import allreduce_rs as ar
import allreduce_rs.ops as ops
import jobs
from jobs import CAPACITY, Calls, expect

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# Odd element counts (no vector width divides them), flat and in two and three dimensions.
SHAPES = [(1,), (7,), (13, 1), (3, 1025), (4099,), (5, 7, 9)]
NUMPY_DTYPES = {d.name: d for d in jobs.DTYPES}


def inputs(seed, which, shape, dtype):
    """Uniform in [0, 1), rounded to ``dtype``: rank ``which``'s input of the call ``seed``, or with ``which`` past
    the ranks, a tensor every rank draws alike."""
    return torch.from_numpy(np.random.default_rng(seed + [which]).random(shape)).to(dtype)


def reference(seed, ranks, shape, dtype):
    """The float64 sum of the inputs of ``ranks``."""
    return sum(inputs(seed, r, shape, dtype).double() for r in ranks)


def raw(t):
    """``t``'s elements' bytes, in logical order: what bitwise comparisons compare."""
    return t.contiguous().flatten().view(torch.uint8).numpy()


def check_sum(got, want, world, what):
    """jobs.check_sum on a tensor: within half an ulp plus float32 accumulation of the float64 sum of ``world``."""
    assert got.shape == want.shape, f"{what}: shape {list(got.shape)}, want {list(want.shape)}"
    dtype = NUMPY_DTYPES[str(got.dtype).split(".")[-1]]
    jobs.check_sum(got.double().flatten().numpy(), want.flatten().numpy(), dtype, world, what)


def same_bits(got, want, what):
    got_is, want_is = (got.shape, got.dtype), (want.shape, want.dtype)
    assert got_is == want_is, f"{what}: {got_is}, want {want_is}"
    assert raw(got).tobytes() == raw(want).tobytes(), f"{what}: differs bitwise"


def values():
    """Every op on every dtype and odd shape: the float64 sum, the same bits on every rank and as the plain
    ``comm.all_reduce`` (also in inference mode); transposed views through the ops' copies; reduce-scatter shards by
    rows and (split_last_dim) by columns, each the same bits as the plain reduce-scatter or the allreduce's slice."""
    comm = jobs.host_comm()
    rank, world = comm.rank, comm.world_size
    group = ops.register(comm)
    calls = Calls()
    for dtype in DTYPES:
        for shape in SHAPES:
            seed = calls.seed()
            x = inputs(seed, rank, shape, dtype)
            what = f"{dtype} {list(shape)}"
            plain = comm.all_reduce(x, out=torch.empty_like(x))
            kept = x.clone()
            y = ops.all_reduce(x, group)
            check_sum(y, reference(seed, range(world), shape, dtype), world, what)
            jobs.same_on_every_rank(comm, raw(y), what)
            same_bits(y, plain, f"{what}: all_reduce and the plain call")
            same_bits(x, kept, f"{what}: all_reduce's input")
            inplace = x.clone()
            assert ops.all_reduce_(inplace, group) is inplace
            same_bits(inplace, plain, f"{what}: all_reduce_")
            out = torch.full_like(x, float("nan"))
            assert ops.all_reduce_out(x, group, out) is out
            same_bits(out, plain, f"{what}: all_reduce_out")
            # A bias (the values of a rank past the last, so the same on every rank) after the ranks' inputs.
            b = inputs(seed, world, shape, dtype)
            with_bias = comm.all_reduce(x, out=torch.empty_like(x), bias=b)
            check_sum(with_bias, reference(seed, range(world + 1), shape, dtype), world + 1, f"{what} + bias")
            jobs.same_on_every_rank(comm, raw(with_bias), f"{what} + bias")
            same_bits(ops.all_reduce(x, group, b), with_bias, f"{what}: all_reduce with a bias")
            inplace = x.clone()
            same_bits(ops.all_reduce_(inplace, group, b), with_bias, f"{what}: all_reduce_ with a bias")
            same_bits(ops.all_reduce_out(x, group, out, b), with_bias, f"{what}: all_reduce_out with a bias")
            with torch.inference_mode():
                same_bits(ops.all_reduce(x, group), plain, f"{what}: all_reduce in inference mode")
            # The operators through torch's dispatcher (what compiled graphs call) give the functions' bits.
            lib = torch.ops.allreduce_rs
            same_bits(lib.all_reduce(x, group, b), with_bias, f"{what}: torch.ops all_reduce")
            inplace = x.clone()
            lib.all_reduce_(inplace, group)
            same_bits(inplace, plain, f"{what}: torch.ops all_reduce_")
            out = torch.full_like(x, float("nan"))
            lib.all_reduce_out(x, group, out)
            same_bits(out, plain, f"{what}: torch.ops all_reduce_out")
            if len(shape) > 1:
                xt, want = x.transpose(0, -1), plain.transpose(0, -1)
                same_bits(ops.all_reduce(xt, group), want, f"{what}: all_reduce of a transposed view")
                strided = x.clone().transpose(0, -1)
                ops.all_reduce_(strided, group)
                same_bits(strided, want, f"{what}: all_reduce_ of a transposed view")
                out = torch.full(shape, float("nan"), dtype=dtype).transpose(0, -1)
                ops.all_reduce_out(xt, group, out)
                same_bits(out, want, f"{what}: all_reduce_out into a transposed view")
    cases = [
        ((world * 3, 5), False, False),
        ((world * 7,), False, False),
        ((world, 2, 3), False, False),
        ((5, world * 3), True, False),
        ((1, world), True, False),
        ((2, 3, world * 5), True, False),
        # Strided inputs: x's transpose split by rows (x's columns), and by columns (x's rows).
        ((5, world * 3), False, True),
        ((world * 3, 5), True, True),
    ]
    for dtype in DTYPES:
        for shape, split_last_dim, transposed in cases:
            seed = calls.seed()
            x = inputs(seed, rank, shape, dtype)
            whole = reference(seed, range(world), shape, dtype)
            plain = comm.all_reduce(x, out=torch.empty_like(x))
            if transposed:
                x, whole, plain = x.t(), whole.t(), plain.t()
            dim = x.dim() - 1 if split_last_dim else 0
            k = x.shape[dim] // world
            what = f"reduce_scatter {dtype} {list(x.shape)} split_last_dim={split_last_dim} transposed={transposed}"
            shard = ops.reduce_scatter(x, group, split_last_dim=split_last_dim)
            check_sum(shard, whole.narrow(dim, rank * k, k), world, what)
            same_bits(shard, plain.narrow(dim, rank * k, k), f"{what}: and the allreduce's slice")
            if dim == 0 and not transposed:
                flat = comm.reduce_scatter(x, torch.empty(x.numel() // world, dtype=dtype))
                same_bits(shard.flatten(), flat, f"{what}: and the plain reduce_scatter")
    # Under a dispatch mode the functions go through the operators (a trace records them), with the same bits.
    seed = calls.seed()
    x = inputs(seed, rank, (world * 4, 3), torch.float32)
    plain = comm.all_reduce(x, out=torch.empty_like(x))
    with Recording() as seen:
        y = ops.all_reduce(x, group)
        ops.all_reduce_(x.clone(), group)
        ops.all_reduce_out(x, group, torch.empty_like(x))
        ops.reduce_scatter(x, group)
        ops.all_reduce_add_rms_norm(x, group, x.clone(), x[0].clone())
    names = ["all_reduce", "all_reduce_", "all_reduce_out", "reduce_scatter", "all_reduce_add_rms_norm"]
    assert seen == [f"allreduce_rs.{n}.default" for n in names], seen
    same_bits(y, plain, "all_reduce under a dispatch mode")
    comm.close()
    return rank


class Recording(torch.utils._python_dispatch.TorchDispatchMode):
    """A dispatch mode that lists the allreduce_rs operators it sees, as a tracer would record them."""

    def __enter__(self):
        super().__enter__()
        self.seen = []
        return self.seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "allreduce_rs":
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def opcheck():
    """torch.library.opcheck on every op (its schema, fake implementation, autograd registration and AOT dispatch),
    contiguous and strided, in each dtype. opcheck runs the op several times: every rank makes the same calls."""
    comm = jobs.host_comm()
    rank, world = comm.rank, comm.world_size
    group = ops.register(comm)
    calls = Calls()
    lib = torch.ops.allreduce_rs
    for dtype in DTYPES:
        x = inputs(calls.seed(), rank, (world * 3, 5), dtype)
        samples = [
            (lib.all_reduce, (x, group)),
            (lib.all_reduce, (x.t(), group)),
            (lib.all_reduce_, (x.clone(), group)),
            (lib.all_reduce_, (x.clone().t(), group)),
            (lib.all_reduce_out, (x, group, torch.empty_like(x))),
            (lib.all_reduce_out, (x, group, torch.empty(5, world * 3, dtype=dtype).t())),
            (lib.reduce_scatter, (x, group)),
            (lib.reduce_scatter, (x, group, False)),
            (lib.reduce_scatter, (x.t(), group, True)),
            (lib.reduce_scatter, (x.reshape(3, 5, world), group, True)),
            (lib.all_reduce_add_rms_norm, (x, group, x.clone(), x[0].clone(), 1e-5)),
            (lib.all_reduce_add_rms_norm, (x.t(), group, x.clone().t(), x[:, 0].clone(), 1e-5)),
        ]
        for op, args in samples:
            result = torch.library.opcheck(op, args)
            assert set(result.values()) == {"SUCCESS"}, f"{op} {dtype}: {result}"
    comm.close()
    return rank


def blocks(comm, group, device, modes, steps):
    """A small tensor-parallel block (a row-parallel Linear's partial product, the allreduce, the bias, a ReLU),
    eager and compiled with ``torch.compile(fullgraph=True)`` in each of ``modes``: the compiled block gives the
    eager bits on fresh inputs every step, the eager block through the op gives the plain ``comm.all_reduce``'s
    bits, and both are near the float64 dense block. Likewise through ``all_reduce_`` and through
    ``reduce_scatter(split_last_dim=True)``, whose shard is the allreduced block's columns, bitwise."""
    rank, world = comm.rank, comm.world_size
    tokens, d_in, d_out = 5, world * 24, world * 9
    k, n = d_in // world, d_out // world

    def block(x, w, b):
        return torch.relu(ops.all_reduce(F.linear(x, w), group) + b)

    def block_inplace(x, w, b):
        y = F.linear(x, w)
        ops.all_reduce_(y, group)
        return torch.relu(y + b)

    def block_plain(x, w, b):
        return torch.relu(comm.all_reduce(F.linear(x, w)) + b)

    def block_scatter(x, w, b):
        return torch.relu(ops.reduce_scatter(F.linear(x, w), group, split_last_dim=True) + b)

    calls = Calls()
    for dtype in [torch.float32, torch.bfloat16]:
        for mode in modes:
            compiled = {f: torch.compile(f, fullgraph=True, mode=mode) for f in [block, block_inplace, block_scatter]}
            for step in range(steps):
                seed = calls.seed()
                # The whole layer, the same on every rank: input and weight in [-1, 1), the weight scaled by 1/d_in.
                x = (inputs(seed, world, (tokens, d_in), torch.float64) * 2 - 1).to(dtype)
                w = ((inputs(seed, world + 1, (d_out, d_in), torch.float64) * 2 - 1) / d_in).to(dtype)
                b = inputs(seed, world + 2, (d_out,), dtype)
                xs, ws = (t[:, rank * k : (rank + 1) * k].contiguous().to(device) for t in (x, w))
                bd, bs = b.to(device), b[rank * n : (rank + 1) * n].contiguous().to(device)
                what = f"block {dtype} mode={mode} step {step}"
                eager = block(xs, ws, bd)
                same_bits(eager.cpu(), block_plain(xs, ws, bd).cpu(), f"{what}: the op and the plain call")
                jobs.same_on_every_rank(comm, raw(eager.cpu()), what)
                # A compiled function's outputs under CUDA graphs are overwritten by its next replay: copied out.
                same_bits(compiled[block](xs, ws, bd).cpu(), eager.cpu(), f"{what}: compiled and eager")
                same_bits(compiled[block_inplace](xs, ws, bd).cpu(), eager.cpu(), f"{what}: all_reduce_ compiled")
                same_bits(block_inplace(xs, ws, bd).cpu(), eager.cpu(), f"{what}: all_reduce_ eager")
                cols = eager.cpu()[:, rank * n : (rank + 1) * n]
                same_bits(block_scatter(xs, ws, bs).cpu(), cols, f"{what}: reduce_scatter eager")
                same_bits(compiled[block_scatter](xs, ws, bs).cpu(), cols, f"{what}: reduce_scatter compiled")
                want = torch.relu(x.double() @ w.double().t() + b.double())
                # Each rank's partial product is rounded to the dtype before the sum: a few roundings of the scale.
                scale = x.double().abs() @ w.double().abs().t() + b.double().abs()
                bound = (2.0**-6 if dtype == torch.bfloat16 else 2.0**-16) * scale
                err = (eager.cpu().double() - want).abs()
                assert (err <= bound).all(), f"{what}: {int((err > bound).sum())} elements off the dense block"


def norm_block():
    """A row-parallel layer then the fused residual add and RMSNorm, compiled with fullgraph on CPU Inductor: the
    compiled block gives the eager bits and the plain call's, on fresh inputs each step, and every rank the same;
    r and y near the float64 block."""
    comm = jobs.host_comm()
    group = ops.register(comm)
    rank, world = comm.rank, comm.world_size
    tokens, d_in, hidden = 7, world * 16, 40
    k = d_in // world

    def block(x, w, residual, g):
        return ops.all_reduce_add_rms_norm(F.linear(x, w), group, residual, g, 1e-5)

    compiled = torch.compile(block, fullgraph=True)
    calls = Calls()
    for dtype in [torch.float32, torch.bfloat16]:
        for step in range(3):
            seed = calls.seed()
            x = (inputs(seed, world, (tokens, d_in), torch.float64) * 2 - 1).to(dtype)
            w = ((inputs(seed, world + 1, (hidden, d_in), torch.float64) * 2 - 1) / d_in).to(dtype)
            res = inputs(seed, world + 2, (tokens, hidden), dtype)
            g = inputs(seed, world + 3, (hidden,), dtype) + 0.5
            xs, ws = (t[:, rank * k : (rank + 1) * k].contiguous() for t in (x, w))
            what = f"norm block {dtype} step {step}"
            r_eager, r_comp, r_plain = res.clone(), res.clone(), res.clone()
            y_eager = block(xs, ws, r_eager, g)
            y_comp = compiled(xs, ws, r_comp, g)
            y_plain, _ = comm.all_reduce_add_rms_norm(F.linear(xs, ws), r_plain, g, 1e-5)
            for got, want, part in [(y_comp, y_eager, "y compiled"), (r_comp, r_eager, "r compiled"),
                                    (y_plain, y_eager, "y plain"), (r_plain, r_eager, "r plain")]:
                same_bits(got, want, f"{what}: {part}")
            jobs.same_on_every_rank(comm, raw(y_eager), what)
            r64 = res.double() + x.double() @ w.double().t()
            y64 = r64 / torch.sqrt((r64**2).mean(-1, keepdim=True) + 1e-5) * g.double()
            # The partial products are rounded to the dtype before the sum: a few roundings of the row's scale.
            tol = 2.0**-5 if dtype == torch.bfloat16 else 2.0**-14
            for got, want, part in [(r_eager, r64, "r"), (y_eager, y64, "y")]:
                err = (got.double() - want).abs().max().item()
                assert err <= tol * (want.abs().max().item() + 1), f"{what}: {part} off float64 by {err}"
    comm.close()
    return rank


def compiled():
    """The block on the host driver, compiled by CPU Inductor."""
    comm = jobs.host_comm()
    blocks(comm, ops.register(comm), "cpu", modes=[None], steps=3)
    comm.close()
    return comm.rank


def cuda_compiled():
    """The block on a GPU: compiled by Inductor with the default mode and with ``mode="reduce-overhead"``, whose
    CUDA graphs (torch's cudagraph trees: a warm-up call, a recording, then replays) run the op; no graph may be
    skipped for CUDA graphs."""
    from torch._dynamo.utils import counters

    comm = ar.Communicator.from_env(capacity_bytes=CAPACITY, backend="cuda")
    torch.cuda.set_device(comm.device)
    blocks(comm, ops.register(comm), f"cuda:{comm.device}", modes=[None, "reduce-overhead"], steps=4)
    torch.cuda.synchronize()
    skips = dict(counters["inductor"])
    assert not skips.get("cudagraph_skips"), f"a graph was not run as a CUDA graph: {skips}"
    comm.close()
    return comm.rank


def two_groups():
    """Two communicators per process, used alternately, eagerly and from one compiled graph (car's comm_idx): the
    whole job's (3 ranks) and one per pair of ranks (ranks 0 and 1 together, rank 2 alone: its own job id). Each
    call's sum is over its own group's ranks, which only the communicator its name maps to gives."""
    whole = jobs.host_comm()
    rank, world = whole.rank, whole.world_size
    assert world == 3, "two_groups runs as 3 ranks"
    members = [0, 1] if rank < 2 else [2]
    job = hashlib.sha256(f"{os.environ['ALLREDUCE_JOB_ID']}/pair{members[0]}".encode()).hexdigest()[:32]
    here = members.index(rank)
    pair = ar.Communicator(here, len(members), here, job, capacity_bytes=CAPACITY, backend="host")
    g_whole, g_pair = ops.register(whole), ops.register(pair, "pair")

    def alternate(x, y):
        return (
            ops.all_reduce(x, g_whole),
            ops.all_reduce(y, g_pair),
            ops.all_reduce(y, g_whole),
            ops.all_reduce(x, g_pair),
        )

    calls = Calls()
    for dtype in [torch.bfloat16, torch.float32]:
        compiled = torch.compile(alternate, fullgraph=True)
        for step in range(3):
            sx, sy = calls.seed(), calls.seed()
            shape = (3, 337)
            x, y = inputs(sx, rank, shape, dtype), inputs(sy, rank, shape, dtype)
            eager = alternate(x, y)
            wants = [(sx, whole, range(world)), (sy, pair, members), (sy, whole, range(world)), (sx, pair, members)]
            for i, (got, (seed, comm, ranks)) in enumerate(zip(eager, wants)):
                what = f"two_groups {dtype} step {step} call {i}"
                check_sum(got, reference(seed, ranks, shape, dtype), len(ranks), what)
                plain = comm.all_reduce(x if seed == sx else y, out=torch.empty_like(x))
                same_bits(got, plain, f"{what}: the op and the plain call")
                jobs.same_on_every_rank(comm, raw(got), what)
            for i, (got, want) in enumerate(zip(compiled(x, y), eager)):
                same_bits(got, want, f"two_groups {dtype} step {step} call {i}: compiled and eager")
    pair.close()
    whole.close()
    return rank


def expect_compile_error(call, *words):
    """Runs ``call``, which must fail while torch compiles it with every one of ``words`` in its message."""
    try:
        call()
    except torch._dynamo.exc.TorchDynamoException as e:
        for w in words:
            assert w in str(e), f"{w!r} not in {str(e)!r}"
        return
    raise AssertionError(f"compiled with no error ({words})")


def refusals():
    """The ops' refusals by class and words, eagerly and while compiling: unknown and unregistered group names,
    names taken twice, shapes reduce-scatter cannot split, an out of another shape, and the native call's own
    refusals passed through; then a call still works."""
    comm = jobs.host_comm()
    world = comm.world_size
    A = ar.ArgumentError
    group = ops.register(comm, "tp")
    x = torch.ones(world * 4, 3)
    unknown = ["group 'nope'", "no communicator is registered", "['tp']", "register(comm, name)"]
    expect(A, lambda: ops.all_reduce(x, "nope"), *unknown)
    expect(A, lambda: ops.all_reduce_(x, "nope"), *unknown)
    expect(A, lambda: ops.all_reduce_out(x, "nope", torch.empty_like(x)), *unknown)
    expect(A, lambda: ops.reduce_scatter(x, "nope"), *unknown)
    expect(A, lambda: ops.communicator("nope"), *unknown)
    expect(A, lambda: ops.register(comm, ""), "group name ''")
    expect(A, lambda: ops.register("tp"), "a str is not an allreduce_rs.Communicator")
    assert ops.register(comm, group) == group and ops.communicator(group) is comm
    solo = ar.Communicator(0, 1, 0, ar.new_job_id(), capacity_bytes=CAPACITY, backend="host")
    expect(A, lambda: ops.register(solo, group), "group 'tp' already names another communicator")
    named = ops.register(solo)
    assert named.startswith("comm") and ops.unregister(named) is solo
    expect(A, lambda: ops.unregister(named), f"group {named!r}")
    expect(A, lambda: ops.all_reduce(x, named), f"group {named!r}")
    solo.close()
    divide = f"the world size {world}"
    expect(A, lambda: ops.reduce_scatter(torch.ones(world * 4 + 1, 3), group), f"[{world * 4 + 1}, 3]", "first", divide)
    expect(A, lambda: ops.reduce_scatter(torch.ones(3, world * 4 + 1), group, True), "last dimension", divide)
    expect(A, lambda: ops.reduce_scatter(torch.tensor(1.0), group), "shape []")
    expect(A, lambda: ops.all_reduce_out(x, group, torch.empty(3, world * 4)), f"out has shape [3, {world * 4}]")
    expect(A, lambda: ops.all_reduce(x.double(), group), "dtype torch.float64")
    expect(A, lambda: ops.all_reduce_out(x, group, torch.empty_like(x, dtype=torch.float16)), "dtype fp16 differs")
    expect(ar.CapacityError, lambda: ops.all_reduce(torch.ones(CAPACITY // 4 + 1), group), "capacity_bytes")
    res, g = torch.ones(world * 4, 3), torch.ones(3)
    expect(A, lambda: ops.all_reduce_add_rms_norm(x, group, res[:, :2], g), "residual [", "is not x's")
    expect(A, lambda: ops.all_reduce_add_rms_norm(x, group, res, torch.ones(4)), "weight [4] is not one row")
    expect(A, lambda: ops.all_reduce_add_rms_norm(x, group, res, g, 0.0), "eps")
    expect_compile_error(
        lambda: torch.compile(lambda t: ops.all_reduce_add_rms_norm(t, group, res, g[:2]), fullgraph=True)(x),
        "weight [2] is not one row",
    )
    # Refused while tracing, by the fake implementations: before any rank runs anything.
    expect_compile_error(lambda: torch.compile(lambda t: ops.all_reduce(t, "nope"), fullgraph=True)(x), *unknown)
    bad = torch.ones(world * 4 + 1, 3)
    expect_compile_error(
        lambda: torch.compile(lambda t: ops.reduce_scatter(t, group), fullgraph=True)(bad), "first dimension", divide
    )
    # A graph compiled for a name that is then unregistered raises at its next call (the name is looked up at run
    # time, whatever the backend: aot_eager spares this check a C++ compile).
    ops.register(comm, "tp2")
    f = torch.compile(lambda t: ops.all_reduce(t, "tp2") * 2, fullgraph=True, backend="aot_eager")
    assert (f(torch.ones(5)) == 2 * world).all()
    ops.unregister("tp2")
    expect(A, lambda: f(torch.ones(5)), "group 'tp2'")
    assert (ops.all_reduce(torch.ones(5), group) == world).all()
    comm.close()
    return comm.rank


def across_store():
    """Across's set-up through torch.distributed's store, as two emulated nodes on the host driver: with a gloo
    process group up (its store listens at MASTER_PORT, where the TCP bootstrap would have had to), every rank gets
    rank 0's reason (no NCCL on the host driver) through the store; a second endpoint uses fresh keys; then rank 3
    never sets up, and the others' PeerError names it at the set-up deadline."""
    import time

    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    os.environ["ALLREDUCE_NODES"] = "2"
    os.environ["ALLREDUCE_NODE_ID"] = str(rank // (world // 2))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    for _ in range(2):
        expect(ar.UnsupportedError, lambda: ar.Across.from_env(setup_timeout_s=30.0), "rank 0 cannot run NCCL/RCCL")
    store = dist.distributed_c10d._get_default_store()
    job = os.environ["ALLREDUCE_JOB_ID"]
    assert store.check([f"allreduce_rs/across/{job}/1/1/{rank}"]), "the second endpoint's key is not in the store"
    dist.barrier()
    if rank != 3:
        start = time.monotonic()
        e = expect(ar.PeerError, lambda: ar.Across.from_env(setup_timeout_s=2.0, store=store), "torch.distributed")
        assert e.ranks == (3,), e.ranks
        assert 2.0 <= time.monotonic() - start < 10, time.monotonic() - start
    dist.barrier()
    dist.destroy_process_group()
    return rank


if __name__ == "__main__":
    scenario = sys.argv[1]
    if globals()[scenario]() == 0:
        print(f"{scenario} ok", flush=True)
