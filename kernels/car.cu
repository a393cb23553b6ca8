// car: fbgemm-style custom allreduce over IPC-mapped buffers, with epoch flags (remote release store, local
// acquire load, never reset). Fixed against upstream's defects: every block signals for the slice it copied,
// buffers alternate by epoch parity (so the next call never overwrites what a peer still reads), and the sum
// order is the same on every rank.

struct CarParams {
    u64 bufs[ARX_MAX_RANKS];   // every rank's data buffer (two halves, by epoch parity), mapped here
    u64 flags[ARX_MAX_RANKS];  // every rank's flag array: u64 [ARX_MAX_BLOCKS][2 phases][ARX_MAX_RANKS]
    u64 counters;              // this rank's per-block epoch counters: u64 [ARX_MAX_BLOCKS]
    u64 input;
    u64 output;
    u64 count;
    u64 half_bytes;
    u64 timeout_ns;
    u32 rank;
    u32 world;
    u32 dtype;
    u32 reserved;
};

ARX_DEV u64 car_next_epoch(const CarParams& p) { return next_epoch(p.counters); }

ARX_DEV void car_barrier(const CarParams& p, u32 ph, u64 epoch) {
    flag_barrier(p.flags, p.rank, p.world, ph, epoch, p.timeout_ns);
}

ARX_DEV void car_views(const CarParams& p, u64 epoch, u64* views) {
    u64 off = (epoch & 1) * p.half_bytes;
    for (u32 r = 0; r < p.world; ++r) views[r] = p.bufs[r] + off;
}

template <int DT> ARX_DEV void car_1shot(CarParams p) {
    typedef Elem<DT> E;
    u64 epoch = car_next_epoch(p);
    u64 views[ARX_MAX_RANKS];
    car_views(p, epoch, views);
    Range r = block_range(Range{0, p.count}, blockIdx.x, gridDim.x, E::VEC);
    copy_range<DT>((const void*)p.input, (void*)views[p.rank], r);
    car_barrier(p, 0, epoch);
    reduce_range<DT>(views, p.world, (void*)p.output, r);
}

template <int DT> ARX_DEV void car_2shot(CarParams p) {
    typedef Elem<DT> E;
    u64 epoch = car_next_epoch(p);
    u64 views[ARX_MAX_RANKS];
    car_views(p, epoch, views);
    u64 shard = shard_elems(p.count, p.world, E::VEC);
    for (u32 s = 0; s < p.world; ++s)
        copy_range<DT>((const void*)p.input, (void*)views[p.rank],
                       block_range(shard_range(p.count, shard, s), blockIdx.x, gridDim.x, E::VEC));
    car_barrier(p, 0, epoch);
    Range mine = block_range(shard_range(p.count, shard, p.rank), blockIdx.x, gridDim.x, E::VEC);
    reduce_range<DT>(views, p.world, (void*)views[p.rank], mine);
    car_barrier(p, 1, epoch);
    for (u32 s = 0; s < p.world; ++s)
        copy_range<DT>((const void*)views[s], (void*)p.output,
                       block_range(shard_range(p.count, shard, s), blockIdx.x, gridDim.x, E::VEC));
}

// Reduce-scatter: the first half of two-shot, with exact count / world shards; rank r's shard goes to output[0..).
template <int DT> ARX_DEV void car_rs(CarParams p) {
    typedef Elem<DT> E;
    u64 epoch = car_next_epoch(p);
    u64 views[ARX_MAX_RANKS];
    car_views(p, epoch, views);
    u64 shard = p.count / p.world;
    for (u32 s = 0; s < p.world; ++s)
        copy_range<DT>((const void*)p.input, (void*)views[p.rank],
                       block_range(shard_range(p.count, shard, s), blockIdx.x, gridDim.x, E::VEC));
    car_barrier(p, 0, epoch);
    Range mine = block_range(shard_range(p.count, shard, p.rank), blockIdx.x, gridDim.x, E::VEC);
    // Shifted so that element i of the sum lands at output[i - shard start].
    u64 out = p.output - (u64)p.rank * shard * E::SIZE;
    reduce_range<DT>(views, p.world, (void*)out, mine);
}

// The floor every method pays: the epoch and one barrier, nothing moved.
ARX_KERNEL void car_barrier_only(CarParams p) { car_barrier(p, 0, car_next_epoch(p)); }

ARX_INSTANTIATE(car_1shot, CarParams)
ARX_INSTANTIATE(car_2shot, CarParams)
ARX_INSTANTIATE(car_rs, CarParams)
