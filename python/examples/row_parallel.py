"""A tensor-parallel row-parallel linear layer whose partial sums are reduced by allreduce_rs instead of
torch.distributed.all_reduce, eagerly and replayed from a CUDA graph, checked against the dense layer:

    torchrun --nproc-per-node 8 row_parallel.py

torch.distributed is initialised as a program would have it (NCCL with a GPU per rank, gloo when ranks share a GPU,
where NCCL refuses to run); allreduce_rs needs none of it and uses none of its state.
"""

import os

import torch
import torch.distributed as dist

import allreduce_rs


class RowParallelLinear(torch.nn.Module):
    """y = x @ W.T with W split by input features: rank r holds W[:, r*k:(r+1)*k] and multiplies its slice of x;
    the partial products are summed over the ranks."""

    def __init__(self, weight: torch.Tensor, comm: allreduce_rs.Communicator):
        super().__init__()
        k = weight.shape[1] // comm.world_size
        self.weight = torch.nn.Parameter(
            weight[:, comm.rank * k : (comm.rank + 1) * k].contiguous(), requires_grad=False
        )
        self.comm = comm

    def forward(self, x_shard: torch.Tensor) -> torch.Tensor:
        y = x_shard @ self.weight.t()
        # Was: torch.distributed.all_reduce(y). In place, on the current stream, captured by torch.cuda.graph.
        return self.comm.all_reduce(y)


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    dist.init_process_group("nccl" if torch.cuda.device_count() >= world else "gloo")
    comm = allreduce_rs.Communicator.from_env(capacity_bytes=64 << 20)
    if comm.rank == 0:
        print(comm.placement, comm.table_source("eager"), sep="")
    tokens, d_in, d_out = 128, 4096, 4096
    g = torch.Generator(device="cuda").manual_seed(0)  # the same full weight and input on every rank
    weight = torch.randn(d_out, d_in, generator=g, device="cuda", dtype=torch.bfloat16) / d_in**0.5
    x = torch.randn(tokens, d_in, generator=g, device="cuda", dtype=torch.bfloat16)
    k = d_in // comm.world_size
    x_shard = x[:, comm.rank * k : (comm.rank + 1) * k].contiguous()
    layer = RowParallelLinear(weight, comm)
    want = x.float() @ weight.float().t()
    with torch.no_grad():
        eager = layer(x_shard).clone()
        side = torch.cuda.Stream()  # warm up off the default stream before capture, as torch.cuda.graph asks
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            layer(x_shard)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = layer(x_shard)
        graph.replay()
        torch.cuda.synchronize()
    for name, got in [("eager", eager), ("graph", y)]:
        err = (got.float() - want).abs().max().item()
        # bf16 partial products, summed in fp32 and rounded once: within a few bf16 ulps of the dense result.
        assert err <= 0.05 * want.abs().max().item(), f"rank {comm.rank}: {name} max error {err}"
    # Every algorithm gives the same bits, so the eager and graph tables' choices cannot differ in the result.
    assert torch.equal(eager, y), f"rank {comm.rank}: eager and graph results differ bitwise"
    print(f"rank {comm.rank}: eager and graph match the dense layer and each other bitwise ({comm.last_algorithm})")
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
