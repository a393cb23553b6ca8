// Stand-ins that let the kernels' device code run on the host (kernels/check/*_sim.cpp): each thread of a block is a
// host thread with its own threadIdx, __shared__ variables are function statics (one per block: a simulated block
// is the only block of its process), __syncthreads is a barrier of the block's threads, and portability.h's
// ARX_HOST_SIM branch maps its atomics to the C++ memory model's.
#include <barrier>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <sched.h>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <time.h>
#include <unistd.h>
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
// The noise below: its seed, from the environment variable `var` (unset or 0: no noise) ...
inline unsigned long long arx_sim_seed(const char* var) {
    const char* s = std::getenv(var);
    return s ? std::strtoull(s, nullptr, 10) : 0ull;
}
// ... and a thread's next draw from a xorshift generator `x` (the caller's thread_local) seeded from `seed`, differing
// per process and thread; 0 when `seed` is 0.
inline unsigned long long arx_sim_noise(unsigned long long seed, unsigned long long& x) {
    if (seed == 0) return 0;
    if (x == 0)
        x = (seed ^ (unsigned long long)getpid() * 0x9e3779b97f4a7c15ull ^ (threadIdx.x + 1ull) * 0xbf58476d1ce4e5b9ull) |
            1;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return x;
}
// Clock noise: with ARX_SIM_TIMER_TEARS set (a seed), one reading in 64 is 2^32 ns early or late, as a read of a GPU's
// 64-bit timer in two halves across its low word's wrap can be, so that a wait whose deadline such a reading ends
// fails here too.
inline unsigned long long arx_sim_now_ns() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    unsigned long long now = (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
    static const unsigned long long seed = arx_sim_seed("ARX_SIM_TIMER_TEARS");
    thread_local unsigned long long x = 0;
    unsigned long long draw = arx_sim_noise(seed, x);
    if (draw == 0 || (draw & 63) != 0) return now;
    return draw & 64 ? now + (1ull << 32) : now - (1ull << 32);
}
inline void arx_sim_relax() { sched_yield(); }
// Schedule noise: every system-scope access may, rarely and at random, stall its thread for 20-300 ms (longer than
// a simulated call takes), so that peers run whole calls ahead of it, as they can of a descheduled GPU block, and a
// protocol that counts on peers keeping pace fails here too (ARX_SIM_STALLS: the seed; unset or 0, no stalls).
inline void arx_sim_stall() {
    static const unsigned long long seed = arx_sim_seed("ARX_SIM_STALLS");
    thread_local unsigned long long x = 0;
    unsigned long long draw = arx_sim_noise(seed, x);
    if (draw == 0 || (draw & 2047) != 0) return;
    timespec pause{0, (long)(20000000 + (draw >> 20) % 280000000)};
    nanosleep(&pause, nullptr);
}
// Runs `body(i)` in a child process for each i < count (memory mapped shared before the call is shared with them),
// each ended by SIGALRM should it run past `limit_s` seconds (a wait that never returns), and waits for them all.
// Names on stderr each that did not exit cleanly (`name(i)`: "rank 2 block 1", say); true when every one did.
template <class Body, class Name> bool arx_sim_fork(unsigned count, unsigned limit_s, Body body, Name name) {
    std::vector<pid_t> children;
    for (unsigned i = 0; i < count; ++i) {
        pid_t pid = fork();
        if (pid < 0) {
            std::perror("fork");
            std::exit(3);
        }
        if (pid == 0) {
            alarm(limit_s);
            body(i);
            std::_Exit(0);
        }
        children.push_back(pid);
    }
    bool clean = true;
    for (unsigned i = 0; i < count; ++i) {
        int st = 0;
        if (waitpid(children[i], &st, 0) == children[i] && WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
        clean = false;
        if (WIFSIGNALED(st))
            std::fprintf(stderr, "%s ended by signal %d%s\n", name(i).c_str(), WTERMSIG(st),
                         WTERMSIG(st) == SIGALRM ? " (still running at the time limit: a wait that never returned)" : "");
        else
            std::fprintf(stderr, "%s did not exit cleanly (status %#x)\n", name(i).c_str(), st);
    }
    return clean;
}
