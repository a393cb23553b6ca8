// Stand-ins for what the CUDA runtime headers give nvcc, so that Debian's clang can compile kernels/*.cu to PTX
// as a syntax and type check in CI (no CUDA toolkit there). NVRTC, which compiles them for real, needs none.
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __launch_bounds__(THREADS) __attribute__((launch_bounds(THREADS)))
#define __forceinline__ __inline__ __attribute__((always_inline))
#include <__clang_cuda_builtin_vars.h>
extern "C" __device__ void __syncthreads() __asm__("llvm.nvvm.barrier0");
__device__ static inline float __uint_as_float(unsigned int x) { return __builtin_bit_cast(float, x); }
__device__ static inline unsigned int __float_as_uint(float x) { return __builtin_bit_cast(unsigned int, x); }
__device__ static inline void __trap() { __builtin_trap(); }
