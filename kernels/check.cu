// Device-side checks of a benchmark's outputs. The inputs the checked calls see are small integers (see
// allreduce::check::variant_value), so every output element is an exact integer in every dtype; each call's output is
// folded into a per-block checksum, and the host compares the total with what the calls must have produced. A call
// that read a stale or torn peer buffer folds a different sum, even inside a graph replay.

#include "arx/elements.h"
#include "arx/instantiate.h"
#include "arx/partition.h"

struct FoldParams {
    u64 data;   // the output to fold: `count` elements
    u64 count;
    u64 sums;   // u64 [ARX_MAX_BLOCKS]: block b adds its part to sums[b] (blocks own their word: no atomics)
};

#define ARX_FOLD_THREADS 256

// sums[b] += sum over this block's elements i of value(i) * (i % 7 + 1), as an exact integer.
template <int DT> ARX_DEV void arx_fold(FoldParams p) {
    typedef Elem<DT> E;
    __shared__ u64 partial[ARX_FOLD_THREADS];
    u64 acc = 0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < p.count; i += (u64)gridDim.x * blockDim.x) {
        float v = E::load((const void*)p.data, i);
        // A negative or non-finite value (garbage) still changes the sum: fold its bits instead.
        u64 x = (v >= 0.0f && v < 4294967296.0f) ? (u64)v : (u64)f32_as_u32(v) << 20;
        acc += x * (i % 7 + 1);
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (u32 s = blockDim.x / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) ((u64*)p.sums)[blockIdx.x] += partial[0];
}

ARX_INSTANTIATE(arx_fold, FoldParams)
