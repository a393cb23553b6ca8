"""comm_bench.py's sweep through the Python path: ``python -m allreduce_rs.launch -n 8 -- python -m allreduce_rs.bench``
(or one rank per process under torchrun / mpirun / srun).

Sizes are comm_bench.py's: ``round_up(int(2**x), 256)`` (512 on ROCm) for ``--size_steps`` points of x in
``[--min_size, --max_size]``. Per size: each method's call checked exactly (rank r's element i is ``i % 7 + r``, so
every sum is an integer that bf16 holds), then the methods timed in rounds, as comm-bench times them (each one repeat
a round, in turn, so that a slow spell of the device falls on every method alike): per repeat warm-up calls, a
barrier so the ranks start together and ``--num_iters`` calls between two CUDA events on torch's current stream
(``--graph``: one replay of a graph of them, captured once; host driver: ``time.perf_counter``); the slowest rank's
time per call, median over repeats, and the host time spent issuing the calls (``issue_us``: what the Python path
adds per eager call).

Methods: ``py`` (``all_reduce(x, out=y)``), ``py_inplace`` (``all_reduce(x)``), ``py+reg`` (input and output in the
registered buffers, through DLPack), ``py_prepared`` (``prepare_all_reduce(x, out=y)`` once, then the prepared
call), ``py_capture`` (``--graph`` only: ``py`` captured inside ``comm.graph_capture()``, so replays read and write
the tensors in place on every rank), ``py_register`` (``--graph`` only: ``py`` on tensors passed to
``comm.register`` before the capture), ``py_op`` (GPU drivers only: ``allreduce_rs.ops.all_reduce_out(x,
group, y)``, the operator's function, which skips torch's dispatcher when called eagerly), ``py_torch_op`` (GPU
drivers only: ``torch.ops.allreduce_rs.all_reduce_out(x, group, y)`` through the dispatcher, as a graph compiled
without CUDA graphs calls it), ``py_rs``
(``reduce_scatter``; ``--op reduce_scatter``). In graph mode each output (but an in-place one, which each replay sums
again) is checked again after its method's last round. ``--output FILE`` writes the rows as JSON in comm-bench's row
format (method, count, bytes, status, time_ms, repeats_ms, issue_us).
"""

import argparse
import json
import struct
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import allreduce_rs as ar

ALLREDUCE_METHODS = ["py", "py_inplace", "py+reg", "py_prepared"]
# Graph mode only: the capture registered with every peer when it ends; the same tensors registered before capture.
GRAPH_METHODS = ["py_capture", "py_register"]
# GPU drivers only (torch tensors): the torch operator of allreduce_rs.ops.
TORCH_METHODS = ["py_op", "py_torch_op"]


def comm_bench_sizes(min_exp: float, max_exp: float, steps: int, align: int) -> List[int]:
    """comm_bench.py's counts: ``torch.logspace(min, max, steps, base=2)``, truncated, rounded up to ``align``."""
    xs = [min_exp + (max_exp - min_exp) * i / (steps - 1) for i in range(steps)] if steps > 1 else [min_exp]
    return [-(-int(2.0**x) // align) * align for x in xs]


def median(values: List[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


class Arrays:
    """Tensors of one kind: torch on a GPU driver, numpy on the host driver."""

    def __init__(self, comm: "ar.Communicator", dtype: str, graph: bool):
        self.comm, self.graph = comm, graph
        self.host = comm.backend == "host"
        if self.host:
            import numpy as np

            if graph:
                sys.exit("--graph needs a GPU driver (the host driver's calls are not captured)")
            if dtype == "bf16":
                import ml_dtypes

                self.np_dtype = np.dtype(ml_dtypes.bfloat16)
            else:
                self.np_dtype = np.dtype({"fp16": np.float16, "fp32": np.float32}[dtype])
            self.np = np
        else:
            import torch

            torch.cuda.set_device(comm.device)
            self.torch = torch
            self.t_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        self.dtype = dtype

    def align(self):
        """Every rank's own GPU work done before any rank issues a collective: ranks sharing a GPU (MPS) share its
        SMs, and a rank's other kernels crawl while its peers' kernels spin on a collective's flags."""
        if not self.host:
            self.torch.cuda.synchronize()
        self.comm.barrier()

    def pattern(self, count: int, rank: int):
        """Rank ``rank``'s input: element i is ``i % 7 + rank``."""
        if self.host:
            return (self.np.arange(count) % 7 + rank).astype(self.np_dtype)
        t = self.torch.arange(count, device=f"cuda:{self.comm.device}") % 7 + rank
        return t.to(self.t_dtype)

    def empty(self, count: int):
        if self.host:
            return self.np.full(count, self.np.nan, self.np_dtype)
        return self.torch.full((count,), float("nan"), dtype=self.t_dtype, device=f"cuda:{self.comm.device}")

    def registered(self, which: str, count: int):
        buf = getattr(self.comm, f"registered_{which}")
        if self.host:
            # numpy has no bfloat16 of its own: a bf16 buffer is viewed as fp16 and reinterpreted.
            as_numpy = "fp16" if self.dtype == "bf16" else self.dtype
            return self.np.from_dlpack(buf(as_numpy, count)).view(self.np_dtype)
        return self.torch.from_dlpack(buf(self.dtype, count))

    def wrong(self, got, want) -> int:
        """Elements of ``got`` (any kind) that differ from ``want`` (a list-like of exact values)."""
        if self.host:
            return int((got.astype(self.np.float64) != want).sum())
        return int((got.double() != want).sum().item())

    def expected(self, lo: int, hi: int, world: int):
        """Elements [lo, hi) of the sum of every rank's pattern: ``world * (i % 7) + world * (world - 1) / 2``."""
        base = world * (world - 1) // 2
        if self.host:
            return (self.np.arange(lo, hi) % 7) * world + base
        return ((self.torch.arange(lo, hi, device=f"cuda:{self.comm.device}") % 7) * world + base).double()


class Timer:
    """The slowest rank's time per call and issue time per call, timed as comm-bench times (``measure::timing``)."""

    def __init__(self, arrays: Arrays, iters: int, warmup: int, repeats: int):
        self.a, self.iters, self.warmup, self.repeats = arrays, iters, warmup, repeats

    def ready(self, call: Callable[[], None], register_capture: bool = False) -> Callable[[], Tuple[float, float]]:
        """``call`` ready to time one repeat at a time (captured once in graph mode): a function that runs the
        warm-up, then one repeat, and returns the slowest rank's milliseconds and seconds of issue per call."""
        comm, a = self.a.comm, self.a
        replay = call
        if a.graph:
            torch = a.torch
            # Warm up on a side stream before capture, as torch.cuda.graph asks.
            a.align()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                call()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            if register_capture:
                with comm.graph_capture():
                    with torch.cuda.graph(graph):
                        for _ in range(self.iters):
                            call()
            else:
                with torch.cuda.graph(graph):
                    for _ in range(self.iters):
                        call()

            def replay():
                graph.replay()

        def repeat() -> Tuple[float, float]:
            a.align()
            for _ in range(self.warmup if not a.graph else max(1, -(-self.warmup // self.iters))):
                replay()
            if a.host:
                comm.barrier()
                t0 = time.perf_counter()
                for _ in range(self.iters):
                    call()
                issue = (time.perf_counter() - t0) / self.iters
                ms = issue * 1e3
            else:
                torch = a.torch
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                comm.barrier()
                start.record()
                t0 = time.perf_counter()
                if a.graph:
                    replay()
                else:
                    for _ in range(self.iters):
                        call()
                issue = (time.perf_counter() - t0) / self.iters
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end) / self.iters
            everyone = [struct.unpack("dd", b) for b in comm.all_gather_bytes(struct.pack("dd", ms, issue))]
            return max(t for t, _ in everyone), max(i for _, i in everyone)

        return repeat


class Pending:
    """A method whose check passed, between its rounds of timing: ``repeat`` times one repeat, ``recheck`` (graph
    mode, an output apart from the input) checks the output again after the last one."""

    def __init__(
        self,
        row: Dict,
        repeat: Callable[[], Tuple[float, float]],
        recheck: Optional[Callable[[], Optional[Dict]]],
    ):
        self.row, self.repeat, self.recheck = row, repeat, recheck
        self.times: List[float] = []
        self.issues: List[float] = []
        self.algorithm = None
        self.done: Optional[Dict] = None

    def finish(self) -> Dict:
        """Its row, after its last round."""
        failed = self.recheck() if self.recheck else None
        if failed:
            return failed
        time_ms = median(self.times)
        return {
            **self.row,
            "status": "passed",
            "algorithm": self.algorithm,
            "time_ms": time_ms,
            "repeats_ms": self.times,
            "issue_us": median(self.issues) * 1e6,
            "algbw_gbs": self.row["bytes"] / (time_ms * 1e-3) / 1e9,
        }


def check_method(method: str, count: int, arrays: Arrays, timer: Timer, op: str):
    """One call of ``method`` checked exactly: its row, where it is skipped or failed, else a ``Pending`` to time."""
    comm = arrays.comm
    rank, world = comm.rank, comm.world_size
    row = {
        "method": method,
        "op": op,
        "dtype": arrays.dtype,
        "count": count,
        "bytes": count * (4 if arrays.dtype == "fp32" else 2),
    }
    if method in TORCH_METHODS and arrays.host:
        return {**row, "status": "skipped", "reason": "the torch operator takes torch tensors (a GPU driver)"}
    if row["bytes"] > comm.capacity_bytes:
        return {**row, "status": "skipped", "reason": f"beyond capacity_bytes={comm.capacity_bytes}"}
    if method == "py_rs":
        if count % world:
            return {**row, "status": "skipped", "reason": f"{count} does not divide among {world} ranks"}
        x, y = arrays.pattern(count, rank), arrays.empty(count // world)

        def call():
            comm.reduce_scatter(x, y)

        lo, hi = rank * count // world, (rank + 1) * count // world
    else:
        if method == "py+reg":
            x, y = arrays.registered("input", count), arrays.registered("output", count)
            x[:] = arrays.pattern(count, rank)
        else:
            x = arrays.pattern(count, rank)
            y = x if method == "py_inplace" else arrays.empty(count)
            if method == "py_register":
                comm.register(x)
                comm.register(y)

        def call():
            comm.all_reduce(x, out=y)

        if method in TORCH_METHODS:
            import torch

            from . import ops

            group = ops.register(comm, "bench")
            op = ops.all_reduce_out if method == "py_op" else torch.ops.allreduce_rs.all_reduce_out

            def call():
                op(x, group, y)

        if method == "py_prepared":
            call = comm.prepare_all_reduce(x, out=y)

        lo, hi = 0, count

    def wrong_by_rank() -> Dict[int, int]:
        arrays.align()
        wrong = arrays.wrong(y, arrays.expected(lo, hi, world))
        verdicts = [struct.unpack("q", v)[0] for v in comm.all_gather_bytes(struct.pack("q", wrong))]
        return {r: v for r, v in enumerate(verdicts) if v}

    arrays.align()
    call()
    bad = wrong_by_rank()
    if bad:
        return {**row, "status": "failed", "reason": f"wrong elements by rank: {bad}"}

    def recheck() -> Optional[Dict]:
        # The replays computed the same sums into the same output (in place, each replay sums the last one's sums).
        bad = wrong_by_rank()
        if not bad:
            return None
        return {**row, "status": "failed", "reason": f"after the replays, wrong elements by rank: {bad}"}

    repeat = timer.ready(call, register_capture=method == "py_capture")
    pending = Pending(row, repeat, recheck if arrays.graph and y is not x else None)
    if arrays.graph:
        # The algorithm the capture chose (replays issue nothing the communicator sees).
        pending.algorithm = comm.last_algorithm
    return pending


def measure_size(methods: List[str], count: int, arrays: Arrays, timer: Timer, op: str) -> List[Dict]:
    """Every method at one size: each checked, then those that passed timed in rounds (each one repeat a round, in
    turn, so that a slow spell of the device falls on every method alike), each finished after its last round. The
    rows in method order."""
    checked = [check_method(m, count, arrays, timer, op) for m in methods]
    pending = [c for c in checked if isinstance(c, Pending)]
    rounds = timer.repeats
    for r in range(rounds):
        for p in pending:
            ms, issue = p.repeat()
            p.times.append(ms)
            p.issues.append(issue)
            if not arrays.graph:
                p.algorithm = arrays.comm.last_algorithm
            if r == rounds - 1:
                p.done = p.finish()
    return [c.done if isinstance(c, Pending) else c for c in checked]


def main(args: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m allreduce_rs.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="auto", choices=["auto", "host", "cuda", "hip"])
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--op", default="allreduce", choices=["allreduce", "reduce_scatter"])
    p.add_argument("--methods", help=f"comma-separated, of {', '.join(ALLREDUCE_METHODS)} (allreduce) [all]")
    p.add_argument("--min_size", type=float, default=10)
    p.add_argument("--max_size", type=float, default=24)
    p.add_argument("--size_steps", type=int, default=20)
    p.add_argument("--counts", help="exact element counts instead of the sweep, e.g. 1024,65536")
    p.add_argument("--num_iters", type=int, default=20)
    p.add_argument("--num_warmup_iters", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--graph", action="store_true", help="time replays of a captured graph of the calls")
    p.add_argument("--capacity_bytes", type=int, help="the communicator's capacity [the largest message]")
    p.add_argument("--timeout_s", type=float)
    p.add_argument(
        "--side_stream",
        action="store_true",
        help="issue on a torch.cuda.Stream of its own rather than torch's default (the legacy NULL stream), as "
        "comm-bench issues on its own stream",
    )
    p.add_argument("--output", help="write the rows to this JSON file (rank 0)")
    opts = p.parse_args(args)
    if opts.repeats < 1 or opts.num_iters < 1 or opts.num_warmup_iters < 0:
        p.error("--repeats and --num_iters take at least 1, --num_warmup_iters at least 0")
    elem = 4 if opts.dtype == "fp32" else 2
    known = ["py_rs"] if opts.op == "reduce_scatter" else ALLREDUCE_METHODS + (GRAPH_METHODS if opts.graph else [])
    if opts.op != "reduce_scatter" and opts.backend != "host":
        known += TORCH_METHODS
    methods = opts.methods.split(",") if opts.methods else known
    unknown = [m for m in methods if m not in known]
    if unknown:
        p.error(f"unknown method(s) for --op {opts.op}{' without --graph' if not opts.graph else ''}: {unknown}")
    if opts.counts:
        counts = [int(c) for c in opts.counts.split(",")]
    else:
        align = 512 if opts.backend == "hip" else 256
        counts = comm_bench_sizes(opts.min_size, opts.max_size, opts.size_steps, align)
    capacity = opts.capacity_bytes or max(counts) * elem
    comm = ar.Communicator.from_env(capacity_bytes=capacity, backend=opts.backend, timeout_s=opts.timeout_s)
    if opts.backend == "auto" and comm.backend == "hip" and not opts.counts:
        counts = comm_bench_sizes(opts.min_size, opts.max_size, opts.size_steps, 512)
    arrays = Arrays(comm, opts.dtype, opts.graph)
    timer = Timer(arrays, opts.num_iters, opts.num_warmup_iters, opts.repeats)
    rank0 = comm.rank == 0
    if rank0:
        mode = "graph replays" if opts.graph else "eager calls"
        print(
            f"# allreduce_rs {ar.__version__}: {opts.op}, {opts.dtype}, {comm.world_size} ranks, {comm.backend} "
            f"({comm.device_name}), {mode}; time = slowest rank, median of {opts.repeats}"
        )
        for residency in ["caller", "registered", "caller_registered"]:
            print(f"# {residency} table: {comm.table_source('graph' if opts.graph else 'eager', residency)}")
        header = f"{'N':>10} {'bytes':>10}" + "".join(f" {m + ' us':>14} {'issue us':>9}" for m in methods)
        print(header + "  algorithm")
    if opts.side_stream and not arrays.host:
        import torch

        torch.cuda.set_stream(torch.cuda.Stream())
    rows = []
    for count in counts:
        line = f"{count:>10} {count * elem:>10}"
        algorithm = "-"
        for m, row in zip(methods, measure_size(methods, count, arrays, timer, opts.op)):
            rows.append(row)
            if row["status"] == "passed":
                line += f" {row['time_ms'] * 1e3:>14.2f} {row['issue_us']:>9.2f}"
                algorithm = row["algorithm"] if algorithm == "-" else algorithm
            else:
                line += f" {row['status']:>14} {'':>9}"
                if row["status"] == "failed" and rank0:
                    print(f"# {m} at {count}: {row['reason']}", file=sys.stderr)
        if rank0:
            print(line + f"  {algorithm}", flush=True)
    failed = [r for r in rows if r["status"] == "failed"]
    if rank0 and opts.output:
        with open(opts.output, "w") as f:
            json.dump(
                {
                    "world": comm.world_size,
                    "backend": comm.backend,
                    "device": comm.device_name,
                    "graph": opts.graph,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    comm.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
