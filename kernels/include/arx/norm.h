// The residual add and RMSNorm that follow an allreduce (serving stacks' fused epilogue), one piece for the fused
// designs and the unfused sequence's kernel. Row by row, in one fixed order whatever the launch: the sum rounded to
// the element type, the residual added in f32 and rounded (r); a row's sum of squares as ARX_NORM_LANES fused
// multiply-add chains (lane l over the elements of vectors l, l + LANES, ... in order), then halved pairwise; y = r * (1 / sqrt(mean + eps))
// * weight. collective_core::norm is the host twin, so ranks, designs and drivers give the same bits.
#ifndef ARX_NORM_H
#define ARX_NORM_H

#include "arx/reduce.h"

// Threads of every block that runs a norm: one per lane of the canonical order.
#define ARX_NORM_LANES 512

// Where the sum of squares' halving leaves one block-wide step for another (a divisor of ARX_NORM_LANES).
#define ARX_NORM_PARTS 32

// What `v[i]` holds once the pairwise halving of v[0..N) (v[i] += v[i + s] for s = N / 2, ..., 1) has reached s = S,
// for i < S: the same additions in the same order, evaluated depth first, so few values are live at once.
template <u32 S, u32 N> ARX_DEV float halving_sum(const float* v, u32 i) {
    if constexpr (S >= N) {
        return v[i];
    } else {
        return halving_sum<2 * S, N>(v, i) + halving_sum<2 * S, N>(v, i + S);
    }
}

// Rows [lo, hi) of r split among the blocks (== collective_core::norm::row_range).
ARX_DEV Range row_range(Range r, u64 b, u64 grid) {
    u64 per = div_ceil(r.hi - r.lo, grid);
    u64 lo = r.lo + b * per < r.hi ? r.lo + b * per : r.hi;
    u64 hi = lo + per < r.hi ? lo + per : r.hi;
    return Range{lo, hi};
}

// Whether rows of `hidden` elements start on 16-byte boundaries (every buffer does), so they move in vectors;
// either way element j belongs to lane (j / VEC) % ARX_NORM_LANES, so both paths sum the squares alike.
template <int DT> ARX_DEV bool rows_in_vectors(u32 hidden) { return ((u64)hidden * Elem<DT>::SIZE) % 16 == 0; }

// The scalar path's elements of this thread, j ascending: those of its lane's vectors, the same the vector path
// gives it, so every pass over a row (r, its squares, y) has each element in one thread and needs no block sync.
#define ARX_NORM_FOR_OWN_ELEMENTS(j, hidden)                                           \
    for (u64 v_ = threadIdx.x; v_ * Elem<DT>::VEC < (hidden); v_ += ARX_NORM_LANES) \
        for (u64 j = v_ * Elem<DT>::VEC; j < (v_ + 1) * Elem<DT>::VEC && j < (hidden); ++j)

// r = round(round(sum of srcs) + residual) for the row at element `base`, into r_dst (which may be a source or the
// residual: each element is read, then written, by one thread).
template <int DT>
ARX_DEV void add_residual_row(const u64* srcs, u32 world, const void* residual, void* r_dst, u64 base, u32 hidden) {
    typedef Elem<DT> E;
    if (rows_in_vectors<DT>(hidden)) {
        u64 off = base * E::SIZE;
        for (u64 v = threadIdx.x; v < hidden / E::VEC; v += ARX_NORM_LANES) {
            vec16 sum = sum_vec<DT, false>(srcs, world, off, v, 0);
            vec16 res = ((const vec16*)((const char*)residual + off))[v];
            float r[E::VEC];
#pragma unroll
            for (int k = 0; k < E::VEC; ++k) r[k] = E::lane(sum, k) + E::lane(res, k);
            ((vec16*)((char*)r_dst + off))[v] = E::pack(r);
        }
        return;
    }
    ARX_NORM_FOR_OWN_ELEMENTS(j, hidden) {
        u64 i = base + j;
        E::store(r_dst, i, E::round(sum_at<DT, false>(srcs, world, i, 0)) + E::load(residual, i));
    }
}

// y = r / sqrt(mean(r^2) + eps) * weight for the row of r_src at `base`, into out; with r_copy, the row is copied
// there too (the two-shot gathers its peers' rows into the residual this way). Every thread of the block calls it.
template <int DT>
ARX_DEV void rms_norm_row(const void* r_src, void* r_copy, const void* weight, void* out, u64 base, u32 hidden,
                          float eps) {
    typedef Elem<DT> E;
    __shared__ float s_lanes[ARX_NORM_LANES];
    u32 t = threadIdx.x;
    const bool vectors = rows_in_vectors<DT>(hidden);
    const u64 off = base * E::SIZE;
    float acc = 0.0f;
    if (vectors) {
        for (u64 v = t; v < hidden / E::VEC; v += ARX_NORM_LANES) {
            vec16 x = ((const vec16*)((const char*)r_src + off))[v];
            if (r_copy) ((vec16*)((char*)r_copy + off))[v] = x;
#pragma unroll
            for (int k = 0; k < E::VEC; ++k) acc = fma_rn(E::lane(x, k), E::lane(x, k), acc);
        }
    } else {
        ARX_NORM_FOR_OWN_ELEMENTS(j, hidden) {
            float x = E::load(r_src, base + j);
            if (r_copy) E::store(r_copy, base + j, x);
            acc = fma_rn(x, x, acc);
        }
    }
    // The lanes halved pairwise in two block-wide steps (was one per halving): the first ARX_NORM_PARTS threads
    // each sum their lane's tree down to that many parts, then every thread sums the parts. No sync after the last
    // read: a thread writes either array again only past a sync that every reader of it has reached.
    __shared__ float s_parts[ARX_NORM_PARTS];
    s_lanes[t] = acc;
    __syncthreads();
    if (t < ARX_NORM_PARTS) s_parts[t] = halving_sum<ARX_NORM_PARTS, ARX_NORM_LANES>(s_lanes, t);
    __syncthreads();
    float inv = div_rn(1.0f, sqrt_rn(div_rn(halving_sum<1, ARX_NORM_PARTS>(s_parts, 0), (float)hidden) + eps));
    // The row this thread wrote to r_copy is its own to read back; otherwise r_src, unchanged.
    const void* r = r_copy ? (const void*)r_copy : r_src;
    if (vectors) {
        for (u64 v = t; v < hidden / E::VEC; v += ARX_NORM_LANES) {
            vec16 x = ((const vec16*)((const char*)r + off))[v];
            vec16 w = ((const vec16*)weight)[v];
            float y[E::VEC];
#pragma unroll
            for (int k = 0; k < E::VEC; ++k) y[k] = (E::lane(x, k) * inv) * E::lane(w, k);
            ((vec16*)((char*)out + off))[v] = E::pack(y);
        }
        return;
    }
    ARX_NORM_FOR_OWN_ELEMENTS(j, hidden) E::store(out, base + j, (E::load(r, base + j) * inv) * E::load(weight, j));
}

// The whole epilogue of the row at `base` of a sum over `srcs`: r into the residual, then y from it into out (the
// one-shot designs' and the unfused kernel's; every thread reads back only the elements it wrote).
template <int DT>
ARX_DEV void add_rms_norm_row(const u64* srcs, u32 world, void* residual, const void* weight, void* out, u64 base,
                              u32 hidden, float eps) {
    add_residual_row<DT>(srcs, world, residual, residual, base, hidden);
    rms_norm_row<DT>(residual, 0, weight, out, base, hidden, eps);
}

#endif  // ARX_NORM_H
