// Stand-ins that let one block of the kernels' element and norm code run on the host (kernels/check/norm_sim.cpp):
// each of the block's threads is a host thread with its own threadIdx, __shared__ variables are function statics
// (one per block, as there is one block), and __syncthreads is a barrier of all of them.
#include <barrier>

#define ARX_HOST_SIM 1
#define __device__
#define __global__
#define __shared__ static
#define __forceinline__ inline
#define __launch_bounds__(THREADS)

struct arx_sim_dim {
    unsigned int x;
};
inline thread_local arx_sim_dim threadIdx{0};
inline constexpr arx_sim_dim blockIdx{0}, gridDim{1};
inline arx_sim_dim blockDim{0};
// Set before the threads start: blockDim.x participants.
inline std::barrier<>* arx_sim_block = nullptr;
inline void __syncthreads() { arx_sim_block->arrive_and_wait(); }
