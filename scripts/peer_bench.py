#!/usr/bin/env python3
"""The peers of comm-bench, measured the way comm-bench measures its own methods.

Three PyTorch allreduces, and upstream FBGEMM's car where its source is given, bf16 sum, on the sizes, warm-up,
iteration count and CSV columns of FBGEMM's comm_bench.py (and so of comm-bench):

  fbgemm_car_1shot  (CSV `fbgemm_1shot`)  torch.ops.fbgemm.one_shot_car_allreduce(dst, src)    (--fbgemm_src only)
  torch_symm_1shot  (CSV `symm_1shot`)    torch.ops.symm_mem.one_shot_all_reduce_copy_out(buf, src, "sum", group, dst)
  fbgemm_car_2shot  (CSV `fbgemm_2shot`)  torch.ops.fbgemm.two_shot_car_allreduce(dst, src)    (--fbgemm_src only)
  torch_symm_2shot  (CSV `symm_2shot`)    buf.copy_(src)
                                          torch.ops.symm_mem.two_shot_all_reduce_out(buf, "sum", group, dst)
  torch_nccl        (CSV `nccl`)          torch.distributed.all_reduce on the NCCL backend

The symmetric buffer is comm_bench.py's: symm_mem.empty(max N, bf16) + symm_mem.rendezvous(buf, group), and the
symm calls are comm_bench.py's, copy-in included. What this adds over comm_bench.py, as comm-bench does:

  * every method's result is checked against a float64 reference before timing and after the timed calls; a
    method that fails is reported as failed and not timed;
  * ranks are aligned (device sync + barrier) before the start event; each rank times between its own events;
    the figure is the slowest rank's (MAX all-reduce of the times), the median over --repeats;
  * --graph captures the --num_iters calls into one torch.cuda.CUDAGraph and times its replays;
  * a method that cannot run (symm_mem missing or refusing, NCCL with ranks sharing a GPU) is reported as skipped
    with the reason instead of stopping the sweep.

The check. Each rank's input is torch.rand(N, bf16) from a CPU torch.Generator seeded with (--seed, N, rank), so
every rank can regenerate every other rank's input and sum all of them in float64 on its GPU: the whole output is
compared, at every size, and no collective is involved in building the reference. NCCL and torch's symm_mem
kernels add bf16 values pairwise and round each partial sum to bf16 (comm-bench's kernels accumulate in f32 and
round once), so the bound is (W-1) bf16 roundings of at most half an ulp each, relative to the result (the inputs
are positive, so no partial sum exceeds it), plus comm-bench's float slack: |out - ref| <= tol * |ref| with
tol = max(1, W-1) * 2^-8 + W * 2^-23. A missing peer contribution is ~2/W relative and fails most elements.

NCCL. By default (--nccl_mode inplace) the timed call is dist.all_reduce(dst) in place on the previous result:
that is the NCCL kernel alone, as comm_bench.py's out-of-place fbgemm nccl_allreduce, with no copy (the values
grow W-fold per call and saturate at inf, which does not change NCCL's data-independent kernels). Its checks run
on a fresh copy of the input. --nccl_mode copy times dst.copy_(src); dist.all_reduce(dst) instead, whose output
after the timed calls is checkable, as torch's functional all_reduce does it.

Upstream car. With --fbgemm_src DIR (a copy of FBGEMM's tree holding at least fbgemm_gpu/include and
fbgemm_gpu/experimental/gen_ai/src/comm; a GPU node without network gets one carried in an ignored folder), rank 0
builds car.cu and car.cpp from there as a torch extension (torch.utils.cpp_extension, nvcc and ninja, NCCL's headers
from torch's nvidia-nccl package) into --fbgemm_build, the other ranks load that build, and every rank sets car up as
comm_bench.py's _setup does (car_tensor buffers, IPC handles exchanged over the gloo group, car_init); the peers wait
for the build within --timeout_s, so a first build (minutes of nvcc) wants it raised. Upstream runs
2, 4 or 8 ranks and counts that divide as its kernels need; a size or world it refuses is reported as skipped.
Its kernels spin without a deadline, so a rank that never arrives hangs the others: bound the run from outside
(timeout(1)), and on a GPU shared under MPS expect the MPS server to need a restart after such a kill.

Launch: under torchrun (`torchrun --nproc_per_node W scripts/peer_bench.py ...`), or by itself with
`--num_ranks W` (torch.multiprocessing, like comm_bench.py's elastic_launch; without torchrun and without
--num_ranks it starts one rank per visible GPU). Rank r uses GPU r % device_count. Rank 0 writes
peer_ops_benchmark.csv and peer_ops_benchmark.json into --output_dir.

Everything that needs torch is imported inside the functions that use it, so the pure parts (sizes, statistics,
CSV and JSON) import and test without torch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import time
from typing import Any, Optional

# Never NVLink multicast (NVLS): it can take a shared host's GPUs out of service. Set before torch.distributed
# or NVSHMEM initialise anything, and inherited by the ranks this script spawns.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

ELEM_SIZE = 2  # bf16
DTYPE = "bf16"
OP = "allreduce"

# (JSON method name, comm_bench.py CSV column), in comm_bench.py's column order.
METHODS = [
    ("fbgemm_car_1shot", "fbgemm_1shot"),
    ("torch_symm_1shot", "symm_1shot"),
    ("fbgemm_car_2shot", "fbgemm_2shot"),
    ("torch_symm_2shot", "symm_2shot"),
    ("torch_nccl", "nccl"),
]
# Upstream car's methods, which need --fbgemm_src.
FBGEMM_METHODS = ("fbgemm_car_1shot", "fbgemm_car_2shot")
# What --fbgemm_src must hold, relative to it.
FBGEMM_INCLUDE = os.path.join("fbgemm_gpu", "include")
FBGEMM_CAR_SOURCES = tuple(os.path.join("fbgemm_gpu", "experimental", "gen_ai", "src", "comm", f)
                           for f in ("car.cu", "car.cpp"))
CSV_NAME = "peer_ops_benchmark.csv"
JSON_NAME = "peer_ops_benchmark.json"


# ---------------------------------------------------------------------------------------------------------------
# Pure parts: no torch.
# ---------------------------------------------------------------------------------------------------------------


def round_up(a: int, b: int) -> int:
    return (a + b - 1) // b * b


def comm_bench_sizes(min_exp: float, max_exp: float, steps: int, align: int) -> list[int]:
    """comm_bench.py's N list: round_up(int(2**x), align) for `steps` points of x evenly spaced in [min, max].

    Computed in float64, as comm-bench (crates/comm-bench/src/sizes.rs) does; comm_bench.py's torch.logspace is float32,
    which gives the same list for the default sweep (run_rank cross-checks it against torch.logspace and warns).
    """
    lo, hi = float(min_exp), float(max_exp)
    xs = [lo] if steps == 1 else [lo + (hi - lo) * i / (steps - 1) for i in range(steps)]
    return [round_up(int(2.0**x), align) for x in xs]


def median(values: list[float]) -> float:
    """Median, the mean of the middle two for an even count (as comm-bench); NaN for none."""
    s = sorted(values)
    if not s:
        return math.nan
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def bwidth_gbs(count: int, time_ms: float, elem_size: int = ELEM_SIZE) -> float:
    """comm_bench.py's `bwidth` (= comm-bench's algbw): input bytes / time, GB/s."""
    return count * elem_size / (time_ms * 1e-3) / 1e9


def busbw_factor(world: int) -> float:
    """nccl-tests' allreduce bus-bandwidth factor, 2(W-1)/W."""
    return 2 * (world - 1) / world


def check_tolerance(world: int) -> float:
    """Relative error bound of a peer's bf16 sum of `world` inputs (see the module docstring)."""
    return max(1, world - 1) * 2.0**-8 + world * 2.0**-23


def input_seed(seed: int, count: int, rank: int) -> int:
    """The CPU generator seed of `rank`'s input at `count` elements: every rank can compute every rank's."""
    return ((seed * 1_000_003 + count) * 1_009 + rank) % 2**63


def make_row(method: str, count: int, world: int, status: str, reason: Optional[str] = None,
             repeats_ms: Optional[list[float]] = None, rank0_ms: Optional[float] = None) -> dict[str, Any]:
    """A row of comm-bench's JSON (report.rs `Row`): `reason` only for failed/skipped, timings only when passed."""
    assert status in ("passed", "failed", "skipped"), status
    row: dict[str, Any] = {"method": method, "op": OP, "dtype": DTYPE, "count": count, "bytes": count * ELEM_SIZE,
                           "status": status}
    if status != "passed":
        row["reason"] = reason or ""
    row.update(time_ms=None, repeats_ms=[], rank0_ms=None, algbw_gbs=None, busbw_gbs=None)
    if status == "passed" and repeats_ms:
        t = median(repeats_ms)
        algbw = bwidth_gbs(count, t)
        row.update(time_ms=t, repeats_ms=list(repeats_ms), rank0_ms=rank0_ms, algbw_gbs=algbw,
                   busbw_gbs=algbw * busbw_factor(world))
    return row


def csv_text(rows: list[dict[str, Any]]) -> str:
    """comm_bench.py's CSV: N, then <column>_time (ms) and <column>_bwidth (GB/s) per method that has rows, in
    comm_bench.py's order; a method that did not pass leaves its cells empty (the JSON says why)."""
    present = {r["method"] for r in rows}
    columns = [(m, c) for m, c in METHODS if m in present]
    out = ["N" + "".join(f",{c}_time,{c}_bwidth" for _, c in columns)]
    counts: list[int] = []
    for r in rows:
        if r["count"] not in counts:
            counts.append(r["count"])
    for n in counts:
        line = str(n)
        for method, _ in columns:
            row = next((r for r in rows if r["count"] == n and r["method"] == method), None)
            if row and row["status"] == "passed" and row["time_ms"] is not None:
                line += f",{row['time_ms']!r},{row['algbw_gbs']!r}"
            else:
                line += ",,"
        out.append(line)
    return "\n".join(out) + "\n"


def outcome(meta: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """comm-bench's JSON (report.rs `Outcome`) plus the peers' versions: `meta` carries driver, device, arch, world,
    graph, num_iters, num_warmup_iters, repeats, torch_version, nccl_version and the like."""
    doc: dict[str, Any] = {"driver": None, "device": None, "arch": None, "world": None, "op": OP, "dtype": DTYPE,
                           "graph": False, "num_iters": None, "num_warmup_iters": None, "repeats": None,
                           "unix_time": int(time.time()),
                           # comm-bench measures its ceilings with its own kernels; the peers have none to offer.
                           "ceilings": None}
    doc.update(meta)
    doc["rows"] = rows
    return doc


def write_outputs(out_dir: str, doc: dict[str, Any]) -> tuple[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    csv_path, json_path = os.path.join(out_dir, CSV_NAME), os.path.join(out_dir, JSON_NAME)
    with open(csv_path, "w") as f:
        f.write(csv_text(doc["rows"]))
    with open(json_path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    return csv_path, json_path


def format_row(row: dict[str, Any]) -> str:
    """One line of the nccl-tests-style table comm-bench prints."""
    def fmt(v: Optional[float], scale: float = 1.0) -> str:
        return "-" if v is None else f"{v * scale:.2f}"
    status = {"passed": "ok", "failed": f"FAILED: {row.get('reason')}", "skipped": f"skipped: {row.get('reason')}"}
    return (f"  {row['bytes']:>12} {row['count']:>10} {row['dtype']:>5} {row['method']:>16} "
            f"{fmt(row['time_ms'], 1e3):>11} {fmt(row['algbw_gbs']):>11} {fmt(row['busbw_gbs']):>11}  "
            f"{status[row['status']]}")


def table_header() -> str:
    return (f"# {'size(B)':>12} {'count':>10} {'type':>5} {'method':>16} {'time(us)':>11} {'algbw(GB/s)':>11} "
            f"{'busbw(GB/s)':>11}  status")


def fbgemm_car_paths(src: str) -> tuple[list[str], str]:
    """The car sources and the include folder in FBGEMM tree `src`; ValueError naming what is missing."""
    sources = [os.path.join(src, f) for f in FBGEMM_CAR_SOURCES]
    include = os.path.join(src, FBGEMM_INCLUDE)
    missing = [p for p in sources if not os.path.isfile(p)] + ([] if os.path.isdir(include) else [include])
    if missing:
        raise ValueError(f"--fbgemm_src {src!r} is not an FBGEMM tree: missing {', '.join(missing)}")
    return sources, include


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output_dir", "--output-dir", default="/tmp", help="where rank 0 writes the CSV and JSON")
    p.add_argument("--export_csv", "--export-csv", action="store_true",
                   help="accepted for comm_bench.py compatibility; the CSV and JSON are always written")
    p.add_argument("--num_ranks", "--num-ranks", type=int, default=None,
                   help="launch this many ranks here (ignored under torchrun)")
    p.add_argument("--num_iters", "--num-iters", type=int, default=20)
    p.add_argument("--num_warmup_iters", "--num-warmup-iters", type=int, default=10)
    p.add_argument("--min_size", "--min-size", type=int, default=10, help="smallest size is 2**min_size")
    p.add_argument("--max_size", "--max-size", type=int, default=24, help="largest size is 2**max_size")
    p.add_argument("--size_steps", "--size-steps", type=int, default=20)
    p.add_argument("--op", choices=[OP], default=OP, help="allreduce only")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats; the median is reported")
    p.add_argument("--graph", action="store_true", help="capture the timed calls into a CUDA graph, time replays")
    p.add_argument("--methods", default=None,
                   help="comma-separated subset of " + ", ".join(m for m, _ in METHODS)
                   + " [default: all; upstream car's only with --fbgemm_src]")
    p.add_argument("--fbgemm_src", "--fbgemm-src", default=None,
                   help="an FBGEMM tree: build its car (fbgemm_gpu/experimental/gen_ai/src/comm) and time it")
    p.add_argument("--fbgemm_build", "--fbgemm-build", default="/tmp/peer_bench_fbgemm_car",
                   help="where rank 0 builds upstream car (reused when the sources are unchanged)")
    p.add_argument("--nccl_mode", "--nccl-mode", choices=["inplace", "copy"], default="inplace",
                   help="time all_reduce(dst) alone, or dst.copy_(src) + all_reduce(dst)")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs")
    p.add_argument("--timeout_s", "--timeout-s", type=float, default=300.0,
                   help="how long a rank waits for its peers in the store and in gloo collectives")
    args = p.parse_args(argv)
    known = [m for m, _ in METHODS]
    if args.methods is None:
        names = [m for m in known if args.fbgemm_src or m not in FBGEMM_METHODS]
    else:
        names = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in names if m not in known]
    if bad:
        p.error(f"unknown method(s) {bad}; known: {', '.join(known)}")
    if args.fbgemm_src is None and any(m in FBGEMM_METHODS for m in names):
        p.error("fbgemm_car_* need --fbgemm_src (a copy of FBGEMM's tree to build upstream car from)")
    if args.fbgemm_src is not None:
        try:
            fbgemm_car_paths(args.fbgemm_src)
        except ValueError as e:
            p.error(str(e))
    if args.num_iters < 1 or args.repeats < 1 or args.num_warmup_iters < 0 or args.size_steps < 1:
        p.error("--num_iters, --repeats and --size_steps must be >= 1, --num_warmup_iters >= 0")
    args.methods = [m for m in known if m in names]  # comm_bench.py's order whatever the flag's
    return args


# ---------------------------------------------------------------------------------------------------------------
# The torch parts: imported lazily.
# ---------------------------------------------------------------------------------------------------------------


class _Ctx:
    """One rank's state: torch modules, device, process groups, the symmetric buffer."""

    def __init__(self, args: argparse.Namespace):
        import torch
        import torch.distributed as dist
        from datetime import timedelta

        self.torch, self.dist, self.args = torch, dist, args
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        ndev = torch.cuda.device_count()
        if ndev == 0:
            raise RuntimeError("no GPU visible")
        self.device = torch.device("cuda", local_rank % ndev)
        torch.cuda.set_device(self.device)
        # comm_bench.py's backends. No device_id: NCCL's communicator is created lazily, by the first NCCL call,
        # so a run whose ranks share a GPU (where NCCL refuses) still gets its symm_mem rows.
        dist.init_process_group(backend="cpu:gloo,cuda:nccl", timeout=timedelta(seconds=args.timeout_s))
        self.group = dist.group.WORLD
        # Barriers, times and verdicts go through a gloo-only group, so they never touch NCCL or the GPU stream.
        self.ctl = dist.new_group(backend="gloo")
        # Ranks reading and writing CPU tensors concurrently: do not let each take every core.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.world))
        devices = self.all_gather((socket.gethostname(), self.device.index))
        self.gpus_shared = len(set(devices)) < self.world
        self.symm_buffer = None
        self.fbgemm_car: Any = None

    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        self.dist.all_gather_object(out, obj, group=self.ctl)
        return out

    def agree(self, error: Optional[str]) -> Optional[str]:
        """Every rank learns every rank's error; all return the first one (so all skip or fail together)."""
        for r, e in enumerate(self.all_gather(error)):
            if e is not None:
                return e if self.world == 1 else f"rank {r}: {e}"
        return None

    def barrier(self) -> None:
        self.dist.barrier(group=self.ctl)

    def max_over_ranks(self, value: float) -> float:
        t = self.torch.tensor([value], dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=self.ctl)
        return float(t.item())


def _exc_text(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text.splitlines()[0][:500] if text else type(e).__name__


def _setup_symm(ctx: _Ctx, capacity: int) -> Optional[str]:
    """comm_bench.py's get_symm_buffer; returns why not, agreed by all ranks."""
    err = None
    try:
        import torch.distributed._symmetric_memory as symm_mem

        ops = ctx.torch.ops.symm_mem
        for op in ("one_shot_all_reduce_copy_out", "two_shot_all_reduce_out"):
            if not hasattr(ops, op):
                raise RuntimeError(f"torch.ops.symm_mem.{op} is not available")
        buf = symm_mem.empty(capacity, device=ctx.device, dtype=ctx.torch.bfloat16)
        symm_mem.rendezvous(buf, group=ctx.group)
        ctx.symm_buffer = buf
    except Exception as e:  # noqa: BLE001 - any refusal becomes a skip reason
        err = f"symm_mem: {_exc_text(e)}"
    return ctx.agree(err)


def _nccl_build_flags() -> tuple[list[str], list[str]]:
    """Include and link flags for NCCL from torch's nvidia-nccl package (car.cpp includes c10d's NCCL utilities);
    none where the package is absent (a system NCCL then has to be on the default paths)."""
    try:
        import nvidia.nccl  # the wheel torch's CUDA builds depend on

        root = list(nvidia.nccl.__path__)[0]
    except ImportError:
        return [], ["-lnccl"]
    lib = os.path.join(root, "lib")
    names = sorted(f for f in os.listdir(lib) if f.startswith("libnccl.so")) if os.path.isdir(lib) else []
    link = [f"-L{lib}", f"-l:{names[0]}", f"-Wl,-rpath,{lib}"] if names else ["-lnccl"]
    return [os.path.join(root, "include")], link


def _setup_fbgemm_car(ctx: _Ctx) -> Optional[str]:
    """Builds (rank 0) and loads (every rank) upstream car from --fbgemm_src, then sets it up as comm_bench.py's
    _setup does; returns why not, agreed by all ranks."""
    args, torch = ctx.args, ctx.torch
    err = None
    if ctx.rank == 0:
        try:
            _load_fbgemm_car(args, verbose=True)
        except Exception as e:  # noqa: BLE001 - a build that fails becomes a skip reason
            err = f"building upstream car: {_exc_text(e)}"
    err = ctx.agree(err)
    if err is None:
        try:
            if ctx.rank != 0:
                _load_fbgemm_car(args, verbose=False)
            ops = torch.ops.fbgemm
            buffer, barrier = ops.car_tensor(), ops.car_tensor()
            barrier.zero_()
            torch.cuda.synchronize()
            # The handles go over the gloo group: NCCL refuses ranks that share a GPU.
            handles = []
            for t in (buffer, barrier):
                mine = ops.car_ipc_handle(t).cpu()
                handles.append([torch.tensor(h, dtype=torch.int8) for h in ctx.all_gather(mine.tolist())])
            ops.car_init(ctx.rank, ctx.world, barrier, handles[1], buffer, handles[0])
            ctx.fbgemm_car = (buffer, barrier)  # kept for the run: peers map them
        except Exception as e:  # noqa: BLE001
            err = f"upstream car: {_exc_text(e)}"
    return ctx.agree(err)


def _load_fbgemm_car(args: argparse.Namespace, verbose: bool) -> None:
    from torch.utils.cpp_extension import load

    sources, include = fbgemm_car_paths(args.fbgemm_src)
    nccl_include, nccl_link = _nccl_build_flags()
    os.makedirs(args.fbgemm_build, exist_ok=True)
    load(name="fbgemm_car_upstream", sources=sources, extra_include_paths=[include, *nccl_include],
         extra_cflags=["-O3", "-DUSE_C10D_NCCL"], extra_cuda_cflags=["-O3", "-DUSE_C10D_NCCL"],
         extra_ldflags=nccl_link, build_directory=args.fbgemm_build, is_python_module=False, verbose=verbose)


class _Method:
    """A peer: `call(src, dst)` is one timed call; `prepare(src, dst)` makes dst ready for a checked call."""

    # Whether dst after the timed calls holds the allreduce of src (so it can be checked as it is).
    timed_output_is_result = True

    def __init__(self, ctx: _Ctx, name: str):
        self.ctx, self.name = ctx, name

    def prepare(self, src, dst) -> None:
        pass

    def call(self, src, dst) -> None:
        raise NotImplementedError


class _Nccl(_Method):
    def __init__(self, ctx: _Ctx, name: str):
        super().__init__(ctx, name)
        self.copy = ctx.args.nccl_mode == "copy"
        self.timed_output_is_result = self.copy

    def prepare(self, src, dst) -> None:
        if not self.copy:
            dst.copy_(src)

    def call(self, src, dst) -> None:
        if self.copy:
            dst.copy_(src)
        self.ctx.dist.all_reduce(dst, group=self.ctx.group)


class _Symm1(_Method):
    def call(self, src, dst) -> None:
        buf = self.ctx.symm_buffer[: src.numel()]
        self.ctx.torch.ops.symm_mem.one_shot_all_reduce_copy_out(buf, src, "sum", self.ctx.group.group_name, dst)


class _Symm2(_Method):
    def call(self, src, dst) -> None:
        buf = self.ctx.symm_buffer[: src.numel()]
        buf.copy_(src)  # comm_bench.py times this copy-in too
        self.ctx.torch.ops.symm_mem.two_shot_all_reduce_out(buf, "sum", self.ctx.group.group_name, dst)


class _FbgemmCar(_Method):
    """Upstream car as comm_bench.py calls it: the op copies the input in itself (one-shot in its kernel, two-shot
    by a memcpy before it)."""

    def __init__(self, ctx: _Ctx, name: str):
        super().__init__(ctx, name)
        # Resolved once, outside the timed calls.
        ops = ctx.torch.ops.fbgemm
        self.op = ops.one_shot_car_allreduce if name == "fbgemm_car_1shot" else ops.two_shot_car_allreduce

    def call(self, src, dst) -> None:
        self.op(dst, src)


def _build_methods(ctx: _Ctx, capacity: int) -> list[tuple[str, Optional[_Method], Optional[str]]]:
    """(name, method or None, skip reason) per requested method."""
    out: list[tuple[str, Optional[_Method], Optional[str]]] = []
    symm_reason = fbgemm_reason = None
    if any(m.startswith("torch_symm") for m in ctx.args.methods):
        symm_reason = _setup_symm(ctx, capacity)
    if any(m in FBGEMM_METHODS for m in ctx.args.methods):
        fbgemm_reason = _setup_fbgemm_car(ctx)
    for name in ctx.args.methods:
        if name in FBGEMM_METHODS:
            out.append((name, None, fbgemm_reason) if fbgemm_reason else (name, _FbgemmCar(ctx, name), None))
            continue
        if name == "torch_nccl":
            if ctx.gpus_shared:
                ndev = ctx.torch.cuda.device_count()
                out.append((name, None, f"NCCL needs one GPU per rank, and {ctx.world} ranks share {ndev} "
                                        f"visible device(s)"))
            else:
                out.append((name, _Nccl(ctx, name), None))
        elif symm_reason is not None:
            out.append((name, None, symm_reason))
        else:
            out.append((name, (_Symm1 if name == "torch_symm_1shot" else _Symm2)(ctx, name), None))
    return out


def _verify(ctx: _Ctx, out, ref, when: str) -> Optional[str]:
    """Checks this rank's output against the float64 reference; all ranks agree on the verdict."""
    torch = ctx.torch
    o = out.double()
    err = (o - ref).abs()
    # Written as not(err <= bound) so that NaN (the poison, or an inf - inf) counts as wrong.
    bad = ~(err <= check_tolerance(ctx.world) * ref.abs() + 1e-30)
    wrong = int(bad.sum().item())
    msg = None
    if wrong:
        first = int(bad.nonzero()[0, 0].item())
        rel = (err / ref.abs().clamp_min(1e-30)).nan_to_num(nan=math.inf)
        msg = (f"{when}: {wrong} wrong element(s), first at output index {first} (got {float(o[first])}, "
               f"want {float(ref[first])}), max rel err {float(rel.max()):.3e}")
    del o, err, bad
    torch.cuda.synchronize()
    return ctx.agree(msg)


def _time_calls(ctx: _Ctx, fn) -> tuple[list[float], float]:
    """comm-bench's time_calls: eager, or the num_iters calls captured once into a graph and replayed; warm-up,
    then per repeat a device sync and barrier (ranks start together), num_iters calls between two events, and the
    slowest rank's time per call. Returns every repeat's figure (ms) and rank 0's own first one."""
    torch, args = ctx.torch, ctx.args
    graph = None
    if args.graph:
        graph = torch.cuda.CUDAGraph()
        # thread_local: NCCL's watchdog thread queries events while this thread captures.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            for _ in range(args.num_iters):
                fn()

    def run(n: int) -> None:
        if graph is not None:
            for _ in range(-(-n // args.num_iters)):
                graph.replay()
        else:
            for _ in range(n):
                fn()

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    run(args.num_warmup_iters)
    repeats, own_first = [], math.nan
    for i in range(args.repeats):
        torch.cuda.synchronize()
        ctx.barrier()
        start.record()
        run(args.num_iters)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end) / args.num_iters
        if i == 0:
            own_first = ms
        repeats.append(ctx.max_over_ranks(ms))
    torch.cuda.synchronize()
    del graph
    return repeats, own_first


def _measure(ctx: _Ctx, m: _Method, count: int, src, dst, ref) -> dict[str, Any]:
    torch, world = ctx.torch, ctx.world
    row = lambda status, reason=None: make_row(m.name, count, world, status, reason)  # noqa: E731

    def checked_call(when: str) -> tuple[Optional[str], Optional[str]]:
        """(refusal, wrong result) of one fresh call on the input."""
        err = None
        try:
            dst.fill_(math.nan)
            m.prepare(src, dst)
            m.call(src, dst)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - an op that refuses these arguments is skipped, not fatal
            err = f"{when}: {_exc_text(e)}"
        err = ctx.agree(err)
        return (err, None) if err else (None, _verify(ctx, dst, ref, when))

    refused, wrong = checked_call("before timing")
    if refused:
        return row("skipped", refused)
    if wrong:
        return row("failed", wrong)
    # One fresh state for the timed calls (for nccl inplace: dst holds the checked result, which it keeps summing).
    try:
        repeats, own_first = _time_calls(ctx, lambda: m.call(src, dst))
        err = None
    except Exception as e:  # noqa: BLE001 - e.g. a capture the op does not support
        err = f"{'graph capture/replay' if ctx.args.graph else 'timed calls'}: {_exc_text(e)}"
    err = ctx.agree(err)
    if err:
        return row("skipped", err)
    if m.timed_output_is_result:
        wrong = _verify(ctx, dst, ref, "after the timed calls")
    else:
        refused, wrong = checked_call("after the timed calls")
        wrong = wrong or refused
    if wrong:
        return row("failed", wrong)
    return make_row(m.name, count, world, "passed", repeats_ms=repeats, rank0_ms=own_first)


def _nccl_version(torch) -> Optional[str]:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001
        return None
    if isinstance(v, tuple):
        return ".".join(str(x) for x in v[:3])
    # Older torch: one integer, major*10000 + minor*100 + patch (NCCL >= 2.9).
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


def run_rank(args: argparse.Namespace) -> None:
    """One rank's sweep (RANK, WORLD_SIZE, MASTER_ADDR/PORT from the environment)."""
    ctx = _Ctx(args)
    torch, rank, world = ctx.torch, ctx.rank, ctx.world
    hip = bool(getattr(torch.version, "hip", None))
    align = 512 if hip else 256  # comm_bench.py's N_even_divisor: 8*64 on HIP, 8*32 on CUDA
    sizes = comm_bench_sizes(args.min_size, args.max_size, args.size_steps, align)
    if rank == 0:
        theirs = [round_up(int(x), align)
                  for x in torch.logspace(args.min_size, args.max_size, steps=args.size_steps, base=2).tolist()]
        if theirs != sizes:
            print(f"# warning: comm_bench.py's float32 logspace gives {theirs}; using comm-bench's {sizes}")
    methods = _build_methods(ctx, max(sizes))
    props = torch.cuda.get_device_properties(ctx.device)
    arch = getattr(props, "gcnArchName", None) if hip else f"sm_{props.major}{props.minor}"
    if rank == 0:
        print(f"# peer_bench: {world} ranks, torch {torch.__version__}, NCCL {_nccl_version(torch)}, "
              f"{props.name} ({arch}), {OP} {DTYPE}, {len(sizes)} sizes, {'graph' if args.graph else 'eager'}, "
              f"nccl_mode {args.nccl_mode}, GPUs {'shared' if ctx.gpus_shared else 'one per rank'}")
        print(table_header())
    rows: list[dict[str, Any]] = []
    for count in sizes:
        src = _rank_input(torch, args.seed, count, rank).to(ctx.device)
        ref = torch.zeros(count, dtype=torch.float64, device=ctx.device)
        for r in range(world):
            ref += _rank_input(torch, args.seed, count, r).to(ctx.device, torch.float64)
        dst = torch.empty(count, dtype=torch.bfloat16, device=ctx.device)
        for name, m, reason in methods:
            row = make_row(name, count, world, "skipped", reason) if m is None else _measure(ctx, m, count, src,
                                                                                                dst, ref)
            if rank == 0:
                print(format_row(row), flush=True)
            rows.append(row)
            # No method starts while a peer may still be in the previous one's kernels.
            torch.cuda.synchronize()
            ctx.barrier()
        del src, ref, dst
    if rank == 0:
        meta = {"driver": "hip" if hip else "cuda", "device": props.name, "arch": arch, "world": world,
                "graph": bool(args.graph), "num_iters": args.num_iters, "num_warmup_iters": args.num_warmup_iters,
                "repeats": args.repeats, "torch_version": torch.__version__, "nccl_version": _nccl_version(torch),
                "cuda_version": torch.version.cuda, "hip_version": torch.version.hip, "nccl_mode": args.nccl_mode,
                "gpus_shared": ctx.gpus_shared, "seed": args.seed, "check_tolerance_rel": check_tolerance(world),
                "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                       "NVSHMEM_DISABLE_NVLS")}}
        csv_path, json_path = write_outputs(args.output_dir, outcome(meta, rows))
        print(f"# wrote {csv_path} and {json_path}")
    torch.cuda.synchronize()
    # Nobody frees the symmetric buffer while a peer's last call may still read it.
    ctx.barrier()
    ctx.dist.destroy_process_group()


def _rank_input(torch, seed: int, count: int, rank: int):
    """`rank`'s input at `count` elements, uniform in [0, 1) like comm_bench.py's torch.rand, on the CPU."""
    g = torch.Generator(device="cpu")
    g.manual_seed(input_seed(seed, count, rank))
    return torch.rand(count, generator=g, dtype=torch.bfloat16)


def _spawned(local_rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    # Every rank is on this host: keep gloo on loopback rather than whatever the host name resolves to.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    run_rank(args)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun (or any launcher that sets them)
        run_rank(args)
        return 0
    import torch
    import torch.multiprocessing as mp

    world = args.num_ranks or torch.cuda.device_count()
    if world < 1:
        print("peer_bench: no GPU visible and no --num_ranks", file=sys.stderr)
        return 2
    # spawn, not fork: CUDA must not be initialised in a forked child. One rank failing stops the others.
    mp.start_processes(_spawned, args=(world, _free_port(), args), nprocs=world, join=True, start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
