// The kernels' entry points: one per element type, each running a template instantiation.
#ifndef ARX_INSTANTIATE_H
#define ARX_INSTANTIATE_H

#include "arx/portability.h"

#define ARX_INSTANTIATE(NAME, PARAMS)                                         \
    ARX_KERNEL void NAME##_bf16(PARAMS p) { NAME<0>(p); }                     \
    ARX_KERNEL void NAME##_fp16(PARAMS p) { NAME<1>(p); }                     \
    ARX_KERNEL void NAME##_fp32(PARAMS p) { NAME<2>(p); }

// ARX_INSTANTIATE for kernels always launched with blocks of at most THREADS threads, compiled to fit them.
#define ARX_INSTANTIATE_BOUNDED(NAME, PARAMS, THREADS)                                                  \
    ARX_KERNEL __launch_bounds__(THREADS) void NAME##_bf16(PARAMS p) { NAME<0>(p); }                  \
    ARX_KERNEL __launch_bounds__(THREADS) void NAME##_fp16(PARAMS p) { NAME<1>(p); }                  \
    ARX_KERNEL __launch_bounds__(THREADS) void NAME##_fp32(PARAMS p) { NAME<2>(p); }

// NAME_{bf16,fp16,fp32} running BASE<DT, K>: a kernel with compile-time knobs K (the ablation variants).
#define ARX_INSTANTIATE_K(NAME, BASE, K, PARAMS)                              \
    ARX_KERNEL void NAME##_bf16(PARAMS p) { BASE<0, K>(p); }                  \
    ARX_KERNEL void NAME##_fp16(PARAMS p) { BASE<1, K>(p); }                  \
    ARX_KERNEL void NAME##_fp32(PARAMS p) { BASE<2, K>(p); }

#endif  // ARX_INSTANTIATE_H
