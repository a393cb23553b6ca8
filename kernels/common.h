// Portability layer and shared device code for the allreduce kernels. Self-contained (no vendor headers) so
// NVRTC and hipRTC compile it with no include path. Everything vendor-specific is in the first section.
//
// Invariants shared with the Rust side (crates/collective, crates/car, crates/symm):
//  - parameter blocks are passed by value as one struct whose layout matches the #[repr(C)] Rust struct;
//  - the work partition (shard_elems, shard_range, block_range) equals collective::{shard_elems, ...};
//  - sums run in rank order 0..W-1 with f32 accumulation, so every rank and driver gets the same bits.

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

struct alignas(16) vec16 { u32 w[4]; };

#define ARX_MAX_RANKS 8
#define ARX_MAX_BLOCKS 64
#define ARX_PHASES 3  // barriers per call that the epoch flags can tell apart (== collective::host_sync::PHASES)
#define ARX_DEV static __device__ __forceinline__
#define ARX_KERNEL extern "C" __global__

#if defined(__HIPCC_RTC__) || defined(__HIP__) || defined(ARX_HIP)
// ---------------------------------------------------------------- AMD (hipRTC / hipcc), wave size 64
// Nothing in the shared code depends on the wave size: there are no cross-lane operations, and the barriers'
// signalling threads (`t < world`, at most 8) all sit in a block's first wave. hipRTC provides threadIdx, blockIdx,
// blockDim, gridDim and __syncthreads; kernels/check/clang_hip_prelude.h stands in for them in the clang check.
#define ARX_IS_HIP 1
ARX_DEV void st_release_sys(u64* p, u64 v) { __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM); }
// The empty scope name is the system scope.
ARX_DEV void fence_acquire_sys() { __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, ""); }
// Returns the value seen; the exchange happened when it equals `expected`.
ARX_DEV u32 cas_acq_rel_sys(u32* p, u32 expected, u32 desired) {
    __hip_atomic_compare_exchange_strong(p, &expected, desired, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE,
                                         __HIP_MEMORY_SCOPE_SYSTEM);
    return expected;
}
ARX_DEV u64 ld_relaxed_sys(const u64* p) { return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM); }
ARX_DEV void st_relaxed_sys(u64* p, u64 v) { __hip_atomic_store(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM); }
// A 16-byte store into staging that peers read: non-temporal, so the copy does not fill this GPU's caches with lines
// only the peers want.
ARX_DEV void st_stage(vec16* p, vec16 v) {
    typedef u32 u32x4 __attribute__((ext_vector_type(4)));
    u32x4 x = {v.w[0], v.w[1], v.w[2], v.w[3]};
    __builtin_nontemporal_store(x, (u32x4*)p);
}
// s_memrealtime: the 100 MHz constant clock of gfx9 (CDNA: MI200, MI300); RDNA 3 (gfx11) has no such instruction.
ARX_DEV u64 timer_ns() { return __builtin_amdgcn_s_memrealtime() * 10ull; }
ARX_DEV void arx_trap() { __builtin_trap(); }
ARX_DEV float u32_as_f32(u32 x) { return __builtin_bit_cast(float, x); }
ARX_DEV u32 f32_as_u32(float x) { return __builtin_bit_cast(u32, x); }
ARX_DEV float f16_to_f32(u16 x) { return (float)__builtin_bit_cast(_Float16, x); }
ARX_DEV u16 f32_to_f16(float x) { return __builtin_bit_cast(u16, (_Float16)x); }
#else
// ---------------------------------------------------------------- NVIDIA (NVRTC / nvcc)
ARX_DEV void st_release_sys(u64* p, u64 v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
ARX_DEV u64 ld_acquire_sys(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
// Single-copy-atomic 8-byte moves with no ordering: what flag-and-data packets and polls need.
ARX_DEV u64 ld_relaxed_sys(const u64* p) {
    u64 v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
ARX_DEV void st_relaxed_sys(u64* p, u64 v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
ARX_DEV u32 cas_acq_rel_sys(u32* p, u32 expected, u32 desired) {
    u32 old;
    asm volatile("atom.acq_rel.sys.global.cas.b32 %0, [%1], %2, %3;"
                 : "=r"(old) : "l"(p), "r"(expected), "r"(desired) : "memory");
    return old;
}
ARX_DEV void st_stage(vec16* p, vec16 v) { *p = v; }
ARX_DEV u64 timer_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
ARX_DEV void arx_trap() { __trap(); }
ARX_DEV float u32_as_f32(u32 x) { return __uint_as_float(x); }
ARX_DEV u32 f32_as_u32(float x) { return __float_as_uint(x); }
ARX_DEV float f16_to_f32(u16 x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}
ARX_DEV u16 f32_to_f16(float x) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}
#endif

// ---------------------------------------------------------------- elements
ARX_DEV float bf16_to_f32(u16 x) { return u32_as_f32(((u32)x) << 16); }
ARX_DEV u16 f32_to_bf16(float f) {  // round to nearest even; NaN stays NaN
    u32 u = f32_as_u32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

// DT: 0 bf16, 1 fp16, 2 fp32 (collective::DType::code).
template <int DT> struct Elem;
template <> struct Elem<0> {
    enum { SIZE = 2, VEC = 8 };
    ARX_DEV float load(const void* p, u64 i) { return bf16_to_f32(((const u16*)p)[i]); }
    ARX_DEV void store(void* p, u64 i, float v) { ((u16*)p)[i] = f32_to_bf16(v); }
    ARX_DEV float round(float v) { return bf16_to_f32(f32_to_bf16(v)); }
    ARX_DEV float lane(const vec16& v, int k) { return bf16_to_f32((u16)(v.w[k >> 1] >> ((k & 1) * 16))); }
    ARX_DEV vec16 pack(const float* a) {
        vec16 v;
        for (int k = 0; k < 4; ++k) v.w[k] = (u32)f32_to_bf16(a[2 * k]) | ((u32)f32_to_bf16(a[2 * k + 1]) << 16);
        return v;
    }
};
template <> struct Elem<1> {
    enum { SIZE = 2, VEC = 8 };
    ARX_DEV float load(const void* p, u64 i) { return f16_to_f32(((const u16*)p)[i]); }
    ARX_DEV void store(void* p, u64 i, float v) { ((u16*)p)[i] = f32_to_f16(v); }
    ARX_DEV float round(float v) { return f16_to_f32(f32_to_f16(v)); }
    ARX_DEV float lane(const vec16& v, int k) { return f16_to_f32((u16)(v.w[k >> 1] >> ((k & 1) * 16))); }
    ARX_DEV vec16 pack(const float* a) {
        vec16 v;
        for (int k = 0; k < 4; ++k) v.w[k] = (u32)f32_to_f16(a[2 * k]) | ((u32)f32_to_f16(a[2 * k + 1]) << 16);
        return v;
    }
};
template <> struct Elem<2> {
    enum { SIZE = 4, VEC = 4 };
    ARX_DEV float load(const void* p, u64 i) { return ((const float*)p)[i]; }
    ARX_DEV void store(void* p, u64 i, float v) { ((float*)p)[i] = v; }
    ARX_DEV float round(float v) { return v; }
    ARX_DEV float lane(const vec16& v, int k) { return u32_as_f32(v.w[k]); }
    ARX_DEV vec16 pack(const float* a) {
        vec16 v;
        for (int k = 0; k < 4; ++k) v.w[k] = f32_as_u32(a[k]);
        return v;
    }
};

// ---------------------------------------------------------------- work partition (== crates/collective)
struct Range { u64 lo, hi; };
ARX_DEV u64 div_ceil(u64 a, u64 b) { return (a + b - 1) / b; }
// Edges on 128-byte lines (8 vectors), so no two ranks or blocks write one cache line.
#define ARX_LINE_VECS 8
ARX_DEV u64 shard_elems(u64 count, u64 world, u64 vec) {
    return div_ceil(div_ceil(count, vec * ARX_LINE_VECS), world) * vec * ARX_LINE_VECS;
}
ARX_DEV Range shard_range(u64 count, u64 shard, u64 s) {
    u64 lo = s * shard < count ? s * shard : count;
    u64 hi = lo + shard < count ? lo + shard : count;
    return Range{lo, hi};
}
ARX_DEV Range block_range(Range r, u64 b, u64 grid, u64 vec) {
    u64 per = div_ceil(div_ceil(r.hi - r.lo, grid), vec * ARX_LINE_VECS) * vec * ARX_LINE_VECS;
    u64 lo = r.lo + b * per < r.hi ? r.lo + b * per : r.hi;
    u64 hi = lo + per < r.hi ? lo + per : r.hi;
    return Range{lo, hi};
}

// ---------------------------------------------------------------- block-wide data movement
// All pointers of one call share their alignment modulo 16 bytes (buffers are 256-aligned and offsets equal),
// so a scalar head up to the first 16-byte boundary, a vector body and a scalar tail cover any range.
template <int DT> ARX_DEV void split(const void* p, Range r, u64& head_end, u64& body_end) {
    typedef Elem<DT> E;
    u64 addr = (u64)p + r.lo * E::SIZE;
    u64 head = ((16 - (addr & 15)) & 15) / E::SIZE;
    head_end = r.lo + head < r.hi ? r.lo + head : r.hi;
    body_end = head_end + (r.hi - head_end) / E::VEC * E::VEC;
}

// STAGE: `dst` is staging that peers read, written with st_stage.
template <int DT, bool STAGE = false> ARX_DEV void copy_range(const void* src, void* dst, Range r) {
    typedef Elem<DT> E;
    u64 h, z;
    split<DT>(src, r, h, z);
    for (u64 i = r.lo + threadIdx.x; i < h; i += blockDim.x) E::store(dst, i, E::load(src, i));
    const vec16* s = (const vec16*)((const char*)src + h * E::SIZE);
    vec16* d = (vec16*)((char*)dst + h * E::SIZE);
    for (u64 v = threadIdx.x; v < (z - h) / E::VEC; v += blockDim.x) {
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

// srcs[0][i] + ... + srcs[world-1][i], in rank order. Unrolled over the rank bound with predicates, like the vector
// body, so that every index into `srcs` is a constant: a caller's pointer array can then stay in registers (one
// loop to `world` anywhere puts it in local memory, and every sum reads its pointers from there).
template <int DT, bool ROUND> ARX_DEV float sum_at(const u64* srcs, u32 world, u64 i) {
    typedef Elem<DT> E;
    float acc = E::load((const void*)srcs[0], i);
#pragma unroll
    for (u32 p = 1; p < ARX_MAX_RANKS; ++p)
        if (p < world) acc = add<DT, ROUND>(acc, E::load((const void*)srcs[p], i));
    return acc;
}

// dst[i] = srcs[0][i] + ... + srcs[world-1][i] (rank order; see add()). dst may be one of the sources.
template <int DT, bool ROUND = false> ARX_DEV void reduce_range(const u64* srcs, u32 world, void* dst, Range r) {
    typedef Elem<DT> E;
    u64 h, z;
    split<DT>(dst, r, h, z);
    // A destination shifted against the sources (reduce-scatter into a shard-sized output) may not share their
    // alignment: then everything takes the scalar path.
    if ((((u64)dst ^ srcs[0]) & 15) != 0) h = z = r.lo;
    for (u64 i = r.lo + threadIdx.x; i < h; i += blockDim.x) E::store(dst, i, sum_at<DT, ROUND>(srcs, world, i));
    for (u64 v = threadIdx.x; v < (z - h) / E::VEC; v += blockDim.x) {
        // Fully unrolled over the rank bound with predicates, so `in` stays in registers and all loads are in
        // flight together.
        vec16 in[ARX_MAX_RANKS];
#pragma unroll
        for (u32 p = 0; p < ARX_MAX_RANKS; ++p)
            if (p < world) in[p] = ((const vec16*)((const char*)srcs[p] + h * E::SIZE))[v];
        float acc[E::VEC];
#pragma unroll
        for (int k = 0; k < E::VEC; ++k) acc[k] = E::lane(in[0], k);
#pragma unroll
        for (u32 p = 1; p < ARX_MAX_RANKS; ++p)
            if (p < world) {
#pragma unroll
                for (int k = 0; k < E::VEC; ++k) acc[k] = add<DT, ROUND>(acc[k], E::lane(in[p], k));
            }
        ((vec16*)((char*)dst + h * E::SIZE))[v] = E::pack(acc);
    }
    for (u64 i = z + threadIdx.x; i < r.hi; i += blockDim.x) E::store(dst, i, sum_at<DT, ROUND>(srcs, world, i));
}

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
    // fence.acq_rel (measured: results/h200-mps/waits-ab).
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

#define ARX_INSTANTIATE(NAME, PARAMS)                                         \
    ARX_KERNEL void NAME##_bf16(PARAMS p) { NAME<0>(p); }                     \
    ARX_KERNEL void NAME##_fp16(PARAMS p) { NAME<1>(p); }                     \
    ARX_KERNEL void NAME##_fp32(PARAMS p) { NAME<2>(p); }

// NAME_{bf16,fp16,fp32} running BASE<DT, K>: a kernel with compile-time knobs K (the ablation variants).
#define ARX_INSTANTIATE_K(NAME, BASE, K, PARAMS)                              \
    ARX_KERNEL void NAME##_bf16(PARAMS p) { BASE<0, K>(p); }                  \
    ARX_KERNEL void NAME##_fp16(PARAMS p) { BASE<1, K>(p); }                  \
    ARX_KERNEL void NAME##_fp32(PARAMS p) { BASE<2, K>(p); }
