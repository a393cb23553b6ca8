"""allreduce_rs.Across on torch tensors, as two emulated nodes on one GPU node (or the launcher's real nodes):
run as every rank of a job, e.g. ``python -m allreduce_rs.launch -n 8 -- python gpu_across.py --nodes 2``.

Each rank plays node ``rank // (world / nodes)`` (ALLREDUCE_NODE_ID) and is a host of its own for NCCL
(NCCL_HOSTID), so NCCL accepts ranks that share a GPU and talks over sockets: functional, not a network's timing.
Allreduce by both paths, reduce-scatter and all-gather, bf16 and fp32, at comm_bench.py's sizes and odd counts, fresh
random inputs per call, checked against a float64 reference, and each result's bits equal on every rank."""

import argparse
import hashlib
import os
import sys

import torch

import allreduce_rs as ar


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=2, help="emulated nodes (0: the launcher's own)")
    p.add_argument("--seed", type=int, default=None, help="default: from the job id")
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.nodes:
        os.environ["ALLREDUCE_NODES"] = str(args.nodes)
        os.environ["ALLREDUCE_NODE_ID"] = str(rank // (world // args.nodes))
        os.environ["NCCL_HOSTID"] = f"arx-emulated-rank-{rank}"
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    a = ar.Across.from_env(backend="cuda", capacity_bytes=16 << 20)
    l = a.local_world_size
    # The job id is the same on every rank and new for every job: fresh inputs per run, rebuilt alike everywhere.
    job = hashlib.sha256(os.environ["ALLREDUCE_JOB_ID"].encode()).hexdigest()
    seed = args.seed if args.seed is not None else int(job[:8], 16)

    def inputs(k, r, count, dtype):
        g = torch.Generator().manual_seed(seed * 1000003 + k * 131 + r)
        return torch.rand(count, generator=g, dtype=torch.float64).to(dtype)

    def same_everywhere(t, what):
        digest = hashlib.sha256(t.cpu().view(torch.uint8).numpy().tobytes()).digest()[:8]
        mine = torch.frombuffer(bytearray(digest), dtype=torch.float32).to(dev)
        allp = torch.empty(2 * world, dtype=torch.float32, device=dev)
        a.all_gather(mine, allp)
        assert torch.equal(allp.view(world, 2), mine.expand(world, 2)), f"{what}: bits differ across ranks"

    checked, k = 0, 0
    counts = [2**e for e in range(10, 23, 2)] + [3 * 2**e for e in range(10, 21, 3)] + [world * 3 + 1, 1000 * l]
    for dtype in [torch.bfloat16, torch.float32]:
        for count in counts:
            if count * dtype.itemsize > 16 << 20:
                continue
            k += 1
            xs = [inputs(k, r, count, dtype) for r in range(world)]
            want = sum(x.double() for x in xs)
            # NCCL rounds every add to the dtype (half an ulp each, inputs non-negative: measure::check::tolerance
            # with rounds_every_add), ours once.
            half_ulp = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-24
            tol = (world - 1) * half_ulp + world * 2.0**-23
            x = xs[rank].to(dev)
            for path in ["nccl", "hierarchical"] if count % l == 0 else ["nccl"]:
                out = torch.full_like(x, float("nan"))
                a.all_reduce(x, out, path=path)
                assert a.last_path == path, a.last_path
                err = (out.double().cpu() - want).abs() - tol * want.abs()
                assert (err <= 1e-30).all(), f"{path} {dtype} x {count}: {int((err > 1e-30).sum())} wrong"
                same_everywhere(out, f"{path} {dtype} x {count}")
                checked += 1
            if count % world == 0:
                shard = count // world
                out = torch.full((shard,), float("nan"), dtype=dtype, device=dev)
                a.reduce_scatter(x, out)
                mine = want[rank * shard : (rank + 1) * shard]
                err = (out.double().cpu() - mine).abs() - tol * mine.abs()
                assert (err <= 1e-30).all(), f"reduce_scatter {dtype} x {count}"
                checked += 1
            out = torch.empty(count * world, dtype=dtype, device=dev)
            a.all_gather(x, out)
            assert torch.equal(out.cpu(), torch.cat(xs)), f"all_gather {dtype} x {count}"
            checked += 1
    # Both paths timed per size; calls without a path then follow the table (functional here: sockets on one GPU).
    table = a.tune(dtype=torch.bfloat16, counts=[1024 * l, 65536 * l, 1 << 20], iters=5, repeats=2)
    assert a.path_table == table, (a.path_table, table)
    x = torch.rand(1 << 20, dtype=torch.bfloat16, device=dev)
    a.all_reduce(x)
    want = next(p for m, p in table if m is None or (1 << 21) <= m)
    assert a.last_path == want, (a.last_path, table)
    a.check()
    torch.cuda.synchronize()
    if rank == 0:
        print(f"path table: {table}")
        print(a.placement(), end="")
        print(f"across python: {a.nodes} x {l} ranks, {checked} results checked on every rank, seed {seed}: ok")
    a.close()


if __name__ == "__main__":
    sys.exit(main())
