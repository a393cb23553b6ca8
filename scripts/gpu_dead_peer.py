"""A peer that dies, on a GPU with torch tensors (``python -m allreduce_rs.launch -n 4 -- python gpu_dead_peer.py``):
rank 1 exits after set-up; every survivor's calls fail with PeerError naming it within 2 s (the deadline is 10 s),
its device context still runs torch kernels (no "unspecified launch failure"), and the survivors allreduce exactly
with a new communicator (a new job id)."""

import os
import time

import torch

import allreduce_rs as ar

VICTIM = 1


def main():
    comm = ar.Communicator.from_env(capacity_bytes=1 << 20, backend="cuda", timeout_s=10.0)
    rank, world = comm.rank, comm.world_size
    torch.cuda.set_device(comm.device)
    x = torch.ones(4096, device=f"cuda:{comm.device}")
    comm.all_reduce(x)
    torch.cuda.synchronize()
    assert (x == world).all()
    comm.barrier()
    if rank == VICTIM:
        os._exit(0)
    took = None
    for _ in range(100000):
        start = time.monotonic()
        try:
            comm.all_reduce(x)
            torch.cuda.synchronize()
            comm.check()
        except ar.PeerError as e:
            took = time.monotonic() - start
            assert e.ranks == (VICTIM,), (e.ranks, str(e))
            print(f"rank {rank}: PeerError after {took:.2f} s: {e}", flush=True)
            break
    assert took is not None and took < 2.0, f"rank {rank}: took {took}"
    y = torch.arange(1000, device=f"cuda:{comm.device}", dtype=torch.float32) * 2
    torch.cuda.synchronize()
    assert y[999].item() == 1998.0
    comm.close()
    me = rank - (rank > VICTIM)
    job = os.environ["ALLREDUCE_JOB_ID"] + "2"
    with ar.Communicator(me, world - 1, me, job, backend="cuda", capacity_bytes=1 << 20) as survivors:
        z = torch.full((4096,), float(me + 1), device=f"cuda:{comm.device}")
        survivors.all_reduce(z)
        torch.cuda.synchronize()
        want = sum(range(1, world))
        assert (z == want).all(), z[:4]
    print(f"rank {rank}: gpu_dead_peer ok", flush=True)


if __name__ == "__main__":
    main()
