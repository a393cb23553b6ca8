// Portability layer of the allreduce kernels: integer types, limits, and everything vendor-specific (system-scope
// release, acquire, relaxed and CAS; staging stores; timer; trap; bit casts and fp16 conversions). Self-contained (no
// vendor headers), so NVRTC and hipRTC compile it with no include path of their own.
//
// Invariants shared with the Rust side (crates/collective-core, crates/car, crates/symm):
//  - parameter blocks are passed by value as one struct whose layout matches the #[repr(C)] Rust struct;
//  - the work partition (partition.h) equals collective_core::{shard_elems, ...};
//  - sums run in rank order 0..W-1 with f32 accumulation (reduce.h), so every rank and driver gets the same bits.
#ifndef ARX_PORTABILITY_H
#define ARX_PORTABILITY_H

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

struct alignas(16) vec16 { u32 w[4]; };

#define ARX_MAX_RANKS 8
#define ARX_MAX_BLOCKS 64
#define ARX_PHASES 3  // barriers per call that the epoch flags can tell apart (== collective_core::host_sync::PHASES)
#define ARX_DEV static __device__ __forceinline__
#define ARX_KERNEL extern "C" __global__
// Blocks of the tuned designs (== symm::tuned::THREADS): the bound caps a kernel's registers so that a block of that
// many threads always fits on a multiprocessor (the fused norm designs took more than 65536 / 512 without it).
#define ARX_TUNED_THREADS 512

#if defined(ARX_HOST_SIM) || defined(__HIPCC_RTC__) || defined(__HIP__) || defined(ARX_HIP)
// ---------------------------------------------------------------- clang's builtins: AMD, and the host simulation
ARX_DEV float u32_as_f32(u32 x) { return __builtin_bit_cast(float, x); }
ARX_DEV u32 f32_as_u32(float x) { return __builtin_bit_cast(u32, x); }
ARX_DEV float f16_to_f32(u16 x) { return (float)__builtin_bit_cast(_Float16, x); }
ARX_DEV u16 f32_to_f16(float x) { return __builtin_bit_cast(u16, (_Float16)x); }
// Round-to-nearest fused multiply-add, square root and division whatever the compiler's flags (the norm's bits must
// equal its host twin's).
ARX_DEV float fma_rn(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
ARX_DEV float sqrt_rn(float x) { return __builtin_sqrtf(x); }
ARX_DEV float div_rn(float a, float b) { return a / b; }
#endif

#if defined(ARX_HOST_SIM)
// ---------------------------------------------------------------- blocks run as host threads, ranks as processes
// (kernels/check/*_sim.cpp): the C++ memory model's orders for the PTX ones; loads that poll yield the processor
// (arx_sim_relax), so that a few cores run the many spinning threads of a simulated job, and every system-scope
// access may stall its thread (arx_sim_stall), so that peers run ahead of it.
ARX_DEV void st_release_sys(u64* p, u64 v) {
    arx_sim_stall();
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
ARX_DEV u64 ld_acquire_sys(const u64* p) {
    arx_sim_stall();
    u64 v = __atomic_load_n(p, __ATOMIC_ACQUIRE);
    arx_sim_relax();
    return v;
}
ARX_DEV u64 ld_relaxed_sys(const u64* p) {
    arx_sim_stall();
    u64 v = __atomic_load_n(p, __ATOMIC_RELAXED);
    arx_sim_relax();
    return v;
}
ARX_DEV void st_relaxed_sys(u64* p, u64 v) {
    arx_sim_stall();
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}
ARX_DEV u32 cas_acq_rel_sys(u32* p, u32 expected, u32 desired) {
    arx_sim_stall();
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    return expected;
}
ARX_DEV u64 cas_acq_rel_sys(u64* p, u64 expected, u64 desired) {
    arx_sim_stall();
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    return expected;
}
ARX_DEV u32 add_acq_rel_gpu(u32* p, u32 v) { return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL); }
ARX_DEV void st_stage(vec16* p, vec16 v) { *p = v; }
ARX_DEV u64 timer_ns() { return arx_sim_now_ns(); }
#elif defined(__HIPCC_RTC__) || defined(__HIP__) || defined(ARX_HIP)
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
ARX_DEV u64 cas_acq_rel_sys(u64* p, u64 expected, u64 desired) {
    __hip_atomic_compare_exchange_strong(p, &expected, desired, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE,
                                         __HIP_MEMORY_SCOPE_SYSTEM);
    return expected;
}
// Device-scope (agent) ordering and counting among one rank's blocks.
ARX_DEV u32 add_acq_rel_gpu(u32* p, u32 v) {
    return __hip_atomic_fetch_add(p, v, __ATOMIC_ACQ_REL, __HIP_MEMORY_SCOPE_AGENT);
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
// Device-scope ordering and counting among one rank's blocks.
ARX_DEV u32 add_acq_rel_gpu(u32* p, u32 v) {
    u32 old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
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
ARX_DEV u64 cas_acq_rel_sys(u64* p, u64 expected, u64 desired) {
    u64 old;
    asm volatile("atom.acq_rel.sys.global.cas.b64 %0, [%1], %2, %3;"
                 : "=l"(old) : "l"(p), "l"(expected), "l"(desired) : "memory");
    return old;
}
ARX_DEV void st_stage(vec16* p, vec16 v) { *p = v; }
// %globaltimer's halves, the high one read again after the low one: a read that straddles the low word's wrap (every
// 2^32 ns) would otherwise be 4.3 s early or late, and a wait's deadline would end at once.
ARX_DEV u64 timer_ns() {
    u32 hi, lo, again;
    asm volatile("mov.u32 %0, %%globaltimer_hi;" : "=r"(hi));
    asm volatile("mov.u32 %0, %%globaltimer_lo;" : "=r"(lo));
    asm volatile("mov.u32 %0, %%globaltimer_hi;" : "=r"(again));
    return hi == again ? ((u64)hi << 32 | lo) : (u64)again << 32;
}
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
// Round-to-nearest fused multiply-add, square root and division whatever the compiler's flags (the norm's bits must
// equal its host twin's).
ARX_DEV float fma_rn(float a, float b, float c) {
    float d;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
    return d;
}
ARX_DEV float sqrt_rn(float x) {
    float d;
    asm("sqrt.rn.f32 %0, %1;" : "=f"(d) : "f"(x));
    return d;
}
ARX_DEV float div_rn(float a, float b) {
    float d;
    asm("div.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}
#endif

#endif  // ARX_PORTABILITY_H
