// Stand-ins for what hipRTC gives every program (its hip_runtime headers), so that Debian's clang can compile
// kernels/*.cu for AMD with -nogpuinc -nogpulib as a syntax, type and code-generation check in CI (no ROCm
// there). hipRTC, which compiles them for real, needs none of this. The definitions follow ROCm's
// amd_hip_runtime.h / amd_device_functions.h.
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __launch_bounds__(THREADS) __attribute__((amdgpu_flat_work_group_size(1, THREADS)))
#define __forceinline__ inline __attribute__((always_inline))

// Code object v4/v5 hold the dispatch packet (hsa_kernel_dispatch_packet_t) at the dispatch pointer: the
// workgroup size is a u16 at byte 4 (x), the grid size in work-items a u32 at byte 12 (x).
#define ARX_CHECK_DISPATCH(T, BYTE) (((const __attribute__((address_space(4))) T*)__builtin_amdgcn_dispatch_ptr())[(BYTE) / sizeof(T)])
struct arx_check_thread_idx {
    static __device__ unsigned int get_x() { return __builtin_amdgcn_workitem_id_x(); }
    __declspec(property(get = get_x)) unsigned int x;
};
struct arx_check_block_idx {
    static __device__ unsigned int get_x() { return __builtin_amdgcn_workgroup_id_x(); }
    __declspec(property(get = get_x)) unsigned int x;
};
struct arx_check_block_dim {
    static __device__ unsigned int get_x() { return ARX_CHECK_DISPATCH(unsigned short, 4); }
    __declspec(property(get = get_x)) unsigned int x;
};
struct arx_check_grid_dim {
    static __device__ unsigned int get_x() {
        unsigned int block = ARX_CHECK_DISPATCH(unsigned short, 4);
        return (ARX_CHECK_DISPATCH(unsigned int, 12) + block - 1) / block;
    }
    __declspec(property(get = get_x)) unsigned int x;
};
extern const __device__ __attribute__((weak)) arx_check_thread_idx threadIdx;
extern const __device__ __attribute__((weak)) arx_check_block_idx blockIdx;
extern const __device__ __attribute__((weak)) arx_check_block_dim blockDim;
extern const __device__ __attribute__((weak)) arx_check_grid_dim gridDim;

static __device__ inline void __syncthreads() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
