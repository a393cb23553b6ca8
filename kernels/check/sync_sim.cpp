// sync.h's epoch-flag barrier run on the host: every rank a process (fork), each one block of `world` threads, the
// flags and status words in memory the processes share, so that `cargo xtask kernel-check` runs the device barrier
// (its tags, its deadline, the status words it leaves) with no GPU.
//
// sync_sim PLAN: PLAN holds u32 world, u32 calls, u32 phases, u64 timeout_ns, then per rank and call the u32 tag of
// the kernel that rank runs (LEAVES: the rank stops before that call, as a dead peer). Call c is epoch c + 1 and runs
// the barriers of phases 0 .. phases - 1 (kernels have one to ARX_PHASES). Then u32 n and n pairs (u32 peer, u64
// word): flags that rank 0 finds from `peer` in every phase's slot before the run, as from a peer that never runs
// (its tags LEAVES at call 0) and stored `word` earlier. Prints a line per rank: the calls it completed, then its four
// status words.
#include <cstdio>
#include <cstdlib>
#include <sys/mman.h>
#include <vector>

#include "arx/sync.h"

namespace {

constexpr u32 LEAVES = 0xffffffffu;
constexpr u64 FLAG_WORDS = (u64)ARX_MAX_BLOCKS * ARX_PHASES * ARX_MAX_RANKS;

// What the ranks share: their flags, status words and how many calls each completed.
struct Shared {
    u64 flags[ARX_MAX_RANKS][FLAG_WORDS];
    u64 status[ARX_MAX_RANKS][8];
    u32 completed[ARX_MAX_RANKS];
};

// One rank: its block's threads run the calls until a barrier fails or the plan says it leaves.
void rank_main(Shared* shared, u32 rank, u32 world, u32 calls, u32 phases, u64 timeout_ns,
               const std::vector<u32>& tags) {
    u64 flags[ARX_MAX_RANKS];
    for (u32 r = 0; r < world; ++r) flags[r] = (u64)shared->flags[r];
    const u64 status = (u64)shared->status[rank];
    u32 done = 0;
    arx_sim_run_block(world, [&](u32 t) {
        for (u32 c = 0; c < calls; ++c) {
            const u32 tag = tags[(u64)rank * calls + c];
            if (tag == LEAVES) return;
            for (u32 ph = 0; ph < phases; ++ph)
                if (!flag_barrier(flags, rank, world, ph, c + 1, tag, timeout_ns, status)) return;
            if (t == 0) done = c + 1;
        }
    });
    shared->completed[rank] = done;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: sync_sim PLAN\n");
        return 2;
    }
    FILE* in = std::fopen(argv[1], "rb");
    u32 head[3];
    u64 timeout_ns;
    if (!in || std::fread(head, 4, 3, in) != 3 || std::fread(&timeout_ns, 8, 1, in) != 1) return 2;
    const u32 world = head[0], calls = head[1], phases = head[2];
    if (world < 2 || world > ARX_MAX_RANKS || calls == 0 || phases == 0 || phases > ARX_PHASES) return 2;
    std::vector<u32> tags((u64)world * calls);
    if (std::fread(tags.data(), 4, tags.size(), in) != tags.size()) return 2;
    void* mem = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return 3;
    Shared* shared = (Shared*)mem;  // zeroed by the kernel, as the communicator zeroes its flags
    u32 presets;
    if (std::fread(&presets, 4, 1, in) != 1) return 2;
    for (u32 i = 0; i < presets; ++i) {
        u32 peer;
        u64 word;
        if (std::fread(&peer, 4, 1, in) != 1 || std::fread(&word, 8, 1, in) != 1 || peer >= world) return 2;
        for (u32 ph = 0; ph < ARX_PHASES; ++ph) shared->flags[0][ph * ARX_MAX_RANKS + peer] = word;
    }
    auto rank = [&](u32 r) { rank_main(shared, r, world, calls, phases, timeout_ns, tags); };
    if (!arx_sim_fork(world, 60, rank, [](u32 r) { return "rank " + std::to_string(r); })) return 4;
    for (u32 r = 0; r < world; ++r) {
        const u64* s = shared->status[r];
        std::printf("%u %u %llu %llu %llu %llu %llu %llu %llu %llu\n", r, shared->completed[r], s[0], s[1], s[2], s[3],
                    s[4], s[5], s[6], s[7]);
    }
    return 0;
}
