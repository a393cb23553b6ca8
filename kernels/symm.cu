// symm: PyTorch symmetric-memory allreduce, reproduced. One VMM allocation per rank, mapped by every peer, with
// a signal pad at its end. A barrier is torch's handshake: signal = remote compare-and-swap 0 -> 1 (which waits
// until the peer consumed the previous signal), wait = local compare-and-swap 1 -> 0. Every block signals every
// peer on its own channel. As in comm_bench.py, one-shot copies the input into the symmetric buffer inside the
// kernel (each block its own slice, before it signals) and the others take a separate memcpy before the kernel.
// symm_2shot_fused (the copy-in ablation) is torch's two-shot with that memcpy fused into the kernel instead: block
// b copies its part of every shard, then signals. Sums run in rank order, so every rank gets the same bits.

#include "arx/instantiate.h"
#include "arx/reduce.h"
#include "arx/sync.h"

struct SymmParams {
    u64 bufs[ARX_MAX_RANKS];  // every rank's symmetric buffer, mapped here
    u64 pads[ARX_MAX_RANKS];  // every rank's signal pad: u32 [ARX_MAX_BLOCKS channels][ARX_MAX_RANKS]
    u64 input;   // symm_1shot and symm_2shot_fused copy it in themselves; the others take a memcpy
    u64 output;
    u64 count;
    u64 timeout_ns;
    u32 rank;
    u32 world;
    u32 dtype;
    u32 reserved;
    u64 status;  // the communicator's status words (arx/sync.h), which every wait watches
    u64 bias;    // allreduce: added to every sum after the ranks' inputs, or 0
};

// False (in every thread of the block) when a peer did not arrive: the kernel then returns.
ARX_DEV bool symm_barrier(const SymmParams& p) { return cas_barrier(p.pads, p.rank, p.world, p.timeout_ns, p.status); }

template <int DT> ARX_DEV void symm_1shot(SymmParams p) {
    typedef Elem<DT> E;
    Range r = block_range(Range{0, p.count}, blockIdx.x, gridDim.x, E::VEC);
    copy_range<DT>((const void*)p.input, (void*)p.bufs[p.rank], r);
    if (!symm_barrier(p)) return;  // block b of every rank copied slice b
    reduce_range<DT>(p.bufs, p.world, (void*)p.output, r, (const void*)p.bias);
    symm_barrier(p);  // nobody's next copy-in overwrites a buffer this call still reads
}

#define SYMM_FUSED 1  // two-shot: the copy-in inside the kernel (block b copies its part of every shard)

template <int DT, int K> ARX_DEV void symm_2shot_k(SymmParams p) {
    typedef Elem<DT> E;
    u64 shard = shard_elems(p.count, p.world, E::VEC);
    // The previous call's exit barrier means no peer still reads this rank's buffer.
    if (K & SYMM_FUSED)
        for (u32 s = 0; s < p.world; ++s)
            copy_range<DT>((const void*)p.input, (void*)p.bufs[p.rank],
                           block_range(shard_range(p.count, shard, s), blockIdx.x, gridDim.x, E::VEC));
    if (!symm_barrier(p)) return;
    Range mine = block_range(shard_range(p.count, shard, p.rank), blockIdx.x, gridDim.x, E::VEC);
    reduce_range<DT>(p.bufs, p.world, (void*)p.bufs[p.rank], mine, (const void*)p.bias);
    if (!symm_barrier(p)) return;
    for (u32 s = 0; s < p.world; ++s)
        copy_range<DT>((const void*)p.bufs[s], (void*)p.output,
                       block_range(shard_range(p.count, shard, s), blockIdx.x, gridDim.x, E::VEC));
    symm_barrier(p);
}

template <int DT> ARX_DEV void symm_rs(SymmParams p) {
    typedef Elem<DT> E;
    u64 shard = p.count / p.world;
    if (!symm_barrier(p)) return;
    Range mine = block_range(shard_range(p.count, shard, p.rank), blockIdx.x, gridDim.x, E::VEC);
    reduce_range<DT>(p.bufs, p.world, (void*)(p.output - (u64)p.rank * shard * E::SIZE), mine);
    symm_barrier(p);
}

ARX_INSTANTIATE(symm_1shot, SymmParams)
ARX_INSTANTIATE_K(symm_2shot, symm_2shot_k, 0, SymmParams)
ARX_INSTANTIATE_K(symm_2shot_fused, symm_2shot_k, SYMM_FUSED, SymmParams)
ARX_INSTANTIATE(symm_rs, SymmParams)
