// Element types: bf16 and fp16 conversions through f32, and Elem<DT> (DT: 0 bf16, 1 fp16, 2 fp32), the scalar
// and 16-byte-vector accesses every kernel uses.
#ifndef ARX_ELEMENTS_H
#define ARX_ELEMENTS_H

#include "arx/portability.h"

ARX_DEV float bf16_to_f32(u16 x) { return u32_as_f32(((u32)x) << 16); }
ARX_DEV u16 f32_to_bf16(float f) {  // round to nearest even; NaN stays NaN
    u32 u = f32_as_u32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

// DT: 0 bf16, 1 fp16, 2 fp32 (collective_core::DType::code).
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

#endif  // ARX_ELEMENTS_H
