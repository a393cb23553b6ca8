"""allreduce_rs from Python with real torch tensors, for scripts/gpu_python.sh (nothing is built where it runs).

``python gpu_python_check.py check [--backend cuda|host] [--only eager,graph,...]`` runs as every rank of a job (under ``comm-bench launch``
or ``python -m allreduce_rs.launch``): torch tensors, eagerly and inside ``torch.cuda.graph`` (captured once,
replayed on fresh inputs), every comm_bench.py size and dtype, each result checked against the float64 sum of every
rank's input (each rank regenerates its peers' inputs from their seeds: the gathered inputs) and for the same bits
on every rank; in place, reduce-scatter, the registered buffers through DLPack, ``register`` of a torch tensor, the
refusals (wrong device, dtype, layout, alignment, size), and ``allreduce_rs.ops`` under ``torch.compile`` (the default
mode and ``mode="reduce-overhead"``'s CUDA graphs). With ``--backend host``, CPU tensors on the host driver
(no graphs, no register). Every rank prints its failures; the job fails when any rank had one.

``python gpu_python_check.py overhead OUT`` compares, at 1024 elements, the Python path's figures
(``OUT/py_{eager,graph}.json`` from ``python -m allreduce_rs.bench``) with comm-bench's ``auto`` (the communicator's public call)
(``OUT/cb_{eager,graph}/comm_ops_benchmark.json``) and writes ``OUT/overhead.txt`` and ``OUT/overhead.json``.
"""

import json
import os
import struct
import sys
import time
import traceback

# Half an output ulp plus float32 accumulation (allreduce::check::tolerance).
HALF_ULP = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-24}
# The designs that read (or write) their peers' buffers in place, each forced in turn on registered memory.
ZERO_COPY = ["symm_zc_1shot", "symm_zc_2shot", "symm_zc_2shot_push", "symm_zc_2shot_pull", "symm_zc_2shot_ll"]


def comm_bench_sizes(align):
    return [-(-int(2.0 ** (10 + 14 * i / 19)) // align) * align for i in range(20)]


class Check:
    def __init__(self, backend):
        import torch

        import allreduce_rs as ar

        self.torch, self.ar = torch, ar
        capacity = (1 << 24) * 4
        # A peer's deadline covers torch.compile: Inductor compiles on every rank before the first call of a
        # compiled graph runs its collective, and 8 ranks on 16 cores finish seconds apart.
        self.comm = ar.Communicator.from_env(capacity_bytes=capacity, backend=backend, timeout_s=120)
        self.rank, self.world = self.comm.rank, self.comm.world_size
        self.host = self.comm.backend == "host"
        self.device = "cpu" if self.host else f"cuda:{self.comm.device}"
        if not self.host:
            torch.cuda.set_device(self.comm.device)
        self.dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
        self.sizes = comm_bench_sizes(512 if self.comm.backend == "hip" else 256)
        if self.host:
            # CI runs the host driver at every size; here it checks real torch CPU tensors, which small sizes show.
            self.sizes = [n for n in self.sizes if n <= 1 << 20]
        self.failures = []
        self.checked = 0
        self.seed = 0

    def fail(self, what):
        self.failures.append(what)
        print(f"FAILED: {what}", flush=True)

    def inputs(self, seed, rank, count, dtype):
        """Rank ``rank``'s input of call ``seed``: uniform in [0, 1) like torch.rand, rounded to ``dtype``."""
        g = self.torch.Generator(device=self.device)
        g.manual_seed(seed * 64 + rank)
        return self.torch.rand(count, generator=g, device=self.device).to(self.dtypes[dtype])

    def reference(self, seed, count, dtype):
        """The float64 sum of every rank's input: the inputs as gathered, regenerated from their seeds."""
        return sum(self.inputs(seed, r, count, dtype).double() for r in range(self.world))

    def digest(self, t):
        """A position-weighted sum of the bit patterns, to compare results bitwise across ranks."""
        torch = self.torch
        bits = t.view(torch.int16 if t.element_size() == 2 else torch.int32).to(torch.int64)
        weights = torch.arange(1, t.numel() + 1, device=t.device, dtype=torch.int64) * 2654435761 % 2147483647
        return int((bits * weights).sum().item())

    def verify(self, got, want, dtype, what, same_everywhere=True):
        """``got`` within the bound of ``want`` on this rank, and (an allreduce's) the same bits on every rank."""
        self.checked += 1
        tol = HALF_ULP[dtype] + self.world * 2.0**-23
        err = (got.double() - want).abs()
        bad = ~(err <= tol * want.abs() + 1e-30)
        nbad = int(bad.sum().item())
        if nbad:
            i = int(bad.nonzero()[0].item())
            self.fail(f"{what}: {nbad} wrong elements, first {i}: {got[i].item()} vs {want[i].item()}")
        digests = [struct.unpack("q", d)[0] for d in self.comm.all_gather_bytes(struct.pack("q", self.digest(got)))]
        if same_everywhere and len(set(digests)) != 1:
            self.fail(f"{what}: ranks differ bitwise: {digests}")

    def align(self):
        """Every rank's own GPU work done before any rank issues the next collective.

        Ranks that share a GPU (MPS) share its SMs: while the peers' kernels spin on a collective's flags, a rank's
        other kernels (here: its inputs and reference) run so slowly that the peers' deadline can pass
        (results/h200-mps/python-2). The check times nothing, so it lines the ranks up before each call.
        """
        if not self.host:
            self.torch.cuda.synchronize()
            self.comm.barrier()

    def trace(self, what):
        """With CHECK_TRACE=1, each call is printed (with the time) before it is issued, to find a failing one."""
        if os.environ.get("CHECK_TRACE") == "1":
            print(f"{time.monotonic():.3f} {what}", flush=True)

    def next_seed(self):
        self.seed += 1
        return self.seed

    def eager(self):
        torch = self.torch
        for dtype in self.dtypes:
            for n in self.sizes:
                seed = self.next_seed()
                x = self.inputs(seed, self.rank, n, dtype)
                want = self.reference(seed, n, dtype)
                y = torch.full_like(x, float("nan"))
                self.align()
                self.trace(f"eager {dtype} x {n}")
                assert self.comm.all_reduce(x, out=y) is y
                self.verify(y, want, dtype, f"eager {dtype} x {n} ({self.comm.last_algorithm})")
                z = x.clone()
                self.align()
                self.comm.all_reduce(z)
                if not torch.equal(
                    z.view(torch.int16 if z.element_size() == 2 else torch.int32),
                    y.view(torch.int16 if y.element_size() == 2 else torch.int32),
                ):
                    self.fail(f"eager {dtype} x {n}: in place differs from out of place")

    def prepared(self):
        """Prepared calls on torch tensors: checked once, then issued on fresh inputs copied into the same tensors,
        eagerly and captured in a graph; the same bits as the plain call."""
        torch = self.torch
        for dtype in self.dtypes:
            for n in self.sizes[::4]:
                x = torch.empty(n, dtype=self.dtypes[dtype], device=self.device)
                y = torch.empty_like(x)
                call = self.comm.prepare_all_reduce(x, out=y)
                seed = self.next_seed()
                x.copy_(self.inputs(seed, self.rank, n, dtype))
                y.fill_(float("nan"))
                self.align()
                assert call() is y
                self.verify(y, self.reference(seed, n, dtype), dtype, f"prepared {dtype} x {n}")
                plain = torch.empty_like(y)
                self.align()
                self.comm.all_reduce(x, out=plain)
                bits = torch.int16 if y.element_size() == 2 else torch.int32
                if not torch.equal(plain.view(bits), y.view(bits)):
                    self.fail(f"prepared {dtype} x {n}: differs from the plain call")
                g = torch.cuda.CUDAGraph()
                self.align()
                with torch.cuda.graph(g):
                    call()
                seed = self.next_seed()
                x.copy_(self.inputs(seed, self.rank, n, dtype))
                y.fill_(float("nan"))
                self.align()
                g.replay()
                self.verify(y, self.reference(seed, n, dtype), dtype, f"prepared graph {dtype} x {n}")
                del g

    def graph(self):
        """One graph per size, captured on torch's capture stream; each replay runs on fresh inputs."""
        torch = self.torch
        for dtype in self.dtypes:
            for n in self.sizes:
                x = torch.zeros(n, dtype=self.dtypes[dtype], device=self.device)
                y = torch.zeros_like(x)
                g = torch.cuda.CUDAGraph()
                self.align()
                with torch.cuda.graph(g):
                    self.comm.all_reduce(x, out=y)
                algorithm = self.comm.last_algorithm
                for replay in range(2):
                    seed = self.next_seed()
                    x.copy_(self.inputs(seed, self.rank, n, dtype))
                    y.fill_(float("nan"))
                    self.align()
                    g.replay()
                    self.verify(
                        y, self.reference(seed, n, dtype), dtype, f"graph {dtype} x {n} replay {replay} ({algorithm})"
                    )
                del g

    def two_groups(self):
        """Two communicators (the second with a job id rank 0 drew) used alternately on one stream, eagerly and inside
        one torch.cuda.graph replayed on fresh inputs: each sum checked, car's comm_idx use."""
        torch, ar = self.torch, self.ar
        job = self.comm.all_gather_bytes(ar.new_job_id().encode())[0].decode()
        local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        other = ar.Communicator(self.rank, self.world, local_rank, job, capacity_bytes=1 << 22, backend="cuda", timeout_s=120)
        try:
            for dtype in ["bf16", "fp32"]:
                for n in [4096, 262144]:
                    x1 = torch.zeros(n, dtype=self.dtypes[dtype], device=self.device)
                    x2, y1, y2 = torch.zeros_like(x1), torch.zeros_like(x1), torch.zeros_like(x1)
                    g = torch.cuda.CUDAGraph()
                    self.align()
                    with torch.cuda.graph(g):
                        self.comm.all_reduce(x1, out=y1)
                        other.all_reduce(x2, out=y2)
                        self.comm.all_reduce(y2, out=x1)
                    for replay in range(2):
                        s1, s2 = self.next_seed(), self.next_seed()
                        x1.copy_(self.inputs(s1, self.rank, n, dtype))
                        x2.copy_(self.inputs(s2, self.rank, n, dtype))
                        self.align()
                        g.replay()
                        torch.cuda.synchronize()
                        self.verify(y1, self.reference(s1, n, dtype), dtype, f"two groups graph {dtype} x {n} replay {replay}: first")
                        self.verify(y2, self.reference(s2, n, dtype), dtype, f"two groups graph {dtype} x {n} replay {replay}: second")
                        # x1 is the first communicator's sum of y2: every rank's y2 is the same, so W times it.
                        want = y2.double() * self.world
                        self.verify(x1, want, dtype, f"two groups graph {dtype} x {n} replay {replay}: chained", True)
                    del g
        finally:
            other.close()

    def norm(self):
        """all_reduce_add_rms_norm on torch tensors, eagerly and in torch.cuda.graph replays with fresh inputs: r and
        y against float64 and the same bits on every rank and from every algorithm."""
        torch = self.torch
        for dtype in ["bf16", "fp16"]:
            for tokens, hidden in [(1, 4096), (7, 2050), (64, 8192)]:
                n = tokens * hidden
                w = self.inputs(self.next_seed(), self.world, hidden, dtype) + 0.5
                same = self.next_seed()

                def run(algorithm=None, graph=False):
                    seed = self.next_seed() if graph else same
                    x = self.inputs(seed, self.rank, n, dtype).view(tokens, hidden)
                    res0 = self.inputs(seed, self.world + 1, n, dtype).view(tokens, hidden)
                    r64 = self.reference(seed, n, dtype).view(tokens, hidden) + res0.double()
                    y64 = r64 / torch.sqrt((r64**2).mean(-1, keepdim=True) + 1e-5) * w.double()
                    res, out = res0.clone(), torch.full_like(x, float("nan"))
                    self.align()
                    if graph:
                        xs, ress = torch.zeros_like(x), torch.zeros_like(res)
                        g = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(g):
                            self.comm.all_reduce_add_rms_norm(xs, ress, w, 1e-5, out=out)
                        xs.copy_(x)
                        ress.copy_(res)
                        self.align()
                        g.replay()
                        torch.cuda.synchronize()
                        res = ress
                    else:
                        self.comm.all_reduce_add_rms_norm(x, res, w, 1e-5, out=out, algorithm=algorithm)
                    what = f"norm {dtype} {tokens}x{hidden} {algorithm or 'auto'}{' graph' if graph else ''}"
                    # r and y bounds: a few roundings (allreduce::check::add_rms_norm_tolerance).
                    for got, want, part in [(res, r64, "r"), (out, y64, "y")]:
                        err = (got.double() - want).abs()
                        tol = 6 * (HALF_ULP[dtype] + (self.world + 1) * 2.0**-23)
                        bad = int((~(err <= tol * want.abs() + 1e-30)).sum().item())
                        if bad:
                            self.fail(f"{what}: {part}: {bad} wrong")
                        self.checked += 1
                    return self.digest(res.flatten()), self.digest(out.flatten())
                bits = {a: run(a) for a in ["car_1shot", "car_2shot", "symm_ll", "symm_zc_2shot", None]}
                if len(set(bits.values())) != 1:
                    self.fail(f"norm {dtype} {tokens}x{hidden}: algorithms differ bitwise: {bits}")
                run(graph=True)

    def graph_capture(self):
        """Graphs captured inside comm.graph_capture(): the tensors are registered with every peer when the capture
        ends, so every replay reads and writes them in place (no copy was captured); fresh inputs per replay, out of
        place and in place, every residency's algorithm checked against the float64 reference; torch's caching
        allocator memory must be shareable (no fallback note)."""
        torch = self.torch
        notes_before = list(self.comm.notes)
        for dtype in self.dtypes:
            for n in self.sizes[::2]:
                x = torch.zeros(n, dtype=self.dtypes[dtype], device=self.device)
                y = torch.zeros_like(x)
                z = torch.zeros_like(x)
                g = torch.cuda.CUDAGraph()
                self.align()
                with self.comm.graph_capture():
                    with torch.cuda.graph(g):
                        self.comm.all_reduce(x, out=y)
                        self.comm.all_reduce(z)
                algorithm = self.comm.last_algorithm
                for replay in range(2):
                    seed, seed2 = self.next_seed(), self.next_seed()
                    x.copy_(self.inputs(seed, self.rank, n, dtype))
                    z.copy_(self.inputs(seed2, self.rank, n, dtype))
                    y.fill_(float("nan"))
                    self.align()
                    g.replay()
                    what = f"graph_capture {dtype} x {n} replay {replay} ({algorithm})"
                    self.verify(y, self.reference(seed, n, dtype), dtype, what)
                    self.verify(z, self.reference(seed2, n, dtype), dtype, what + " in place")
                del g
        fallbacks = [n for n in self.comm.notes if n not in notes_before and "graph capture" in n]
        if fallbacks:
            self.fail(f"graph_capture: torch tensors were not shared: {fallbacks}")

    def reduce_scatter(self):
        torch = self.torch
        for dtype in self.dtypes:
            for n in self.sizes[::3]:
                seed = self.next_seed()
                x = self.inputs(seed, self.rank, n, dtype)
                shard = torch.full((n // self.world,), float("nan"), dtype=self.dtypes[dtype], device=self.device)
                self.align()
                self.comm.reduce_scatter(x, shard)
                lo = self.rank * (n // self.world)
                self.verify(
                    shard,
                    self.reference(seed, n, dtype)[lo : lo + n // self.world],
                    dtype,
                    f"reduce_scatter {dtype} x {n}",
                    same_everywhere=False,
                )

    def registered(self):
        """The registered buffers through DLPack: input written there, zero-copy algorithms reading it in place."""
        torch = self.torch
        n = 1 << 20
        for dtype in self.dtypes:
            xin = torch.from_dlpack(self.comm.registered_input(dtype, n))
            xout = torch.from_dlpack(self.comm.registered_output(dtype, n))
            assert xin.device == torch.device(self.device) and xin.dtype == self.dtypes[dtype] and xin.numel() == n
            for algo in ZERO_COPY + [None]:
                seed = self.next_seed()
                xin.copy_(self.inputs(seed, self.rank, n, dtype))
                xout.fill_(float("nan"))
                self.align()
                self.comm.all_reduce(xin, out=xout, algorithm=algo)
                self.verify(xout, self.reference(seed, n, dtype), dtype, f"registered {dtype} {algo or 'auto'}")
            del xin, xout

    def register(self):
        """A torch tensor of the caller's, registered: calls on slices of it at the same offsets on every rank."""
        torch = self.torch
        n = 1 << 18
        mine = torch.empty(3 * n, dtype=torch.bfloat16, device=self.device)
        index = self.comm.register(mine)
        print(f"registered a torch tensor as registration {index}", flush=True)
        for algo in ZERO_COPY + [None]:
            seed = self.next_seed()
            mine[n : 2 * n].copy_(self.inputs(seed, self.rank, n, "bf16"))
            mine[2 * n :].fill_(float("nan"))
            self.align()
            self.comm.all_reduce(mine[n : 2 * n], out=mine[2 * n :], algorithm=algo)
            self.verify(mine[2 * n :], self.reference(seed, n, "bf16"), "bf16", f"register {algo or 'auto'}")

    def compiled(self):
        """allreduce_rs.ops under ``torch.compile(fullgraph=True)``: a row-parallel block (each rank's partial Linear,
        then the allreduce op with the Linear's bias added in the kernel, ReLU) compiled by Inductor with the default mode and with ``mode="reduce-overhead"``
        (CUDA graphs that torch's cudagraph trees record, then replay) gives the eager block's bits on fresh inputs
        at every call, the eager block through the op gives the plain call's, and both are near the float64 block;
        no graph may be skipped for CUDA graphs."""
        torch = self.torch
        import torch.nn.functional as F
        from torch._dynamo.utils import counters

        import allreduce_rs.ops as ops

        group = ops.register(self.comm)
        tokens, k, d_out = 128, 1024, 2048

        # The partial product is computed, and every rank's finished, before the block: with the ranks sharing one GPU
        # under MPS, a rank whose GEMM is queued behind its peers' collective kernels (spinning on every SM) cannot
        # get the SMs it needs, and they wait for it until their deadline (seen at 8 ranks). With a GPU per rank
        # the GEMM belongs in the block.
        def block(partial, b):
            return torch.relu(ops.all_reduce(partial, group, b))

        def plain(partial, b):
            return torch.relu(self.comm.all_reduce(partial, out=torch.empty_like(partial), bias=b))

        def bits(t):
            return t.view(torch.int16 if t.element_size() == 2 else torch.int32)

        for dtype in ["bf16", "fp32"]:
            for mode in [None, "reduce-overhead"]:
                fn = torch.compile(block, fullgraph=True, mode=mode)
                # The default mode's first call compiles; reduce-overhead's warms up, then records, then replays.
                for step in range(4):
                    sx, sw, sb = self.next_seed(), self.next_seed(), self.next_seed()
                    xs = [self.inputs(sx, r, tokens * k, dtype).view(tokens, k) for r in range(self.world)]
                    ws = [self.inputs(sw, r, d_out * k, dtype).view(d_out, k) for r in range(self.world)]
                    # About half the outputs negative, so the ReLU clips some.
                    b = self.inputs(sb, 0, d_out, dtype) * (-k * self.world / 4)
                    x, w = xs[self.rank], ws[self.rank]
                    what = f"compiled {dtype} mode={mode} step {step}"
                    partial = F.linear(x, w)
                    # The Linear's bias, one per output feature, as the elementwise bias the kernel adds.
                    bias = b.expand_as(partial).contiguous()
                    self.align()
                    eager = block(partial, bias)
                    self.align()
                    print(f"{what}: the op ran {self.comm.last_algorithm}", flush=True)
                    if not torch.equal(bits(eager), bits(plain(partial, bias))):
                        self.fail(f"{what}: the op differs from the plain call")
                    self.align()
                    got = fn(partial, bias).clone()
                    if not torch.equal(bits(got), bits(eager)):
                        self.fail(f"{what}: compiled differs from eager")
                    digests = self.comm.all_gather_bytes(struct.pack("q", self.digest(got.flatten())))
                    if len(set(digests)) != 1:
                        self.fail(f"{what}: ranks differ bitwise")
                    partials = sum(xr.double() @ wr.double().t() for xr, wr in zip(xs, ws))
                    want = torch.relu(partials + b.double())
                    # Each rank's partial product is rounded to the dtype before the sum (inputs are non-negative).
                    bound = (2.0**-6 if dtype == "bf16" else 2.0**-12) * (partials + b.double().abs())
                    if not ((got.double() - want).abs() <= bound).all():
                        self.fail(f"{what}: off the float64 block")
                    self.checked += 1
        skipped = counters["inductor"].get("cudagraph_skips", 0)
        if skipped:
            self.fail(f"compiled: {skipped} graph(s) skipped for CUDA graphs: {dict(counters['inductor'])}")

    def refusals(self):
        torch, ar = self.torch, self.ar
        cases = [
            (
                "float64",
                ar.ArgumentError,
                lambda: self.comm.all_reduce(torch.zeros(64, dtype=torch.float64, device=self.device)),
            ),
            (
                "non-contiguous",
                ar.ArgumentError,
                lambda: self.comm.all_reduce(torch.zeros(16, 16, device=self.device).t()),
            ),
            (
                "capacity",
                ar.CapacityError,
                lambda: self.comm.all_reduce(torch.zeros((1 << 24) + 1, device=self.device)),
            ),
            (
                "int32",
                ar.ArgumentError,
                lambda: self.comm.all_reduce(torch.zeros(64, dtype=torch.int32, device=self.device)),
            ),
        ]
        if self.host:
            cases.append(
                ("meta device", ar.ArgumentError, lambda: self.comm.all_reduce(torch.zeros(64, device="meta")))
            )
        else:
            cases.append(("cpu tensor", ar.ArgumentError, lambda: self.comm.all_reduce(torch.zeros(64))))
            cases.append(
                (
                    "misaligned",
                    ar.ArgumentError,
                    lambda: self.comm.all_reduce(torch.zeros(65, dtype=torch.bfloat16, device=self.device)[1:]),
                )
            )
        for what, error, call in cases:
            try:
                call()
                self.fail(f"refusals: {what} was not refused")
            except ar.AllreduceError as e:
                if type(e) is not error:
                    self.fail(f"refusals: {what}: {type(e).__name__} ({e}), not {error.__name__}")
                else:
                    print(f"refused {what}: {type(e).__name__}: {e}", flush=True)

    def run(self, only=None):
        scenarios = ["eager", "reduce_scatter", "refusals"]
        if not self.host:
            scenarios += ["graph", "graph_capture", "prepared", "registered", "register", "compiled", "two_groups", "norm"]
        else:
            scenarios += ["registered"]
        if only:
            unknown = set(only) - set(scenarios)
            if unknown:
                sys.exit(f"--only: {sorted(unknown)} not among {scenarios}")
            scenarios = [s for s in scenarios if s in only]
        for s in scenarios:
            before = len(self.failures)
            try:
                getattr(self, s)()
            except Exception:
                self.fail(f"{s}: {traceback.format_exc()}")
            if not self.host:
                self.torch.cuda.synchronize()
            print(f"{s}: {'ok' if len(self.failures) == before else 'FAILED'}", flush=True)
        counts = [struct.unpack("q", c)[0] for c in self.comm.all_gather_bytes(struct.pack("q", len(self.failures)))]
        if self.rank == 0:
            print(
                f"checked {self.checked} results on each of {self.world} ranks ({self.comm.backend}, "
                f"{self.comm.device_name}); failures by rank: {counts}",
                flush=True,
            )
        self.comm.close()
        return 1 if any(counts) else 0


def overhead(out):
    """The Python path's cost over comm-bench's auto (the communicator's public call) at 1024 elements, eager and in graph replays."""
    rows, lines = [], []
    lines.append("# Python path (allreduce_rs.bench) over comm-bench's `auto`, 1024 elements, bf16")
    lines.append("# time: slowest rank's time per call (events); issue: host time per call spent issuing the calls")
    lines.append(
        f"{'mode':<6} {'method':<12} {'time us':>9} {'issue us':>9} {'cb time us':>10} {'cb issue us':>11} "
        f"{'+time us':>9} {'+issue us':>9}"
    )
    for mode in ["eager", "graph"]:
        cb = {
            r["method"]: r
            for r in json.load(open(f"{out}/cb_{mode}/comm_ops_benchmark.json"))["rows"]
            if r["count"] == 1024 and r["status"] == "passed"
        }
        py = {
            r["method"]: r
            for r in json.load(open(f"{out}/py_{mode}.json"))["rows"]
            if r["count"] == 1024 and r["status"] == "passed"
        }
        base = cb.get("auto")
        if base is None:
            lines.append(f"{mode}: comm-bench's auto row is missing or failed")
            continue
        for method, r in sorted(py.items()):
            row = {
                "mode": mode,
                "method": method,
                "time_us": r["time_ms"] * 1e3,
                "issue_us": r["issue_us"],
                "cb_time_us": base["time_ms"] * 1e3,
                "cb_issue_us": base["issue_us"],
            }
            row["extra_time_us"] = row["time_us"] - row["cb_time_us"]
            row["extra_issue_us"] = row["issue_us"] - row["cb_issue_us"]
            rows.append(row)
            lines.append(
                f"{mode:<6} {method:<12} {row['time_us']:>9.2f} {row['issue_us']:>9.2f} {row['cb_time_us']:>10.2f} "
                f"{row['cb_issue_us']:>11.2f} {row['extra_time_us']:>+9.2f} {row['extra_issue_us']:>+9.2f}"
            )
    eager = [r for r in rows if r["mode"] == "eager" and r["method"] == "py"]
    if eager:
        e = eager[0]["extra_issue_us"]
        lines.append(
            f"goal: the Python path adds <= 1 us of issue time per eager call: {e:+.2f} us "
            f"({'met' if e <= 1.0 else 'NOT met'})"
        )
    graph = [r for r in rows if r["mode"] == "graph" and r["method"] == "py"]
    if graph:
        lines.append(
            f"graph replay: {graph[0]['extra_time_us']:+.2f} us per call over comm-bench's replay "
            f"(the Python path is not in a replay; only noise should remain)"
        )
    text = "\n".join(lines) + "\n"
    print(text, end="")
    open(f"{out}/overhead.txt", "w").write(text)
    json.dump(rows, open(f"{out}/overhead.json", "w"), indent=1)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["check"]:
        backend = sys.argv[sys.argv.index("--backend") + 1] if "--backend" in sys.argv else "cuda"
        only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
        sys.exit(Check(backend).run(only))
    if sys.argv[1:2] == ["overhead"] and len(sys.argv) == 3:
        sys.exit(overhead(sys.argv[2]))
    sys.exit(__doc__)
