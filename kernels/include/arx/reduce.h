// Block-wide data movement: copies and rank-ordered sums over a range, split into a scalar head, a 16-byte vector
// body and a scalar tail.
#ifndef ARX_REDUCE_H
#define ARX_REDUCE_H

#include "arx/elements.h"
#include "arx/partition.h"

// All pointers of one call share their alignment modulo 16 bytes (buffers are 256-aligned and offsets equal),
// so a scalar head up to the first 16-byte boundary, a vector body and a scalar tail cover any range.
template <int DT> ARX_DEV void split(const void* p, Range r, u64& head_end, u64& body_end) {
    typedef Elem<DT> E;
    u64 addr = (u64)p + r.lo * E::SIZE;
    u64 head = ((16 - (addr & 15)) & 15) / E::SIZE;
    head_end = r.lo + head < r.hi ? r.lo + head : r.hi;
    body_end = head_end + (r.hi - head_end) / E::VEC * E::VEC;
}

constexpr u32 COPY_UNROLL = 4;
// STAGE: `dst` is staging that peers read, written with st_stage.
template <int DT, bool STAGE = false> ARX_DEV void copy_range(const void* src, void* dst, Range r) {
    typedef Elem<DT> E;
    u64 h, z;
    split<DT>(src, r, h, z);
    // A destination shifted against the source (all-gather's rank slots of the output) may not share its
    // alignment: then everything takes the scalar path.
    if ((((u64)dst ^ (u64)src) & 15) != 0) h = z = r.lo;
    for (u64 i = r.lo + threadIdx.x; i < h; i += blockDim.x) E::store(dst, i, E::load(src, i));
    const vec16* s = (const vec16*)((const char*)src + h * E::SIZE);
    vec16* d = (vec16*)((char*)dst + h * E::SIZE);
    u64 n = (z - h) / E::VEC, v = threadIdx.x;
    // COPY_UNROLL loads in flight per thread before their stores (the compiler cannot hoist a load above a store
    // that may alias it): one at a time leaves a capped grid far from the memory's bandwidth.
    for (; v + (COPY_UNROLL - 1) * blockDim.x < n; v += COPY_UNROLL * blockDim.x) {
        vec16 x[COPY_UNROLL];
#pragma unroll
        for (u32 k = 0; k < COPY_UNROLL; ++k) x[k] = s[v + k * blockDim.x];
#pragma unroll
        for (u32 k = 0; k < COPY_UNROLL; ++k) {
            if (STAGE)
                st_stage(d + v + k * blockDim.x, x[k]);
            else
                d[v + k * blockDim.x] = x[k];
        }
    }
    for (; v < n; v += blockDim.x) {
        if (STAGE)
            st_stage(d + v, s[v]);
        else
            d[v] = s[v];
    }
    for (u64 i = z + threadIdx.x; i < r.hi; i += blockDim.x) E::store(dst, i, E::load(src, i));
}

// One step of a sum: f32 accumulation, or (ROUND, the ablation of torch-style low-precision adds) the running sum
// rounded to the element type after every add.
template <int DT, bool ROUND> ARX_DEV float add(float acc, float x) {
    return ROUND ? Elem<DT>::round(acc + x) : acc + x;
}

// srcs[0][i] + ... + srcs[world-1][i], in rank order, then + bias[i] when there is a bias (car's `z`): one fixed
// order on every rank and in every design. Unrolled over the rank bound with predicates, like the vector body, so
// that every index into `srcs` is a constant: a caller's pointer array can then stay in registers (one loop to
// `world` anywhere puts it in local memory, and every sum reads its pointers from there).
template <int DT, bool ROUND> ARX_DEV float sum_at(const u64* srcs, u32 world, u64 i, const void* bias) {
    typedef Elem<DT> E;
    float acc = E::load((const void*)srcs[0], i);
#pragma unroll
    for (u32 p = 1; p < ARX_MAX_RANKS; ++p)
        if (p < world) acc = add<DT, ROUND>(acc, E::load((const void*)srcs[p], i));
    if (bias) acc = add<DT, ROUND>(acc, E::load(bias, i));
    return acc;
}

// The sum of 16-byte vector v of every source, `offset` bytes in (rank order, then the bias; see sum_at): the vector
// body of every sum. Fully unrolled over the rank bound with predicates, so `in` stays in registers and all loads
// are in flight together.
template <int DT, bool ROUND> ARX_DEV vec16 sum_vec(const u64* srcs, u32 world, u64 offset, u64 v, const void* bias) {
    typedef Elem<DT> E;
    vec16 in[ARX_MAX_RANKS];
#pragma unroll
    for (u32 p = 0; p < ARX_MAX_RANKS; ++p)
        if (p < world) in[p] = ((const vec16*)((const char*)srcs[p] + offset))[v];
    float acc[E::VEC];
#pragma unroll
    for (int k = 0; k < E::VEC; ++k) acc[k] = E::lane(in[0], k);
#pragma unroll
    for (u32 p = 1; p < ARX_MAX_RANKS; ++p)
        if (p < world) {
#pragma unroll
            for (int k = 0; k < E::VEC; ++k) acc[k] = add<DT, ROUND>(acc[k], E::lane(in[p], k));
        }
    if (bias) {
        vec16 z = ((const vec16*)((const char*)bias + offset))[v];
#pragma unroll
        for (int k = 0; k < E::VEC; ++k) acc[k] = add<DT, ROUND>(acc[k], E::lane(z, k));
    }
    return E::pack(acc);
}

// dst[i] = srcs[0][i] + ... + srcs[world-1][i] (+ bias[i]; rank order; see sum_at). dst may be one of the sources.
template <int DT, bool ROUND = false>
ARX_DEV void reduce_range(const u64* srcs, u32 world, void* dst, Range r, const void* bias = 0) {
    typedef Elem<DT> E;
    u64 h, z;
    split<DT>(dst, r, h, z);
    // A destination shifted against the sources (reduce-scatter into a shard-sized output) may not share their
    // alignment: then everything takes the scalar path.
    if ((((u64)dst ^ srcs[0]) & 15) != 0) h = z = r.lo;
    for (u64 i = r.lo + threadIdx.x; i < h; i += blockDim.x) E::store(dst, i, sum_at<DT, ROUND>(srcs, world, i, bias));
    for (u64 v = threadIdx.x; v < (z - h) / E::VEC; v += blockDim.x)
        ((vec16*)((char*)dst + h * E::SIZE))[v] = sum_vec<DT, ROUND>(srcs, world, h * E::SIZE, v, bias);
    for (u64 i = z + threadIdx.x; i < r.hi; i += blockDim.x) E::store(dst, i, sum_at<DT, ROUND>(srcs, world, i, bias));
}

#endif  // ARX_REDUCE_H
