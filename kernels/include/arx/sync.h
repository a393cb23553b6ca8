// Synchronisation: per-block epoch counters, the trapping spin, epoch-flag waits and barriers, torch's CAS
// handshake.
#ifndef ARX_SYNC_H
#define ARX_SYNC_H

#include "arx/portability.h"

// Block b's epoch: one more than last call's. Block b also advances the counters of blocks b + k*grid that this
// launch does not have, so every counter (and every block's epoch) stays equal whatever the grid was. The counters
// live in device memory, so graph replays advance them too.
ARX_DEV u64 next_epoch(u64 counters) {
    __shared__ u64 s_epoch;
    if (threadIdx.x == 0) {
        u64* c = (u64*)counters;
        u64 e = c[blockIdx.x] + 1;
        for (u32 j = blockIdx.x; j < ARX_MAX_BLOCKS; j += gridDim.x) c[j] = e;
        s_epoch = e;
    }
    __syncthreads();
    return s_epoch;
}

// A spin that ends the kernel (rather than hanging the GPU) once `timeout_ns` has passed.
struct Spin {
    u64 start, timeout;
    u32 n;
    __device__ __forceinline__ void check() {
        if ((++n & 1023u) == 0 && timer_ns() - start > timeout) arx_trap();
    }
};
ARX_DEV Spin spin_start(u64 timeout_ns) { return Spin{timer_ns(), timeout_ns, 0}; }

// Waits until the epoch word *p reaches `epoch`, then acquires what its writer released.
ARX_DEV void wait_epoch(const u64* p, u64 epoch, u64 timeout_ns) {
    Spin s = spin_start(timeout_ns);
#ifdef ARX_IS_HIP
    // On GFX942 every system-scope acquire load invalidates the caches: poll relaxed, then acquire once.
    while (ld_relaxed_sys(p) < epoch) s.check();
    fence_acquire_sys();
#else
    // On NVIDIA an acquire load per poll is cheaper than relaxed polls and PTX's only acquire fence, a full
    // fence.acq_rel.
    while (ld_acquire_sys(p) < epoch) s.check();
#endif
}

// Block-level barrier of phase `ph` over epoch flags u64 [ARX_MAX_BLOCKS][ARX_PHASES][ARX_MAX_RANKS] per rank: thread t
// tells rank t that this block reached `epoch` (remote release store), then waits until rank t's block said the
// same (wait_epoch on the local slot). Block b's work depends only on block b of the peers.
ARX_DEV void flag_barrier(const u64* flags, u32 rank, u32 world, u32 ph, u64 epoch, u64 timeout_ns) {
    __syncthreads();
    u32 t = threadIdx.x;
    if (t < world) {
        u64 slot = ((u64)blockIdx.x * ARX_PHASES + ph) * ARX_MAX_RANKS;
        st_release_sys((u64*)flags[t] + slot + rank, epoch);
        wait_epoch((const u64*)flags[rank] + slot + t, epoch, timeout_ns);
    }
    __syncthreads();
}

// Torch's signal-pad handshake on channel `blockIdx.x` of pads u32 [ARX_MAX_BLOCKS][ARX_MAX_RANKS] per rank:
// signal = remote compare-and-swap 0 -> 1 (retried until the peer consumed our previous signal), wait = local
// compare-and-swap 1 -> 0.
ARX_DEV void cas_barrier(const u64* pads, u32 rank, u32 world, u64 timeout_ns) {
    __syncthreads();
    u32 t = threadIdx.x;
    if (t < world && t != rank) {
        u32* remote = (u32*)pads[t] + blockIdx.x * ARX_MAX_RANKS + rank;
        u32* local = (u32*)pads[rank] + blockIdx.x * ARX_MAX_RANKS + t;
        Spin s = spin_start(timeout_ns);
        while (cas_acq_rel_sys(remote, 0u, 1u) != 0u) s.check();
        while (cas_acq_rel_sys(local, 1u, 0u) != 1u) s.check();
    }
    __syncthreads();
}

#endif  // ARX_SYNC_H
