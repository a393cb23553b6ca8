// Stand-ins that let the kernels' device code run on the host (kernels/check/*_sim.cpp): each thread of a block is a
// host thread with its own threadIdx, __shared__ variables are function statics (one per block: a simulated block
// is the only block of its process), __syncthreads is a barrier of the block's threads, and portability.h's
// ARX_HOST_SIM branch maps its atomics to the C++ memory model's.
#include <barrier>
#include <sched.h>
#include <thread>
#include <time.h>
#include <vector>

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
// Set by each process before its block's threads start.
inline arx_sim_dim blockIdx{0}, gridDim{1}, blockDim{0};
// The running block's barrier: blockDim.x participants.
inline std::barrier<>* arx_sim_block = nullptr;
inline void __syncthreads() { arx_sim_block->arrive_and_wait(); }
// Runs `body(t)` as this process's block of `threads` threads, each with its threadIdx, and returns when all end.
template <class Body> void arx_sim_run_block(unsigned threads, Body body) {
    std::barrier<> block(threads);
    arx_sim_block = &block;
    blockDim.x = threads;
    std::vector<std::thread> running;
    for (unsigned t = 0; t < threads; ++t)
        running.emplace_back([&body, t] {
            threadIdx.x = t;
            body(t);
        });
    for (auto& t : running) t.join();
    arx_sim_block = nullptr;
}
inline unsigned long long arx_sim_now_ns() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}
inline void arx_sim_relax() { sched_yield(); }
