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

// Vectors of a row that each thread holds in registers between the passes (rows of up to ARX_NORM_LANES times this
// many: 16384 bf16 elements), so a row is read once; longer rows, and rows not in vectors, pass through memory.
#define ARX_NORM_ROW_VECS 4

template <int DT> ARX_DEV bool row_in_registers(u32 hidden) {
    return rows_in_vectors<DT>(hidden) && hidden / Elem<DT>::VEC <= (u64)ARX_NORM_ROW_VECS * ARX_NORM_LANES;
}

// The vectors this thread holds of a row of `nv`: vector v = t + i * LANES in slot i, for the slots below nv (the
// loop unrolled, so the slots stay in registers).
#define ARX_NORM_FOR_HELD(i, v, nv)                          \
    _Pragma("unroll") for (u32 i = 0; i < ARX_NORM_ROW_VECS; ++i) \
        if (const u64 v = threadIdx.x + (u64)i * ARX_NORM_LANES; v < (nv))

// One halving of the canonical order over values held in registers: v[k] += v[k + H] for k < H.
template <u32 H> ARX_DEV void halve(float* v) {
#pragma unroll
    for (u32 k = 0; k < H; ++k) v[k] = v[k] + v[k + H];
}

// 1 / sqrt(mean + eps) of a row from each thread's lane sum `acc`: the lanes halved pairwise (lane l += lane l + s,
// s = LANES / 2 .. 1: the host twin's additions), in three block syncs rather than one per halving, with no
// cross-lane operation (so any wave size): threads t < 32 each halve lanes t, t + 32, ... in registers down to lane t,
// then thread 0 halves those 32. Every thread calls it and gets the result.
ARX_DEV float row_inv_rms(float acc, u32 hidden, float eps) {
    __shared__ float s_lanes[ARX_NORM_LANES];
    __shared__ float s_inv;
    const u32 t = threadIdx.x;
    s_lanes[t] = acc;
    __syncthreads();
    if (t < 32) {
        float v[ARX_NORM_LANES / 32];  // v[k]: lane t + 32 k
#pragma unroll
        for (u32 k = 0; k < ARX_NORM_LANES / 32; ++k) v[k] = s_lanes[t + 32 * k];
        // Lanes 256 apart, then 128, 64 and 32.
        static_assert(ARX_NORM_LANES == 512, "the halvings below are those of 512 lanes");
        halve<8>(v);
        halve<4>(v);
        halve<2>(v);
        halve<1>(v);
        s_lanes[t] = v[0];  // only thread t reads lane t in the pass above
    }
    __syncthreads();
    if (t == 0) {
        float v[32];
#pragma unroll
        for (u32 k = 0; k < 32; ++k) v[k] = s_lanes[k];
        halve<16>(v);
        halve<8>(v);
        halve<4>(v);
        halve<2>(v);
        halve<1>(v);
        s_inv = div_rn(1.0f, sqrt_rn(div_rn(v[0], (float)hidden) + eps));
    }
    __syncthreads();
    // Read before any thread can pass the next row's first sync, past which thread 0 writes the next one.
    return s_inv;
}

// y = (r * inv) * weight for the r vectors this thread holds (vector t + i * LANES of the row at byte `off` in x[i]),
// inv from their lane sum `acc`: the registers path's last pass. The weight is loaded before the block's sum, whose
// syncs hide its latency.
template <int DT>
ARX_DEV void norm_held_row(const vec16* x, float acc, const void* weight, void* out, u64 off, u32 hidden, float eps) {
    typedef Elem<DT> E;
    const u64 nv = hidden / E::VEC;
    vec16 w[ARX_NORM_ROW_VECS];
    ARX_NORM_FOR_HELD(i, v, nv) w[i] = ((const vec16*)weight)[v];
    float inv = row_inv_rms(acc, hidden, eps);
    ARX_NORM_FOR_HELD(i, v, nv) {
        float y[E::VEC];
#pragma unroll
        for (int k = 0; k < E::VEC; ++k) y[k] = (E::lane(x[i], k) * inv) * E::lane(w[i], k);
        ((vec16*)((char*)out + off))[v] = E::pack(y);
    }
}

// Adds vector x's squares to this thread's lane sum, in element order.
template <int DT> ARX_DEV float add_squares(vec16 x, float acc) {
#pragma unroll
    for (int k = 0; k < Elem<DT>::VEC; ++k) acc = fma_rn(Elem<DT>::lane(x, k), Elem<DT>::lane(x, k), acc);
    return acc;
}

// Stores the r vectors this thread holds into the row at byte `off` of `dst` (none when 0) and returns their lane
// sum of squares, in the canonical order.
template <int DT> ARX_DEV float keep_held_row(const vec16* x, void* dst, u64 off, u32 hidden) {
    float acc = 0.0f;
    ARX_NORM_FOR_HELD(i, v, hidden / Elem<DT>::VEC) {
        if (dst) ((vec16*)((char*)dst + off))[v] = x[i];
        acc = add_squares<DT>(x[i], acc);
    }
    return acc;
}

// r = round(round(sum of srcs) + residual) for the row at element `base`, into r_dst (which may be a source or the
// residual: each element is read, then written, by one thread). The memory path of add_rms_norm_row.
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
    const u32 t = threadIdx.x;
    const u64 off = base * E::SIZE;
    float acc = 0.0f;
    if (row_in_registers<DT>(hidden)) {
        vec16 x[ARX_NORM_ROW_VECS];
        ARX_NORM_FOR_HELD(i, v, hidden / E::VEC) x[i] = ((const vec16*)((const char*)r_src + off))[v];
        norm_held_row<DT>(x, keep_held_row<DT>(x, r_copy, off, hidden), weight, out, off, hidden, eps);
        return;
    }
    const bool vectors = rows_in_vectors<DT>(hidden);
    if (vectors) {
        for (u64 v = t; v < hidden / E::VEC; v += ARX_NORM_LANES) {
            vec16 x = ((const vec16*)((const char*)r_src + off))[v];
            if (r_copy) ((vec16*)((char*)r_copy + off))[v] = x;
            acc = add_squares<DT>(x, acc);
        }
    } else {
        ARX_NORM_FOR_OWN_ELEMENTS(j, hidden) {
            float x = E::load(r_src, base + j);
            if (r_copy) E::store(r_copy, base + j, x);
            acc = fma_rn(x, x, acc);
        }
    }
    float inv = row_inv_rms(acc, hidden, eps);
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
// one-shot designs' and the unfused kernel's; every thread reads back only the elements it wrote). On the registers
// path the sources and the residual are all loaded before any arithmetic, and r is never read back.
template <int DT>
ARX_DEV void add_rms_norm_row(const u64* srcs, u32 world, void* residual, const void* weight, void* out, u64 base,
                              u32 hidden, float eps) {
    typedef Elem<DT> E;
    if (!row_in_registers<DT>(hidden)) {
        add_residual_row<DT>(srcs, world, residual, residual, base, hidden);
        rms_norm_row<DT>(residual, 0, weight, out, base, hidden, eps);
        return;
    }
    const u64 off = base * E::SIZE;
    vec16 x[ARX_NORM_ROW_VECS];
    // No store until every r is made, so all the loads can be in flight together.
    ARX_NORM_FOR_HELD(i, v, hidden / E::VEC) {
        vec16 sum = sum_vec<DT, false>(srcs, world, off, v, 0);
        vec16 res = ((const vec16*)((const char*)residual + off))[v];
        float r[E::VEC];
#pragma unroll
        for (int k = 0; k < E::VEC; ++k) r[k] = E::lane(sum, k) + E::lane(res, k);
        x[i] = E::pack(r);
    }
    norm_held_row<DT>(x, keep_held_row<DT>(x, residual, off, hidden), weight, out, off, hidden, eps);
}

#endif  // ARX_NORM_H
