// car: fbgemm-style custom allreduce over IPC-mapped buffers, with epoch flags (remote release store, local
// wait_epoch, never reset). Fixed against upstream's defects: every block signals for the slice it copied,
// buffers alternate by epoch parity (so the next call never overwrites what a peer still reads), and the sum
// order is the same on every rank. The plain two-shot takes its input as upstream's does, by a memcpy before the
// kernel into a fixed input buffer (car_2shot_k says why that needs no exit barrier).
//
// The ablation variants (crates/car's `Variant`) are car's kernels with one factor changed, chosen at compile time
// by the knob bits K, so the base kernels (K = 0) are exactly car's.

#include "arx/instantiate.h"
#include "arx/norm.h"
#include "arx/reduce.h"
#include "arx/sync.h"

struct CarParams {
    u64 bufs[ARX_MAX_RANKS];   // every rank's data buffer (two halves, by epoch parity), mapped here
    u64 flags[ARX_MAX_RANKS];  // every rank's flag array: u64 [ARX_MAX_BLOCKS][ARX_PHASES][ARX_MAX_RANKS]
    u64 counters;              // this rank's u64 [ARX_MAX_BLOCKS] epoch counters, then CAR_ONEBLOCK's words
    u64 input;
    u64 output;
    u64 count;
    u64 half_bytes;
    u64 timeout_ns;
    u64 table;       // CAR_TABLE: u64 [2 parities][ARX_MAX_RANKS] views, then [ARX_MAX_RANKS] flag arrays
    u64 slot_bytes;  // CAR_PUSH: bytes between two sources' slots in a half
    u32 rank;
    u32 world;
    u32 dtype;
    u32 tag;         // the kernel's epoch-flag tag (arx/sync.h, collective_core::flag_tags)
    u64 status;  // the communicator's status words (arx/sync.h), which every wait watches
    u64 bias;    // allreduce: added to every sum after the ranks' inputs (car's `z`), or 0
    u64 residual;  // the *_norm kernels (arx/norm.h): residual, written back as r
    u64 weight;    // ... the norm's weight, `hidden` elements
    u32 hidden;    // ... elements of a row (and car_rs_cols' row)
    float eps;
    u64 inputs[ARX_MAX_RANKS];  // car_2shot_k: every rank's fixed input buffer, which the host fills before the kernel
};

#define CAR_ROUND 1     // the sum rounded to the element type after every add, not accumulated in f32
#define CAR_TABLE 2     // peer pointers read from a device array, not from the kernel arguments
#define CAR_PUSH 4      // one-shot: push the input into slot `rank` of every peer's buffer, then sum locally
#define CAR_ONEBLOCK 8  // one-shot: block 0 alone runs the cross-rank barrier for the whole grid
#define CAR_EXIT 16     // two-shot: a third barrier at exit, as torch's two-shot has
#define CAR_CAS 32      // torch's compare-and-swap handshake on signal pads instead of epoch flags

ARX_DEV u64 car_next_epoch(const CarParams& p) { return next_epoch(p.counters); }

template <int K> ARX_DEV const u64* car_flags(const CarParams& p) {
    return (K & CAR_TABLE) ? (const u64*)p.table + 2 * ARX_MAX_RANKS : p.flags;
}

// False (in every thread of the block) when a peer did not arrive: the kernel then returns.
template <int K> ARX_DEV bool car_barrier(const CarParams& p, u32 ph, u64 epoch) {
    if (K & CAR_CAS) return cas_barrier(car_flags<K>(p), p.rank, p.world, p.timeout_ns, p.status);
    return flag_barrier(car_flags<K>(p), p.rank, p.world, ph, epoch, p.tag, p.timeout_ns, p.status);
}

template <int K> ARX_DEV void car_views(const CarParams& p, u64 epoch, u64* views) {
    if (K & CAR_TABLE) {
        const u64* t = (const u64*)p.table + (epoch & 1) * ARX_MAX_RANKS;
        for (u32 r = 0; r < p.world; ++r) views[r] = t[r];
    } else {
        u64 off = (epoch & 1) * p.half_bytes;
        for (u32 r = 0; r < p.world; ++r) views[r] = p.bufs[r] + off;
    }
}

// CAR_ONEBLOCK: every block of this rank reports its copy-in done; block 0 waits for them all, runs the cross-rank
// barrier in its own slot, and releases the other blocks. Words after the epoch counters: u64 [ARX_MAX_BLOCKS]
// arrivals, then one release word, all epoch-valued (never reset). All blocks are co-resident (the launch cap).
template <int K> ARX_DEV bool one_block_barrier(const CarParams& p, u64 epoch) {
    u64* arrived = (u64*)p.counters + ARX_MAX_BLOCKS;
    u64* release = arrived + ARX_MAX_BLOCKS;
    __shared__ u32 s_failed;
    if (threadIdx.x == 0) s_failed = 0;
    __syncthreads();
    if (blockIdx.x == 0) {
        for (u32 b = threadIdx.x + 1; b < gridDim.x; b += blockDim.x)
            if (!wait_epoch(arrived + b, epoch, 0, p.timeout_ns, p.status, p.rank, ARX_WAIT_BLOCKS)) s_failed = 1;
        // A failed wait set the abort word, which ends the other blocks' waits for the release too.
        if (!car_barrier<K>(p, 0, epoch) || s_failed) return false;
        if (threadIdx.x == 0) st_release_sys(release, epoch);
    } else {
        if (threadIdx.x == 0) {
            st_release_sys(arrived + blockIdx.x, epoch);
            if (!wait_epoch(release, epoch, 0, p.timeout_ns, p.status, p.rank, ARX_WAIT_BLOCKS)) s_failed = 1;
        }
        __syncthreads();
    }
    return s_failed == 0;
}

// CAR_PUSH: dst[d][i] = src[i] for every rank d (one load, `world` stores).
template <int DT> ARX_DEV void copy_to_all(const void* src, const u64* dsts, u32 world, Range r) {
    typedef Elem<DT> E;
    u64 h, z;
    split<DT>(src, r, h, z);
    for (u64 i = r.lo + threadIdx.x; i < h; i += blockDim.x)
        for (u32 d = 0; d < world; ++d) E::store((void*)dsts[d], i, E::load(src, i));
    const vec16* s = (const vec16*)((const char*)src + h * E::SIZE);
    for (u64 v = threadIdx.x; v < (z - h) / E::VEC; v += blockDim.x) {
        vec16 x = s[v];
#pragma unroll
        for (u32 d = 0; d < ARX_MAX_RANKS; ++d)
            if (d < world) st_stage((vec16*)((char*)dsts[d] + h * E::SIZE) + v, x);
    }
    for (u64 i = z + threadIdx.x; i < r.hi; i += blockDim.x)
        for (u32 d = 0; d < world; ++d) E::store((void*)dsts[d], i, E::load(src, i));
}

template <int DT, int K> ARX_DEV void car_1shot_k(CarParams p) {
    typedef Elem<DT> E;
    const bool round = (K & CAR_ROUND) != 0;
    u64 epoch = car_next_epoch(p);
    u64 views[ARX_MAX_RANKS];
    car_views<K>(p, epoch, views);
    Range r = block_range(Range{0, p.count}, blockIdx.x, gridDim.x, E::VEC);
    if (K & CAR_PUSH) {
        u64 mine[ARX_MAX_RANKS];  // slot `rank` of every rank's half; then every source's slot of this rank's
        for (u32 d = 0; d < p.world; ++d) mine[d] = views[d] + p.rank * p.slot_bytes;
        copy_to_all<DT>((const void*)p.input, mine, p.world, r);
        if (!car_barrier<K>(p, 0, epoch)) return;
        for (u32 s = 0; s < p.world; ++s) mine[s] = views[p.rank] + s * p.slot_bytes;
        reduce_range<DT, round>(mine, p.world, (void*)p.output, r, (const void*)p.bias);
        return;
    }
    copy_range<DT, true>((const void*)p.input, (void*)views[p.rank], r);
    if (!((K & CAR_ONEBLOCK) ? one_block_barrier<K>(p, epoch) : car_barrier<K>(p, 0, epoch))) return;
    reduce_range<DT, round>(views, p.world, (void*)p.output, r, (const void*)p.bias);
}

// Two-shot, with its input copied in as upstream's is: the host enqueues a memcpy of the call's input into this
// rank's fixed input buffer (p.inputs[rank]) before the kernel, which copies nothing in. Barrier 0 (every rank's
// input is in place); block b sums its part of this rank's shard from every rank's input buffer into this rank's
// parity half; barrier 1; block b gathers its part of every shard from the ranks' parity halves into the output.
// Why no exit barrier, although the input buffer is one fixed buffer (upstream's, which keeps its sums there too,
// needs one):
// - the input buffers: a peer's block reads them only in its reduce, which precedes its barrier-1 signal; this
//   rank's next memcpy into its input buffer is stream-ordered after this kernel, every block of which passed
//   barrier 1, so after every peer's reads of this call; and a peer reads the new input only after barrier 0 of the
//   next call, which this rank signals after that memcpy.
// - the sums, which peers read after barrier 1, where nothing orders them before this rank's next memcpy: they go
//   to the parity half, not the input buffer, and a half is rewritten two calls later, after that call's barrier 0
//   (by which every peer has finished this call). One half would do for this kernel alone, whose sums are written
//   after barrier 0; the *_norm kernels, which share the halves and the epochs, copy in before it and need two.
// CAR_EXIT (the ablation) keeps this copy-in and adds a third barrier at exit, as torch's two-shot has.
template <int DT, int K> ARX_DEV void car_2shot_k(CarParams p) {
    typedef Elem<DT> E;
    u64 epoch = car_next_epoch(p);
    u64 views[ARX_MAX_RANKS];
    car_views<K>(p, epoch, views);
    u64 shard = shard_elems(p.count, p.world, E::VEC);
    if (!car_barrier<K>(p, 0, epoch)) return;
    Range mine = block_range(shard_range(p.count, shard, p.rank), blockIdx.x, gridDim.x, E::VEC);
    reduce_range<DT>(p.inputs, p.world, (void*)views[p.rank], mine, (const void*)p.bias);
    if (!car_barrier<K>(p, 1, epoch)) return;
    for (u32 s = 0; s < p.world; ++s)
        copy_range<DT>((const void*)views[s], (void*)p.output,
                       block_range(shard_range(p.count, shard, s), blockIdx.x, gridDim.x, E::VEC));
    if (K & CAR_EXIT) car_barrier<K>(p, 2, epoch);
}

// Reduce-scatter: the first half of two-shot, with exact count / world shards; rank r's shard goes to output[0..).
template <int DT> ARX_DEV void car_rs(CarParams p) {
    typedef Elem<DT> E;
    u64 epoch = car_next_epoch(p);
    u64 views[ARX_MAX_RANKS];
    car_views<0>(p, epoch, views);
    u64 shard = p.count / p.world;
    for (u32 s = 0; s < p.world; ++s)
        copy_range<DT, true>((const void*)p.input, (void*)views[p.rank],
                             block_range(shard_range(p.count, shard, s), blockIdx.x, gridDim.x, E::VEC));
    if (!car_barrier<0>(p, 0, epoch)) return;
    Range mine = block_range(shard_range(p.count, shard, p.rank), blockIdx.x, gridDim.x, E::VEC);
    // Shifted so that element i of the sum lands at output[i - shard start].
    u64 out = p.output - (u64)p.rank * shard * E::SIZE;
    reduce_range<DT>(views, p.world, (void*)out, mine);
}

// Reduce-scatter along the last dimension (car's split_last_dim): rows of p.hidden elements, rank r's shard is
// columns [r * hidden / W, (r + 1) * hidden / W) of every row, written densely. Blocks own whole rows: copy in,
// barrier, sum this rank's columns of them.
template <int DT> ARX_DEV void car_rs_cols(CarParams p) {
    typedef Elem<DT> E;
    u64 epoch = car_next_epoch(p);
    u64 views[ARX_MAX_RANKS];
    car_views<0>(p, epoch, views);
    u64 n = p.hidden, cols = n / p.world;
    Range mine = row_range(Range{0, p.count / n}, blockIdx.x, gridDim.x);
    copy_range<DT, true>((const void*)p.input, (void*)views[p.rank], Range{mine.lo * n, mine.hi * n});
    if (!car_barrier<0>(p, 0, epoch)) return;
    for (u64 row = mine.lo; row < mine.hi; ++row)
        for (u64 c = threadIdx.x; c < cols; c += blockDim.x)
            E::store((void*)p.output, row * cols + c, sum_at<DT, false>(views, p.world, row * n + p.rank * cols + c, 0));
}

// All-gather: block b copies its slice of this rank's input into its buffer, then the same slice of every rank's
// buffer s to output + s * count elements (one-shot's copy-in, with copies out in place of the sum).
template <int DT> ARX_DEV void car_ag(CarParams p) {
    typedef Elem<DT> E;
    u64 epoch = car_next_epoch(p);
    u64 views[ARX_MAX_RANKS];
    car_views<0>(p, epoch, views);
    Range r = block_range(Range{0, p.count}, blockIdx.x, gridDim.x, E::VEC);
    copy_range<DT, true>((const void*)p.input, (void*)views[p.rank], r);
    if (!car_barrier<0>(p, 0, epoch)) return;
    for (u32 s = 0; s < p.world; ++s)
        copy_range<DT>((const void*)views[s], (void*)(p.output + s * p.count * E::SIZE), r);
}

// Allreduce + residual add + RMSNorm, one-shot (arx/norm.h): block b copies in its rows, one barrier, then sums,
// adds and normalises them. Launched with ARX_NORM_LANES threads.
template <int DT> ARX_DEV void car_1shot_norm(CarParams p) {
    u64 epoch = car_next_epoch(p);
    u64 views[ARX_MAX_RANKS];
    car_views<0>(p, epoch, views);
    Range mine = row_range(Range{0, p.count / p.hidden}, blockIdx.x, gridDim.x);
    copy_range<DT, true>((const void*)p.input, (void*)views[p.rank], Range{mine.lo * p.hidden, mine.hi * p.hidden});
    if (!car_barrier<0>(p, 0, epoch)) return;
    for (u64 row = mine.lo; row < mine.hi; ++row)
        add_rms_norm_row<DT>(views, p.world, (void*)p.residual, (const void*)p.weight, (void*)p.output,
                             row * p.hidden, p.hidden, p.eps);
}

// Two-shot: shards of whole rows; each rank adds the residual to its own rows' sums (r, in place in its buffer),
// then every rank gathers r into its residual and normalises every row (the norm is cheap next to a second gather).
template <int DT> ARX_DEV void car_2shot_norm(CarParams p) {
    u64 epoch = car_next_epoch(p);
    u64 views[ARX_MAX_RANKS];
    car_views<0>(p, epoch, views);
    u64 rows = p.count / p.hidden;
    u64 shard = div_ceil(rows, p.world);
    for (u32 s = 0; s < p.world; ++s) {
        Range r = row_range(shard_range(rows, shard, s), blockIdx.x, gridDim.x);
        copy_range<DT, true>((const void*)p.input, (void*)views[p.rank], Range{r.lo * p.hidden, r.hi * p.hidden});
    }
    if (!car_barrier<0>(p, 0, epoch)) return;
    Range mine = row_range(shard_range(rows, shard, p.rank), blockIdx.x, gridDim.x);
    for (u64 row = mine.lo; row < mine.hi; ++row)
        add_residual_row<DT>(views, p.world, (const void*)p.residual, (void*)views[p.rank], row * p.hidden, p.hidden);
    if (!car_barrier<0>(p, 1, epoch)) return;
    for (u32 s = 0; s < p.world; ++s) {
        Range r = row_range(shard_range(rows, shard, s), blockIdx.x, gridDim.x);
        for (u64 row = r.lo; row < r.hi; ++row)
            rms_norm_row<DT>((const void*)views[s], (void*)p.residual, (const void*)p.weight, (void*)p.output,
                             row * p.hidden, p.hidden, p.eps);
    }
}

// The unfused sequence's second kernel: the residual add and RMSNorm of an allreduce's result at `input`.
template <int DT> ARX_DEV void car_add_rms_norm(CarParams p) {
    u64 srcs[ARX_MAX_RANKS] = {p.input};
    Range mine = row_range(Range{0, p.count / p.hidden}, blockIdx.x, gridDim.x);
    for (u64 row = mine.lo; row < mine.hi; ++row)
        add_rms_norm_row<DT>(srcs, 1, (void*)p.residual, (const void*)p.weight, (void*)p.output, row * p.hidden,
                             p.hidden, p.eps);
}

// The floor every method pays: the epoch and one barrier, nothing moved.
ARX_KERNEL void car_barrier_only(CarParams p) { car_barrier<0>(p, 0, car_next_epoch(p)); }

ARX_INSTANTIATE_K(car_1shot, car_1shot_k, 0, CarParams)
ARX_INSTANTIATE_K(car_2shot, car_2shot_k, 0, CarParams)
ARX_INSTANTIATE(car_rs, CarParams)
ARX_INSTANTIATE(car_rs_cols, CarParams)
ARX_INSTANTIATE(car_ag, CarParams)
ARX_INSTANTIATE_BOUNDED(car_1shot_norm, CarParams, ARX_NORM_LANES)
ARX_INSTANTIATE_BOUNDED(car_2shot_norm, CarParams, ARX_NORM_LANES)
ARX_INSTANTIATE_BOUNDED(car_add_rms_norm, CarParams, ARX_NORM_LANES)
ARX_INSTANTIATE_K(car_1shot_round, car_1shot_k, CAR_ROUND, CarParams)
ARX_INSTANTIATE_K(car_1shot_ptrtable, car_1shot_k, CAR_TABLE, CarParams)
ARX_INSTANTIATE_K(car_1shot_push, car_1shot_k, CAR_PUSH, CarParams)
ARX_INSTANTIATE_K(car_1shot_oneblock, car_1shot_k, CAR_ONEBLOCK, CarParams)
ARX_INSTANTIATE_K(car_1shot_cas, car_1shot_k, CAR_CAS, CarParams)
ARX_INSTANTIATE_K(car_2shot_3bar, car_2shot_k, CAR_EXIT, CarParams)
