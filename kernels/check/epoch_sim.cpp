// sync.h's next_epoch run on the host: launches of the grids given, one after another (a kernel boundary between
// them), on one counter array in shared memory; every block a process (fork), every thread a host thread, so that
// `cargo xtask kernel-check` sees the counters of a launch's blocks and of the blocks it does not have advance alike.
//
// epoch_sim BLOCK GRID...: BLOCK threads a block. Prints a line per launch: its grid, the smallest and the largest
// epoch any thread of the launch was given, then the ARX_MAX_BLOCKS counters after it.
#include <cstdio>
#include <cstdlib>
#include <sys/mman.h>

#include "arx/sync.h"

namespace {

constexpr u32 MAX_THREADS = 1024;

// What the blocks share: the counters, and every thread's epoch of the running launch.
struct Shared {
    u64 counters[ARX_MAX_BLOCKS];
    u64 epochs[ARX_MAX_BLOCKS][MAX_THREADS];
};

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: epoch_sim BLOCK GRID...\n");
        return 2;
    }
    const u32 block = (u32)std::strtoul(argv[1], nullptr, 10);
    if (block == 0 || block > MAX_THREADS) return 2;
    auto* shared = (Shared*)mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) return 3;
    for (int a = 2; a < argc; ++a) {
        const u32 grid = (u32)std::strtoul(argv[a], nullptr, 10);
        if (grid == 0 || grid > ARX_MAX_BLOCKS) return 2;
        auto run = [&](u32 b) {
            blockIdx.x = b, gridDim.x = grid;
            arx_sim_run_block(block, [&](u32 t) { shared->epochs[b][t] = next_epoch((u64)shared->counters); });
        };
        auto name = [](u32 b) { return "block " + std::to_string(b); };
        if (!arx_sim_fork(grid, 30, run, name)) return 1;
        u64 lo = ~0ull, hi = 0;
        for (u32 b = 0; b < grid; ++b)
            for (u32 t = 0; t < block; ++t) {
                lo = shared->epochs[b][t] < lo ? shared->epochs[b][t] : lo;
                hi = shared->epochs[b][t] > hi ? shared->epochs[b][t] : hi;
            }
        std::printf("%u %llu %llu", grid, (unsigned long long)lo, (unsigned long long)hi);
        for (u32 j = 0; j < ARX_MAX_BLOCKS; ++j) std::printf(" %llu", (unsigned long long)shared->counters[j]);
        std::printf("\n");
    }
    return 0;
}
