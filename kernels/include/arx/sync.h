// Synchronisation: per-block epoch counters, the spin that watches the communicator's status words, epoch-flag waits
// and barriers, torch's CAS handshake.
#ifndef ARX_SYNC_H
#define ARX_SYNC_H

#include "arx/portability.h"

// Block b's epoch: one more than last call's. Block b also advances the counters of blocks b + k*grid that this
// launch does not have, so every counter (and every block's epoch) stays equal whatever the grid was. The counters
// live in device memory, so graph replays advance them too. The stores are spread over the block's threads (one
// thread storing all ARX_MAX_BLOCKS held a one-block launch up), after the barrier that orders them after the read.
ARX_DEV u64 next_epoch(u64 counters) {
    __shared__ u64 s_epoch;
    u64* c = (u64*)counters;
    if (threadIdx.x == 0) s_epoch = c[blockIdx.x] + 1;
    __syncthreads();
    u64 e = s_epoch;
    for (u32 j = blockIdx.x + threadIdx.x * gridDim.x; j < ARX_MAX_BLOCKS; j += gridDim.x * blockDim.x) c[j] = e;
    return e;
}

// The communicator's status words (device memory, u64 [8]) that every wait watches, so no wait traps and a failure
// ends every wait of this rank: [0] abort (set by the host, or by a wait that timed out), [1] 1 once a wait timed
// out (2 while its record is being written), [2] the rank it waited for, [3] what it waited for (ARX_WAIT_* |
// phase), [4] how long it waited by its clock (ns; 0 for a peer met in another kernel), [5] the word it last read,
// [6] where (a packet's slot; 0 elsewhere), [7] the word it waited for (a packet's flag, an epoch). The host reads
// them and reports: what a lost packet's slot held tells a packet never written from one overwritten.
#define ARX_WAIT_FLAGS 0x100u    // an epoch-flag barrier, | its phase
#define ARX_WAIT_PACKETS 0x200u  // LL packets
#define ARX_WAIT_CAS 0x300u      // torch's compare-and-swap handshake
#define ARX_WAIT_BLOCKS 0x400u   // car's one-block barrier: this rank's own blocks
#define ARX_WAIT_MISMATCH 0x500u // a peer at this epoch in another kernel: | its tag, | this kernel's tag << 16

// An epoch flag is (epoch << ARX_TAG_BITS) | tag, the tag naming the kernel that stored it (collective_core::flag_tags).
#define ARX_TAG_BITS 8
#define ARX_TAG_MASK ((1ull << ARX_TAG_BITS) - 1)

// What a failed wait saw: the word it last read, where (a packet's slot), and the word it waited for.
struct Seen {
    u64 word, at, want;
};

// Records the first failure of a call in the status words (the peer, what was waited for, how long, and what was
// seen) and sets the abort word, which ends every wait of this rank. One thread claims the record (`recorded` 0 -> 2)
// and writes them, then marks it whole (1) and aborts: threads that fail at once (a warp's lanes, whose stores to one
// word land in any order) would otherwise leave one's peer beside another's `what`. A thread that loses the claim
// leaves the abort to the winner, so the host never sees the abort without the record.
ARX_DEV void record_failure(u64* status, u32 peer, u32 what, u64 waited_ns, Seen seen) {
    if (cas_acq_rel_sys(status + 1, 0ull, 2ull) != 0) return;
    st_relaxed_sys(status + 2, peer);
    st_relaxed_sys(status + 3, what);
    st_relaxed_sys(status + 4, waited_ns);
    st_relaxed_sys(status + 5, seen.word);
    st_relaxed_sys(status + 6, seen.at);
    st_relaxed_sys(status + 7, seen.want);
    st_release_sys(status + 1, 1);
    st_release_sys(status, 1);
}

// A spin with a deadline that watches the status words: check() is false (and `failed` set) once the wait must end.
struct Spin {
    u64 start, timeout;
    u64* status;
    u32 n;
    bool failed;
    __device__ __forceinline__ bool check(u32 peer, u32 what) { return check(peer, what, Seen{0, 0, 0}); }
    // As check(peer, what), recording `seen` (what the wait read last) should the wait end here.
    __device__ __forceinline__ bool check(u32 peer, u32 what, Seen seen) {
        if ((++n & 1023u) != 0) return true;
        // The clock is read only here, on the slow path: a wait that ends within its first polls (every packet of
        // the LL designs, most flag waits) never reads it. The deadline counts from the first slow check.
        u64 now = timer_ns();
        // A clock that steps back (a torn read of it) restarts the deadline: the unsigned difference would end it.
        if (start == 0 || now < start) start = now;
        bool aborted = ld_relaxed_sys(status) != 0;
        if (!aborted && now - start <= timeout) return true;
        // The first failure of a call is what the host reports; a later one's record would describe the same stall.
        if (aborted)
            st_release_sys(status, 1);
        else
            record_failure(status, peer, what, now - start, seen);
        failed = true;
        return false;
    }
};
ARX_DEV Spin spin_start(u64 timeout_ns, u64 status) { return Spin{0, timeout_ns, (u64*)status, 0, false}; }

// Whether any thread of the block passes true; every thread calls it. A kernel whose threads wait apart (packets)
// ends every thread at once when one wait failed, before a block sync that the ended threads would never reach.
ARX_DEV bool block_any(bool x) {
    __shared__ u32 s_any;
    if (threadIdx.x == 0) s_any = 0;
    __syncthreads();
    if (x) s_any = 1;
    __syncthreads();
    bool any = s_any != 0;
    __syncthreads();  // every thread has read it before a later call resets it
    return any;
}

// Waits until the word *p, shifted right by `shift`, reaches `epoch`, then acquires what its writer released; the
// word, or 0 when the wait ended without it (the communicator aborted, or the deadline passed: recorded as waiting
// for `peer`, `what`). Epochs start at 1, so a word that reached one is never 0.
ARX_DEV u64 wait_epoch(const u64* p, u64 epoch, u32 shift, u64 timeout_ns, u64 status, u32 peer, u32 what) {
    Spin s = spin_start(timeout_ns, status);
    u64 word;
#ifdef ARX_IS_HIP
    // On GFX942 every system-scope acquire load invalidates the caches: poll relaxed, then acquire once.
    while (((word = ld_relaxed_sys(p)) >> shift) < epoch)
        if (!s.check(peer, what, Seen{word, 0, epoch})) return 0;
    fence_acquire_sys();
#else
    // On NVIDIA an acquire load per poll is cheaper than relaxed polls and PTX's only acquire fence, a full
    // fence.acq_rel.
    while (((word = ld_acquire_sys(p)) >> shift) < epoch)
        if (!s.check(peer, what, Seen{word, 0, epoch})) return 0;
#endif
    return word;
}

// Block-level barrier of phase `ph` over epoch flags u64 [ARX_MAX_BLOCKS][ARX_PHASES][ARX_MAX_RANKS] per rank: thread t
// tells rank t that this block reached `epoch` in the kernel of `tag` (remote release store), then waits until rank
// t's block said it reached `epoch` (wait_epoch on the local slot). Block b's work depends only on block b of the
// peers. False, in every thread of the block, when a wait ended without its peer, or met it at this epoch in another
// kernel (recorded, and the communicator aborted; a peer already past this epoch is not judged): the kernel then
// returns.
ARX_DEV bool flag_barrier(const u64* flags, u32 rank, u32 world, u32 ph, u64 epoch, u32 tag, u64 timeout_ns,
                          u64 status) {
    __shared__ u32 s_failed;
    if (threadIdx.x == 0) s_failed = 0;
    __syncthreads();
    u32 t = threadIdx.x;
    if (t < world) {
        u64 slot = ((u64)blockIdx.x * ARX_PHASES + ph) * ARX_MAX_RANKS;
        st_release_sys((u64*)flags[t] + slot + rank, (epoch << ARX_TAG_BITS) | tag);
        u64 word = wait_epoch((const u64*)flags[rank] + slot + t, epoch, ARX_TAG_BITS, timeout_ns, status, t,
                              ARX_WAIT_FLAGS | ph);
        if (word == 0) {
            s_failed = 1;
        } else if ((word >> ARX_TAG_BITS) == epoch && (word & ARX_TAG_MASK) != tag) {
            record_failure((u64*)status, t, ((u32)tag << 16) | ARX_WAIT_MISMATCH | (u32)(word & ARX_TAG_MASK), 0,
                           Seen{word, 0, epoch});
            s_failed = 1;
        }
    }
    __syncthreads();
    return s_failed == 0;
}

// Torch's signal-pad handshake on channel `blockIdx.x` of pads u32 [ARX_MAX_BLOCKS][ARX_MAX_RANKS] per rank:
// signal = remote compare-and-swap 0 -> 1 (retried until the peer consumed our previous signal), wait = local
// compare-and-swap 1 -> 0. False, in every thread of the block, when a wait ended without its peer.
ARX_DEV bool cas_barrier(const u64* pads, u32 rank, u32 world, u64 timeout_ns, u64 status) {
    __shared__ u32 s_failed;
    if (threadIdx.x == 0) s_failed = 0;
    __syncthreads();
    u32 t = threadIdx.x;
    if (t < world && t != rank) {
        u32* remote = (u32*)pads[t] + blockIdx.x * ARX_MAX_RANKS + rank;
        u32* local = (u32*)pads[rank] + blockIdx.x * ARX_MAX_RANKS + t;
        Spin s = spin_start(timeout_ns, status);
        bool ok = true;
        while (ok && cas_acq_rel_sys(remote, 0u, 1u) != 0u) ok = s.check(t, ARX_WAIT_CAS);
        while (ok && cas_acq_rel_sys(local, 1u, 0u) != 1u) ok = s.check(t, ARX_WAIT_CAS);
        if (!ok) s_failed = 1;
    }
    __syncthreads();
    return s_failed == 0;
}

#endif  // ARX_SYNC_H
