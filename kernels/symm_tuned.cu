// Tuned symmetric-memory allreduce: what closes the gap to (and passes) car. Every rank's registered input, output,
// packet area and flags live in one VMM allocation mapped by every peer, so
//  - symm_ll: small messages need no barrier at all. Each 8-byte packet carries 4 bytes of data and the call's
//    epoch as its arrival flag (an 8-byte store is single-copy atomic, so data and flag land together). Every rank
//    pushes its packets to every peer, then polls its own packet area until each source's flag equals the epoch.
//    Packet areas alternate by epoch parity: a peer writes area e%2 again only in call e+2, which it reaches only
//    after this rank's packets of call e+1, sent after this rank finished reading call e.
//  - symm_ll_norm: symm_ll's packets carrying the residual add and RMSNorm (arx/norm.h): the exchange over the grid,
//    then the block that stores a row's last sums normalises it (a counter per row; no block waits for another).
//  - symm_zc_1shot_norm, symm_epoch_1shot_norm: symm_zc_1shot and symm_epoch_1shot carrying the residual add and
//    RMSNorm, blocks owning whole rows.
//  - symm_zc_2shot_norm, symm_zc_2shot_push_norm: symm_zc_2shot and symm_zc_2shot_push carrying it: each rank pushes
//    r of its share of the rows into every rank's output, then every rank normalises every row from its own.
//  - symm_zc_1shot / symm_zc_2shot: no copy-in. Ranks read each other's registered inputs directly; two-shot pushes
//    each reduced shard straight into every peer's registered output. Epoch flags (release store / acquire load,
//    one per block and phase) replace torch's CAS handshake. Phase 0: inputs ready; phase 1: this block's reads of
//    every input and its pushes are done, so the caller may reuse its input and read its output once the kernel ends.
//  - symm_zc_2shot_ll_norm: symm_zc_2shot_ll carrying them: each rank sends r of its share of the rows as packets,
//    then every rank normalises every row from its own output.
//  - symm_zc_2shot_pull: symm_zc_2shot whose all-gather pulls every shard from its owner's staging into this rank's
//    output, which may then be the caller's own (no copy-out) without any peer mapping it; the communicator has it
//    copy a caller's input in itself (copy_in_shards: only the peers' shards).
//  - symm_zc_2shot_push: symm_zc_2shot with a copy-in pushed: each rank writes each shard of its input into a slot of
//    the shard's owner's staging, which sums locally; every remote access is a write.
//  - symm_epoch_1shot: car's one-shot protocol on symmetric memory (copy-in fused per block into a staging half
//    chosen by epoch parity, one epoch-flag barrier): one barrier instead of two, for the sizes between the two.
//  - *_table: the zero-copy kernels with every rank's input and output read from a device table (`peer_table`)
//    instead of the parameters: a graph captured on the caller's own buffers fixes its parameters before any peer
//    has mapped them, and the communicator fills the table once the capture ends (as vLLM's graph buffers).
// Sums run in rank order 0..W-1 with f32 accumulation, so every rank gets the same bits.

#include "arx/instantiate.h"
#include "arx/norm.h"
#include "arx/packets.h"
#include "arx/reduce.h"
#include "arx/sync.h"

struct TunedParams {
    u64 inputs[ARX_MAX_RANKS];   // every rank's registered input
    u64 outputs[ARX_MAX_RANKS];  // every rank's registered output
    u64 packets[ARX_MAX_RANKS];  // every rank's packet area: u64 [2 parities][ARX_MAX_RANKS sources][ll_packets]
    u64 flags[ARX_MAX_RANKS];    // every rank's epoch flags: u64 [ARX_MAX_BLOCKS][2 phases][ARX_MAX_RANKS]
    u64 staging[ARX_MAX_RANKS];  // every rank's staging buffer: two halves of half_bytes, by epoch parity
    u64 counters;                // this rank's per-block epoch counters, then symm_ll_norm's row counters (u32)
    u64 count;
    u64 ll_packets;              // packets per source and parity
    u64 half_bytes;
    u64 timeout_ns;
    u32 rank;
    u32 world;
    u32 dtype;
    u32 tag;                     // the kernel's epoch-flag tag (arx/sync.h, collective_core::flag_tags)
    u64 peer_table;              // the *_table kernels: u64 [inputs ARX_MAX_RANKS][outputs ARX_MAX_RANKS]
    u64 copy_from;               // zero-copy one- and two-shot: a caller's input to copy in first, or 0
    u64 status;                  // the communicator's status words (arx/sync.h), which every wait watches
    u64 bias;                    // added to every sum after the ranks' inputs (car's `z`), or 0
    u64 residual;                // symm_ll_norm (arx/norm.h): the residual, written back as r
    u64 weight;                  // ... the norm's weight, `hidden` elements
    u32 hidden;                  // ... elements of a row
    float eps;
};

// False (in every thread of the block) when a peer did not arrive: the kernel then returns.
ARX_DEV bool tuned_barrier(const TunedParams& p, u32 ph, u64 epoch) {
    return flag_barrier(p.flags, p.rank, p.world, ph, epoch, p.tag, p.timeout_ns, p.status);
}

// The zero-copy bodies take every rank's input and output views apart from the parameters: the plain kernels pass
// the parameters' arrays, the *_table kernels arrays loaded from the peer table. Every index into a view array is a
// compile-time constant (loops unrolled over the rank bound, `pick` for this rank's), so loaded arrays stay in
// registers: a modified copy of the whole parameter block sat in local memory and cost 10-30 us per call.
ARX_DEV u64 pick(const u64* views, u32 r) {
    u64 v = 0;
#pragma unroll
    for (u32 q = 0; q < ARX_MAX_RANKS; ++q)
        if (q == r) v = views[q];
    return v;
}

// Both view arrays from the peer table: u64 [inputs ARX_MAX_RANKS][outputs ARX_MAX_RANKS].
ARX_DEV void load_peer_table(const TunedParams& p, u64* in, u64* out) {
    const u64* t = (const u64*)p.peer_table;
#pragma unroll
    for (u32 r = 0; r < ARX_MAX_RANKS; ++r) {
        in[r] = t[r];
        out[r] = t[ARX_MAX_RANKS + r];
    }
}

// Zeroes the slots of this rank's area of `epoch`'s parity (j = first mod stride, every source) when the flags wrap
// before the area's next use (call epoch + 2): the packet designs' threads read exactly these, the other designs none
// of them. Every design calls it last: no peer writes this area again before this rank's next call, which follows
// this one.
ARX_DEV void ll_clean(const TunedParams& p, u64 epoch) {
    if (ll_flag(epoch + 2) > ll_flag(epoch)) return;
    u64* mine = (u64*)p.packets[p.rank] + (epoch & 1) * ARX_MAX_RANKS * p.ll_packets;
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < p.ll_packets; j += stride)
        for (u32 src = 0; src < ARX_MAX_RANKS; ++src) st_relaxed_sys(mine + src * p.ll_packets + j, 0);
}

template <int DT> ARX_DEV void symm_ll(TunedParams p) {
    typedef Elem<DT> E;
    const int per = 4 / E::SIZE;  // elements per packet
    u64 epoch = next_epoch(p.counters);
    u64 flag = ll_flag(epoch);
    u64 n = (p.count + per - 1) / per;
    u64 area = (epoch & 1) * ARX_MAX_RANKS * p.ll_packets;
    const u32* in = (const u32*)p.inputs[p.rank];
    u64 stride = (u64)gridDim.x * blockDim.x;
    u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (u64 j = first; j < n; j += stride) {
        u32 w;
        if ((j + 1) * per <= p.count) {
            w = in[j];
        } else {  // a half-filled last packet: never read past the input
            w = (u32)((const u16*)in)[j * per];
        }
        ll_push(p.packets, p.world, area + p.rank * p.ll_packets + j, w, flag);
    }
    const u64* mine = (const u64*)p.packets[p.rank] + area;
    for (u64 j = first; j < n; j += stride) {
        Spin s = spin_start(p.timeout_ns, p.status);
        float acc[2];
        ll_poll_sum<DT>(mine, p.ll_packets, j, flag, p.world, s, acc);
        // No barrier follows: a thread whose packets never came just ends.
        if (s.failed) return;
        // The bias after every rank's input, as sum_at adds it; a half-filled last packet has one element.
        if (p.bias)
            for (int k = 0; k < per && j * per + k < p.count; ++k) acc[k] += E::load((const void*)p.bias, j * per + k);
        if ((j + 1) * per <= p.count) {
            ((u32*)p.outputs[p.rank])[j] = pack_payload<DT>(acc);
        } else {
            E::store((void*)p.outputs[p.rank], j * per, acc[0]);
        }
    }
    ll_clean(p, epoch);
}

// symm_ll_norm's packet layout: row `row` in slots row * ppr ..., ppr = ll_row_packets, so that no packet holds two
// rows' elements (the norm's blocks own whole rows); a row of an odd count of 2-byte elements ends in a half-filled
// packet.
// (== symm::host_tuned::row_packets)
template <int DT> ARX_DEV u64 ll_row_packets(u32 hidden) { return div_ceil((u64)hidden * Elem<DT>::SIZE, 4); }

// The bits of packet q of the row at element `base` of `src` (its elements q * per ..., never past the row; a
// half-filled packet's high half 0). Rows on 4-byte boundaries move words; others (2-byte elements) halves.
template <int DT> ARX_DEV u32 row_packet(const void* src, u64 base, u32 hidden, u64 q) {
    const u64 per = 4 / Elem<DT>::SIZE, i = base + q * per;
    if (per == 1 || (i % 2 == 0 && q * per + 1 < hidden)) return *(const u32*)((const char*)src + i * Elem<DT>::SIZE);
    u32 lo = ((const u16*)src)[i];
    return q * per + 1 < hidden ? lo | ((u32)((const u16*)src)[i + 1] << 16) : lo;
}

// Stores packet q's elements `w` into the row at element `base` of `dst` (row_packet's inverse).
template <int DT> ARX_DEV void store_row_packet(void* dst, u64 base, u32 hidden, u64 q, u32 w) {
    const u64 per = 4 / Elem<DT>::SIZE, i = base + q * per;
    if (per == 1 || (i % 2 == 0 && q * per + 1 < hidden)) {
        *(u32*)((char*)dst + i * Elem<DT>::SIZE) = w;
        return;
    }
    ((u16*)dst)[i] = (u16)w;
    if (q * per + 1 < hidden) ((u16*)dst)[i + 1] = (u16)(w >> 16);
}

// r = round(round(sum) + residual) of one packet's elements, as add_residual_row computes them: `acc` the packet's
// f32 sums, `res` its bits of the residual (a half-filled packet's high half is 0 and never stored).
template <int DT> ARX_DEV u32 add_residual_packet(const float* acc, u32 res) {
    float r[2];
    for (int k = 0; k < 4 / Elem<DT>::SIZE; ++k) r[k] = Elem<DT>::round(acc[k]) + payload<DT>(res, k);
    return pack_payload<DT>(r);
}

// How many of the packets [lo, hi) fall to block b of `threads` threads in a grid of `stride` threads, where thread
// t of block b takes the packets j with j % stride == b * threads + t (the exchange's loop).
ARX_DEV u64 block_packets_below(u64 x, u64 b, u64 threads, u64 stride) {
    u64 rest = x % stride, a = b * threads;
    return x / stride * threads + (rest > a ? (rest - a < threads ? rest - a : threads) : 0);
}
ARX_DEV u64 block_packets_in(u64 lo, u64 hi, u64 b, u64 threads, u64 stride) {
    return block_packets_below(hi, b, threads, stride) - block_packets_below(lo, b, threads, stride);
}

// Allreduce + residual add + RMSNorm on symm_ll's protocol, ARX_NORM_LANES threads per block. The exchange is
// symm_ll's, spread over the whole grid (one packet per thread where the grid allows; packet slots in rows, ppr per
// row, so no packet holds two rows' elements): push this rank's packets, poll every source's, add the residual to
// their rank-ordered sum as the unfused kernel does and store r into the residual (its packet of the residual is read
// before the poll, so that load waits with it). No block waits for another: each counts the packets it stored per
// row on the row's counter (this rank's, after the epoch counters, zero between calls), and the block whose count
// completes a row (the last to store into it) runs the unfused norm's second piece on the row's r (y into the output,
// so the bits are the unfused sequence's) and zeroes the counter. Areas alternate by epoch parity, safe for symm_ll's
// reason.
template <int DT> ARX_DEV void symm_ll_norm(TunedParams p) {
    __shared__ bool s_last[ARX_NORM_LANES];
    u64 epoch = next_epoch(p.counters);
    u64 flag = ll_flag(epoch);
    u64 area = (epoch & 1) * ARX_MAX_RANKS * p.ll_packets;
    u64 ppr = ll_row_packets<DT>(p.hidden);
    u64 rows = p.count / p.hidden, n = rows * ppr;
    const void* in = (const void*)p.inputs[p.rank];
    void* out = (void*)p.outputs[p.rank];
    u64 stride = (u64)gridDim.x * blockDim.x;
    u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (u64 j = first; j < n; j += stride)
        ll_push(p.packets, p.world, area + p.rank * p.ll_packets + j,
                row_packet<DT>(in, j / ppr * p.hidden, p.hidden, j % ppr), flag);
    const u64* inbox = (const u64*)p.packets[p.rank] + area;
    Spin s = spin_start(p.timeout_ns, p.status);
    for (u64 j = first; j < n && !s.failed; j += stride) {
        u64 base = j / ppr * p.hidden, q = j % ppr;
        u32 res = row_packet<DT>((const void*)p.residual, base, p.hidden, q);
        float acc[2];
        ll_poll_sum<DT>(inbox, p.ll_packets, j, flag, p.world, s, acc);
        if (!s.failed) store_row_packet<DT>((void*)p.residual, base, p.hidden, q, add_residual_packet<DT>(acc, res));
    }
    // A block that failed counts nothing, so its rows are never normalised (the call fails and poisons the
    // communicator, whose counters are not used again).
    if (block_any(s.failed)) return;
    u32* row_count = (u32*)(p.counters + ARX_MAX_BLOCKS * sizeof(u64));
    for (u64 r0 = 0; r0 < rows; r0 += blockDim.x) {
        u64 row = r0 + threadIdx.x;
        u64 mine = row < rows ? block_packets_in(row * ppr, (row + 1) * ppr, blockIdx.x, blockDim.x, stride) : 0;
        bool last = false;
        if (mine) {
            // One acq_rel add (was a fence either side of a relaxed one): it releases the block's r (every thread's,
            // ordered before this one by block_any's barrier) and acquires every other block's r of the row, each
            // released so when it counted, before the reads, which the barrier below orders after this for every
            // thread of the block.
            last = add_acq_rel_gpu(&row_count[row], (u32)mine) + mine == ppr;
            if (last) row_count[row] = 0;
        }
        s_last[threadIdx.x] = last;
        __syncthreads();
        for (u64 k = 0; k < blockDim.x && r0 + k < rows; ++k)
            if (s_last[k])
                rms_norm_row<DT>((const void*)p.residual, 0, (const void*)p.weight, out, (r0 + k) * p.hidden, p.hidden,
                                 p.eps);
        __syncthreads();
    }
    ll_clean(p, epoch);
}

// The fused copy-in (`copy_from`): each block copies into this rank's registered input exactly the part that the
// same block of every rank reads after the phase-0 barrier, which publishes it. Safe to overwrite: the previous
// call ended only after every peer had finished reading this rank's input (its last barrier, or its packets).
template <int DT> ARX_DEV void zc_1shot(const TunedParams& p, const u64* in, const u64* out) {
    typedef Elem<DT> E;
    u64 epoch = next_epoch(p.counters);
    Range r = block_range(Range{0, p.count}, blockIdx.x, gridDim.x, E::VEC);
    if (p.copy_from) copy_range<DT, true>((const void*)p.copy_from, (void*)pick(in, p.rank), r);
    if (!tuned_barrier(p, 0, epoch)) return;
    reduce_range<DT>(in, p.world, (void*)pick(out, p.rank), r, (const void*)p.bias);
    if (!tuned_barrier(p, 1, epoch)) return;
    ll_clean(p, epoch);
}

// zc_1shot with the residual add and RMSNorm (arx/norm.h): blocks own whole rows (row_range, ARX_NORM_LANES threads),
// copy them in when asked (what the same block of every rank reads), and after the phase-0 barrier sum them from
// every rank's input in place, add the residual and normalise; phase 1 still tells the peers this rank's input is
// free.
template <int DT> ARX_DEV void zc_1shot_norm(const TunedParams& p, const u64* in, const u64* out) {
    u64 epoch = next_epoch(p.counters);
    Range mine = row_range(Range{0, p.count / p.hidden}, blockIdx.x, gridDim.x);
    if (p.copy_from)
        copy_range<DT, true>((const void*)p.copy_from, (void*)pick(in, p.rank),
                             Range{mine.lo * p.hidden, mine.hi * p.hidden});
    if (!tuned_barrier(p, 0, epoch)) return;
    void* y = (void*)pick(out, p.rank);
    for (u64 row = mine.lo; row < mine.hi; ++row)
        add_rms_norm_row<DT>(in, p.world, (void*)p.residual, (const void*)p.weight, y, row * p.hidden, p.hidden, p.eps);
    if (!tuned_barrier(p, 1, epoch)) return;
    ll_clean(p, epoch);
}

// The inputs a zero-copy two-shot sums its shard from: every rank's registered input, but this rank's own from the
// caller's (`copy_from`) when the copy-in is fused, as the fused copy-ins (copy_in_shards, zc_2shot_norm_k's) leave
// out the shard that no peer reads.
ARX_DEV void shard_views(const TunedParams& p, const u64* in, u64* views) {
#pragma unroll
    for (u32 q = 0; q < ARX_MAX_RANKS; ++q) views[q] = q == p.rank && p.copy_from ? p.copy_from : in[q];
}

// Copies the row at `base` of rank `rank`'s output into every other rank's (the two-shot's push of r), each thread
// the elements it wrote in add_residual_row, so no block sync is needed between the two.
template <int DT> ARX_DEV void push_row(const u64* out, u32 world, u32 rank, u64 base, u32 hidden) {
    typedef Elem<DT> E;
    const void* src = (const void*)pick(out, rank);
    if (rows_in_vectors<DT>(hidden)) {
        u64 off = base * E::SIZE;
        for (u64 v = threadIdx.x; v < hidden / E::VEC; v += ARX_NORM_LANES) {
            vec16 x = ((const vec16*)((const char*)src + off))[v];
#pragma unroll
            for (u32 d = 0; d < ARX_MAX_RANKS; ++d)
                if (d < world && d != rank) ((vec16*)((char*)out[d] + off))[v] = x;
        }
        return;
    }
    ARX_NORM_FOR_OWN_ELEMENTS(j, hidden) {
        float x = E::load(src, base + j);
#pragma unroll
        for (u32 d = 0; d < ARX_MAX_RANKS; ++d)
            if (d < world && d != rank) E::store((void*)out[d], base + j, x);
    }
}

// zc_2shot with the residual add and RMSNorm (arx/norm.h), ARX_NORM_LANES threads per block: the rows split among the
// ranks (row_range), each rank's share among its blocks. Block b copies in, when asked, block b's rows of every peer's
// share (what block b of that peer reads; its own share it sums from the caller's input); PUSH
// (symm_zc_2shot_push_norm) writes them instead into slot `rank` of every share owner's staging half of this epoch's
// parity (slots of the largest share's rows), as zc_2shot_push does. Past phase 0 it sums its rows of this rank's
// share from every rank's input (PUSH: from the slots), adds this rank's residual (the same on every rank) and pushes
// r into every rank's output. Past phase 1 (block b of every rank has pushed) it normalises block b's rows of every
// share from this rank's output: r copied into the residual, y over r. A peer pushes into this output (or a slot of
// this half) again only past the next call's phase 0 (the half's next but one), which this block reaches after.
template <int DT, bool PUSH> ARX_DEV void zc_2shot_norm_k(const TunedParams& p, const u64* in, const u64* out) {
    typedef Elem<DT> E;
    u64 epoch = next_epoch(p.counters);
    Range all = Range{0, p.count / p.hidden};
    u64 half = (epoch & 1) * p.half_bytes;
    u64 per = div_ceil(all.hi, p.world);
    for (u32 s = 0; s < p.world && (PUSH || p.copy_from); ++s) {
        if (!PUSH && s == p.rank) continue;  // summed from the caller's input (shard_views)
        Range share = row_range(all, s, p.world);
        Range m = row_range(share, blockIdx.x, gridDim.x);
        // The slot viewed so that row i of the share sits at row i (unsigned wrap-around when rank * per < lo).
        u64 dst = PUSH ? pick(p.staging, s) + half + ((u64)p.rank * per - share.lo) * p.hidden * E::SIZE
                       : pick(in, p.rank);
        copy_range<DT, true>((const void*)p.copy_from, (void*)dst, Range{m.lo * p.hidden, m.hi * p.hidden});
    }
    if (!tuned_barrier(p, 0, epoch)) return;
    void* mine = (void*)pick(out, p.rank);
    Range share = row_range(all, p.rank, p.world);
    u64 views[ARX_MAX_RANKS];
    if (PUSH) {
        u64 own = pick(p.staging, p.rank) + half;
#pragma unroll
        for (u32 q = 0; q < ARX_MAX_RANKS; ++q)
            views[q] = q < p.world ? own + ((u64)q * per - share.lo) * p.hidden * E::SIZE : 0;
    } else {
        shard_views(p, in, views);
    }
    Range rows = row_range(share, blockIdx.x, gridDim.x);
    for (u64 row = rows.lo; row < rows.hi; ++row) {
        add_residual_row<DT>(views, p.world, (const void*)p.residual, mine, row * p.hidden, p.hidden);
        push_row<DT>(out, p.world, p.rank, row * p.hidden, p.hidden);
    }
    if (!tuned_barrier(p, 1, epoch)) return;
    for (u32 s = 0; s < p.world; ++s) {
        Range m = row_range(row_range(all, s, p.world), blockIdx.x, gridDim.x);
        for (u64 row = m.lo; row < m.hi; ++row)
            rms_norm_row<DT>(mine, (void*)p.residual, (const void*)p.weight, mine, row * p.hidden, p.hidden, p.eps);
    }
    ll_clean(p, epoch);
}
template <int DT> ARX_DEV void zc_2shot_norm(const TunedParams& p, const u64* in, const u64* out) {
    zc_2shot_norm_k<DT, false>(p, in, out);
}
template <int DT> ARX_DEV void zc_2shot_push_norm(const TunedParams& p, const u64* in, const u64* out) {
    zc_2shot_norm_k<DT, true>(p, in, out);
}

// out[d][i] = sum over ranks of in[i] at one element i, for every d < outs.
template <int DT> ARX_DEV void push_at(u32 world, const u64* in, u32 outs, const u64* out, u64 i, const void* bias) {
    float acc = sum_at<DT, false>(in, world, i, bias);
#pragma unroll
    for (u32 d = 0; d < ARX_MAX_RANKS; ++d)
        if (d < outs) Elem<DT>::store((void*)out[d], i, acc);
}

// out[d][i] = sum over ranks of in[i], for every d < outs: one reduction, stored to several buffers (every rank's
// output, or this rank's output and staging).
template <int DT>
ARX_DEV void reduce_push(u32 world, const u64* in, u32 outs, const u64* out, Range r, const void* bias) {
    typedef Elem<DT> E;
    u64 h, z;
    split<DT>((const void*)in[0], r, h, z);
    for (u64 i = r.lo + threadIdx.x; i < h; i += blockDim.x) push_at<DT>(world, in, outs, out, i, bias);
    for (u64 v = threadIdx.x; v < (z - h) / E::VEC; v += blockDim.x) {
        vec16 sum = sum_vec<DT, false>(in, world, h * E::SIZE, v, bias);
#pragma unroll
        for (u32 d = 0; d < ARX_MAX_RANKS; ++d)
            if (d < outs) ((vec16*)((char*)out[d] + h * E::SIZE))[v] = sum;
    }
    for (u64 i = z + threadIdx.x; i < r.hi; i += blockDim.x) push_at<DT>(world, in, outs, out, i, bias);
}

// The fused copy-in of the zero-copy two-shots: block b copies block b's part of every peer's shard (what block b of
// that peer reads past the phase-0 barrier) from `copy_from` into this rank's registered input. This rank's own shard
// is read by no peer, so it stays where it is and is summed from there (shard_views): a copy of 1/world less.
template <int DT> ARX_DEV void copy_in_shards(const TunedParams& p, const u64* in, u64 shard) {
    for (u32 s = 0; s < p.world; ++s)
        if (s != p.rank)
            copy_range<DT, true>((const void*)p.copy_from, (void*)pick(in, p.rank),
                                 block_range(shard_range(p.count, shard, s), blockIdx.x, gridDim.x, Elem<DT>::VEC));
}

template <int DT> ARX_DEV void zc_2shot(const TunedParams& p, const u64* in, const u64* out) {
    typedef Elem<DT> E;
    u64 epoch = next_epoch(p.counters);
    u64 shard = shard_elems(p.count, p.world, E::VEC);
    if (p.copy_from) copy_in_shards<DT>(p, in, shard);
    if (!tuned_barrier(p, 0, epoch)) return;
    u64 views[ARX_MAX_RANKS];
    shard_views(p, in, views);
    reduce_push<DT>(p.world, views, p.world, out,
                    block_range(shard_range(p.count, shard, p.rank), blockIdx.x, gridDim.x, E::VEC),
                    (const void*)p.bias);
    if (!tuned_barrier(p, 1, epoch)) return;
    ll_clean(p, epoch);
}

// symm_zc_2shot_pull: zc_2shot whose all-gather pulls (as car's two-shot gathers). Past phase 0 each rank sums its
// shard into its own output and into its staging half of this epoch's parity; past phase 1 block b copies block b's
// part of every peer's shard from that peer's half into its output. No rank writes a peer's memory, so the output
// may be any buffer of the caller's (no copy-out) and ranks whose outputs lie in different places run one protocol.
// A half is written again only in call e + 2 (zc_2shot_push's and symm_epoch_1shot's parity rule), by ranks that
// have seen every peer enter call e + 1, so after every pull of call e.
template <int DT> ARX_DEV void zc_2shot_pull(const TunedParams& p, const u64* in, const u64* out) {
    typedef Elem<DT> E;
    u64 epoch = next_epoch(p.counters);
    u64 half = (epoch & 1) * p.half_bytes;
    u64 shard = shard_elems(p.count, p.world, E::VEC);
    if (p.copy_from) copy_in_shards<DT>(p, in, shard);
    if (!tuned_barrier(p, 0, epoch)) return;
    u64 mine[2] = {pick(out, p.rank), pick(p.staging, p.rank) + half};
    u64 views[ARX_MAX_RANKS];
    shard_views(p, in, views);
    reduce_push<DT>(p.world, views, 2, mine,
                    block_range(shard_range(p.count, shard, p.rank), blockIdx.x, gridDim.x, E::VEC),
                    (const void*)p.bias);
    if (!tuned_barrier(p, 1, epoch)) return;
    for (u32 s = 0; s < p.world; ++s)
        if (s != p.rank)
            copy_range<DT>((const void*)(pick(p.staging, s) + half), (void*)mine[0],
                           block_range(shard_range(p.count, shard, s), blockIdx.x, gridDim.x, E::VEC));
    ll_clean(p, epoch);
}

// symm_zc_2shot_push: zc_2shot with the input (copy_from, wherever it lies) pushed, so every remote access is a write
// (on AMD xGMI remote writes have been measured far faster than remote reads). Block b copies its part of every shard s
// of the input into rank s's
// staging half of this epoch's parity, in slot `rank` (slots of `shard` elements); past phase 0 it sums its part of
// this rank's shard from the slots of its own staging and pushes the sums into every rank's output as zc_2shot does.
// A peer writes this half again only in call e + 2, past the phase-0 barrier of call e + 1, which this block reaches
// only after this call's reads; symm_epoch_1shot, the other user of the halves, keeps the same parity rule.
template <int DT> ARX_DEV void zc_2shot_push(const TunedParams& p, const u64* in, const u64* out) {
    typedef Elem<DT> E;
    u64 epoch = next_epoch(p.counters);
    u64 half = (epoch & 1) * p.half_bytes;
    u64 shard = shard_elems(p.count, p.world, E::VEC);
    const void* src = (const void*)p.copy_from;  // always the caller's input: run_design sets it for this kernel
    // Slot q of a rank's half, viewed so that element i of shard s (which starts at lo) sits at index i; unsigned
    // wrap-around keeps the address right when q * shard < lo.
    for (u32 s = 0; s < p.world; ++s) {
        Range r = shard_range(p.count, shard, s);
        u64 slot = pick(p.staging, s) + half + ((u64)p.rank * shard - r.lo) * E::SIZE;
        copy_range<DT, true>(src, (void*)slot, block_range(r, blockIdx.x, gridDim.x, E::VEC));
    }
    if (!tuned_barrier(p, 0, epoch)) return;
    Range mine = shard_range(p.count, shard, p.rank);
    u64 own = pick(p.staging, p.rank) + half;
    u64 slots[ARX_MAX_RANKS];
#pragma unroll
    for (u32 q = 0; q < ARX_MAX_RANKS; ++q) slots[q] = q < p.world ? own + ((u64)q * shard - mine.lo) * E::SIZE : 0;
    reduce_push<DT>(p.world, slots, p.world, out, block_range(mine, blockIdx.x, gridDim.x, E::VEC),
                    (const void*)p.bias);
    if (!tuned_barrier(p, 1, epoch)) return;
    ll_clean(p, epoch);
}

template <int DT> ARX_DEV void symm_epoch_1shot(TunedParams p) {
    typedef Elem<DT> E;
    u64 epoch = next_epoch(p.counters);
    u64 half = (epoch & 1) * p.half_bytes;
    // Constant indices only (see sum_at), so the views stay in registers; car's kernel keeps them in local memory.
    u64 views[ARX_MAX_RANKS];
#pragma unroll
    for (u32 q = 0; q < ARX_MAX_RANKS; ++q) views[q] = q < p.world ? p.staging[q] + half : 0;
    Range r = block_range(Range{0, p.count}, blockIdx.x, gridDim.x, E::VEC);
    copy_range<DT, true>((const void*)p.inputs[p.rank], (void*)(p.staging[p.rank] + half), r);
    if (!tuned_barrier(p, 0, epoch)) return;
    reduce_range<DT>(views, p.world, (void*)p.outputs[p.rank], r, (const void*)p.bias);
    ll_clean(p, epoch);
}

// symm_epoch_1shot with the residual add and RMSNorm (arx/norm.h), ARX_NORM_LANES threads per block: blocks own whole
// rows (row_range), copy them into this rank's staging half of the epoch's parity, and past the one barrier sum them
// from every rank's half, add the residual and normalise, as zc_1shot_norm does from the inputs.
template <int DT> ARX_DEV void symm_epoch_1shot_norm(TunedParams p) {
    u64 epoch = next_epoch(p.counters);
    u64 half = (epoch & 1) * p.half_bytes;
    u64 views[ARX_MAX_RANKS];
#pragma unroll
    for (u32 q = 0; q < ARX_MAX_RANKS; ++q) views[q] = q < p.world ? p.staging[q] + half : 0;
    Range mine = row_range(Range{0, p.count / p.hidden}, blockIdx.x, gridDim.x);
    copy_range<DT, true>((const void*)pick(p.inputs, p.rank), (void*)pick(views, p.rank),
                         Range{mine.lo * p.hidden, mine.hi * p.hidden});
    if (!tuned_barrier(p, 0, epoch)) return;
    void* y = (void*)pick(p.outputs, p.rank);
    for (u64 row = mine.lo; row < mine.hi; ++row)
        add_rms_norm_row<DT>(views, p.world, (void*)p.residual, (const void*)p.weight, y, row * p.hidden, p.hidden,
                             p.eps);
    ll_clean(p, epoch);
}

// symm_zc_2shot_ll: two-shot with one barrier. Phase 0 (epoch flags): every input is ready. Each rank sums its shard
// from every peer's registered input and pushes the result as flag-and-data packets (as symm_ll's) into slot
// `rank` of every peer's packet area; each rank then polls its area for every shard and unpacks into its output.
// Receiving a peer's shard means that peer has finished reading every input, so no exit barrier is needed: the
// kernel ends only after every peer is done with this rank's input. Areas alternate by epoch parity, safe for
// symm_ll's reason (a peer writes area e%2 again in call e+2, past the phase-0 barrier of call e+1).
template <int DT> ARX_DEV void zc_2shot_ll(const TunedParams& p, const u64* in, const u64* out) {
    typedef Elem<DT> E;
    const int per = 4 / E::SIZE;  // elements per packet
    u64 epoch = next_epoch(p.counters);
    if (!tuned_barrier(p, 0, epoch)) return;
    u64 flag = ll_flag(epoch);
    u64 area = (epoch & 1) * ARX_MAX_RANKS * p.ll_packets;
    u64 shard = shard_elems(p.count, p.world, E::VEC);  // a multiple of `per`
    u64 stride = (u64)gridDim.x * blockDim.x;
    u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    Range mine = shard_range(p.count, shard, p.rank);
    u64 n = (mine.hi - mine.lo + per - 1) / per;
    for (u64 j = first; j < n; j += stride) {
        u64 e = mine.lo + j * per;
        float acc[2] = {0.0f, 0.0f};
        if (e + per <= mine.hi) {
            u32 w[ARX_MAX_RANKS];  // all loads in flight together
#pragma unroll
            for (u32 src = 0; src < ARX_MAX_RANKS; ++src)
                if (src < p.world) w[src] = ((const u32*)in[src])[e / per];
            for (int q = 0; q < per; ++q) acc[q] = payload<DT>(w[0], q);
#pragma unroll
            for (u32 src = 1; src < ARX_MAX_RANKS; ++src)
                if (src < p.world)
                    for (int q = 0; q < per; ++q) acc[q] += payload<DT>(w[src], q);
            if (p.bias)
                for (int q = 0; q < per; ++q) acc[q] += E::load((const void*)p.bias, e + q);
        } else {  // a half-filled last packet (odd count of 2-byte elements): never read past the inputs
            acc[0] = sum_at<DT, false>(in, p.world, e, (const void*)p.bias);
        }
        ll_push(p.packets, p.world, area + p.rank * p.ll_packets + j, pack_payload<DT>(acc), flag);
    }
    const u64* inbox = (const u64*)p.packets[p.rank] + area;
    void* mine_out = (void*)pick(out, p.rank);
    for (u32 src = 0; src < p.world; ++src) {
        Range r = shard_range(p.count, shard, src);
        u64 m = (r.hi - r.lo + per - 1) / per;
        for (u64 j = first; j < m; j += stride) {
            Spin s = spin_start(p.timeout_ns, p.status);
            u32 w = LlPacket::poll(inbox + src * p.ll_packets + j, j, flag, s, src);
            if (s.failed) return;
            u64 e = r.lo + j * per;
            if (e + per <= r.hi) {
                ((u32*)mine_out)[e / per] = w;
            } else {
                E::store(mine_out, e, payload<DT>(w, 0));
            }
        }
    }
    ll_clean(p, epoch);
}

// symm_zc_2shot_ll with the residual add and RMSNorm, ARX_NORM_LANES threads per block: the rows split among the ranks
// and each share among the blocks, as symm_zc_2shot_norm's. Past the phase-0 barrier block b sums its rows of this
// rank's share from every input and adds the residual (r, into this rank's output), then sends r as packets (rows in
// symm_ll_norm's layout, from the share's first row) to every rank; it polls block b's rows of every other share
// into its output and normalises all of them there: r into the residual, y over r. Block b of a share's owner sends
// exactly the rows block b of every rank polls, so, as in symm_zc_2shot_ll, receiving them means that block is done
// reading this rank's input: no exit barrier. When the flags wrap, each block zeroes the slots it polled (and its
// own, which nobody polls) and its part of those past every share's rows, so no block zeroes a slot another polls.
template <int DT> ARX_DEV void zc_2shot_ll_norm(const TunedParams& p, const u64* in, const u64* out) {
    u64 epoch = next_epoch(p.counters);
    if (!tuned_barrier(p, 0, epoch)) return;
    u64 flag = ll_flag(epoch);
    u64 area = (epoch & 1) * ARX_MAX_RANKS * p.ll_packets;
    u64 ppr = ll_row_packets<DT>(p.hidden);
    Range all = Range{0, p.count / p.hidden};
    void* mine = (void*)pick(out, p.rank);
    Range share = row_range(all, p.rank, p.world);
    Range rows = row_range(share, blockIdx.x, gridDim.x);
    for (u64 row = rows.lo; row < rows.hi; ++row)
        add_residual_row<DT>(in, p.world, (const void*)p.residual, mine, row * p.hidden, p.hidden);
    __syncthreads();  // r of the block's rows before other threads of the block pack it
    for (u64 j = threadIdx.x; j < (rows.hi - rows.lo) * ppr; j += blockDim.x) {
        u64 row = rows.lo + j / ppr;
        ll_push(p.packets, p.world, area + p.rank * p.ll_packets + (row - share.lo) * ppr + j % ppr,
                row_packet<DT>(mine, row * p.hidden, p.hidden, j % ppr), flag);
    }
    const u64* inbox = (const u64*)p.packets[p.rank] + area;
    Spin s = spin_start(p.timeout_ns, p.status);
    for (u32 src = 0; src < p.world && !s.failed; ++src) {
        if (src == p.rank) continue;
        Range sh = row_range(all, src, p.world);
        Range m = row_range(sh, blockIdx.x, gridDim.x);
        for (u64 j = threadIdx.x; j < (m.hi - m.lo) * ppr && !s.failed; j += blockDim.x) {
            u64 at = (m.lo - sh.lo) * ppr + j;
            u32 w = LlPacket::poll(inbox + src * p.ll_packets + at, at, flag, s, src);
            if (!s.failed) store_row_packet<DT>(mine, (m.lo + j / ppr) * p.hidden, p.hidden, j % ppr, w);
        }
    }
    // Ends the block at once if a wait failed, and orders every thread's stores before the norm's reads.
    if (block_any(s.failed)) return;
    for (u32 src = 0; src < p.world; ++src) {
        Range m = row_range(row_range(all, src, p.world), blockIdx.x, gridDim.x);
        for (u64 row = m.lo; row < m.hi; ++row)
            rms_norm_row<DT>(mine, (void*)p.residual, (const void*)p.weight, mine, row * p.hidden, p.hidden, p.eps);
    }
    if (ll_flag(epoch + 2) > ll_flag(epoch)) return;
    u64* own = (u64*)p.packets[p.rank] + area;
    for (u32 src = 0; src < ARX_MAX_RANKS; ++src) {
        Range sh = src < p.world ? row_range(all, src, p.world) : Range{0, 0};
        Range m = row_range(sh, blockIdx.x, gridDim.x);
        for (u64 j = (m.lo - sh.lo) * ppr + threadIdx.x; j < (m.hi - sh.lo) * ppr; j += blockDim.x)
            st_relaxed_sys(own + src * p.ll_packets + j, 0);
        for (u64 j = (sh.hi - sh.lo) * ppr + (u64)blockIdx.x * blockDim.x + threadIdx.x; j < p.ll_packets;
             j += (u64)gridDim.x * blockDim.x)
            st_relaxed_sys(own + src * p.ll_packets + j, 0);
    }
}

// Each zero-copy design twice: views from the parameters, and from the peer table.
#define ARX_ZC_ENTRIES(NAME, BODY)                                                                     \
    template <int DT> ARX_DEV void NAME(TunedParams p) { BODY<DT>(p, p.inputs, p.outputs); }           \
    template <int DT> ARX_DEV void NAME##_table(TunedParams p) {                                      \
        u64 in[ARX_MAX_RANKS], out[ARX_MAX_RANKS];                                                    \
        load_peer_table(p, in, out);                                                                  \
        BODY<DT>(p, in, out);                                                                         \
    }
ARX_ZC_ENTRIES(symm_zc_1shot, zc_1shot)
ARX_ZC_ENTRIES(symm_zc_1shot_norm, zc_1shot_norm)
ARX_ZC_ENTRIES(symm_zc_2shot, zc_2shot)
ARX_ZC_ENTRIES(symm_zc_2shot_pull, zc_2shot_pull)
ARX_ZC_ENTRIES(symm_zc_2shot_push, zc_2shot_push)
ARX_ZC_ENTRIES(symm_zc_2shot_norm, zc_2shot_norm)
ARX_ZC_ENTRIES(symm_zc_2shot_push_norm, zc_2shot_push_norm)
ARX_ZC_ENTRIES(symm_zc_2shot_ll, zc_2shot_ll)
ARX_ZC_ENTRIES(symm_zc_2shot_ll_norm, zc_2shot_ll_norm)

ARX_INSTANTIATE_BOUNDED(symm_ll, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_ll_norm, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_zc_2shot_ll, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_epoch_1shot, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_epoch_1shot_norm, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_zc_1shot, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_zc_2shot, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_zc_1shot_table, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_zc_1shot_norm, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_zc_1shot_norm_table, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_zc_2shot_table, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_zc_2shot_pull, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_zc_2shot_pull_table, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_zc_2shot_push, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_zc_2shot_push_table, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_zc_2shot_norm, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_zc_2shot_norm_table, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_zc_2shot_push_norm, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_zc_2shot_push_norm_table, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_zc_2shot_ll_table, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_zc_2shot_ll_norm, TunedParams, ARX_TUNED_THREADS)
ARX_INSTANTIATE_BOUNDED(symm_zc_2shot_ll_norm_table, TunedParams, ARX_TUNED_THREADS)
