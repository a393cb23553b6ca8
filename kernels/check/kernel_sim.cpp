// The allreduce kernels (symm_tuned.cu's designs, car.cu's and symm.cu's) run on the host, whole: a process per block of every
// rank (its blockIdx and gridDim), a thread per thread of the block, the buffers in memory all processes share, and
// between calls a kernel boundary per rank (its blocks' processes meet, then block 0 loads the next call's inputs as
// the caller would). So `cargo xtask kernel-check` runs the packets, the zero-copy reads, the pushes, the staging
// halves, car's buffers, the barriers and the norm's row counts call after call, with no GPU.
//
// kernel_sim IN OUT: IN holds u32 family (0 symm_tuned's, 1 car's, 2 symm's), kernel (an index into the family's table),
// dtype, world, grid, block, calls, hidden (a row's elements, or 0), norm (1: the kernel adds the residual and
// normalises), copy_in (1: each call's input lies in a caller's buffer that the kernel copies or pushes in,
// `copy_from`; 0: in the registered input); u64 count, out_count (the output's elements), ll_packets, timeout_ns,
// first_epoch (every block's epoch counter before the first call, as the communicator's `first_epoch`); f32 eps; then
// per call every rank's input, and with the norm the call's residual (every rank's) and weight. OUT gets per call and
// rank the output, then with the norm the residual (r).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <pthread.h>
#include <sys/mman.h>
#include <vector>

#include "../car.cu"
#include "../symm.cu"
#include "../symm_tuned.cu"

namespace {

struct Plan {
    u32 family, kernel, dtype, world, grid, block, calls, hidden, norm, copy_in;
    u64 count, out_count, ll_packets, timeout_ns, first_epoch;
    float eps;
};

// Bump allocation in the mapping every process shares, 256-byte aligned as device allocations are.
struct Arena {
    char* base;
    u64 used, size;
    char* take(u64 bytes) {
        char* p = base + used;
        used += (bytes + 255) / 256 * 256;
        if (used > size) std::exit(3);
        return p;
    }
};

struct Rank {
    char *input, *caller, *output, *residual, *weight, *staging;
    u64 *packets, *flags, *counters, *status;
    pthread_barrier_t* boundary;  // the rank's blocks at a kernel boundary
};

// The kernels by family and index (xtask's host_sim/designs.rs names them in this order), one function per dtype.
template <int DT> using TunedBody = void (*)(TunedParams);
template <int DT> constexpr TunedBody<DT> TUNED[] = {
    symm_ll<DT>,          symm_ll_norm<DT>,          symm_zc_2shot_ll<DT>,      symm_zc_2shot_ll_norm<DT>,
    symm_zc_1shot<DT>,    symm_zc_1shot_norm<DT>,    symm_zc_2shot<DT>,         symm_zc_2shot_norm<DT>,
    symm_zc_2shot_push<DT>, symm_zc_2shot_push_norm<DT>, symm_epoch_1shot<DT>, symm_epoch_1shot_norm<DT>,
    symm_zc_2shot_table<DT>, symm_zc_2shot_pull<DT>, symm_zc_2shot_pull_table<DT>,
};
template <int DT> using CarBody = void (*)(CarParams);
template <int DT> constexpr CarBody<DT> CAR[] = {
    car_1shot_k<DT, 0>,         car_2shot_k<DT, 0>,         car_1shot_norm<DT>,           car_2shot_norm<DT>,
    car_add_rms_norm<DT>,       car_1shot_k<DT, CAR_TABLE>, car_1shot_k<DT, CAR_PUSH>,    car_1shot_k<DT, CAR_ONEBLOCK>,
    car_1shot_k<DT, CAR_CAS>,   car_2shot_k<DT, CAR_EXIT>,  car_rs<DT>,                   car_ag<DT>,
    car_rs_cols<DT>,
};
template <int DT> using SymmBody = void (*)(SymmParams);
template <int DT> constexpr SymmBody<DT> SYMM[] = {
    symm_1shot<DT>, symm_2shot_k<DT, 0>, symm_2shot_k<DT, SYMM_FUSED>, symm_rs<DT>,
};
constexpr u32 COUNTS[3] = {sizeof(TUNED<0>) / sizeof(TUNED<0>[0]), sizeof(CAR<0>) / sizeof(CAR<0>[0]),
                           sizeof(SYMM<0>) / sizeof(SYMM<0>[0])};

// One block's call: the family's parameters, built for this rank.
struct Launch {
    TunedParams tuned;
    CarParams car;
    SymmParams symm;
};

template <int DT> void launch(const Plan& plan, const Launch& l) {
    if (plan.family == 0) TUNED<DT>[plan.kernel](l.tuned);
    else if (plan.family == 1) CAR<DT>[plan.kernel](l.car);
    else SYMM<DT>[plan.kernel](l.symm);
}

void run_block(const Plan& plan, const Launch& p) {
    arx_sim_run_block(plan.block, [&](u32) {
        if (plan.dtype == 0) launch<0>(plan, p);
        else if (plan.dtype == 1) launch<1>(plan, p);
        else launch<2>(plan, p);
    });
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: kernel_sim IN OUT\n");
        return 2;
    }
    FILE* in = std::fopen(argv[1], "rb");
    Plan plan;
    u32 head[10];
    u64 wide[5];
    if (!in || std::fread(head, 4, 10, in) != 10 || std::fread(wide, 8, 5, in) != 5 ||
        std::fread(&plan.eps, 4, 1, in) != 1)
        return 2;
    plan = Plan{head[0], head[1], head[2], head[3], head[4], head[5], head[6], head[7], head[8], head[9],
                wide[0], wide[1], wide[2], wide[3], wide[4], plan.eps};
    if (plan.world < 2 || plan.world > ARX_MAX_RANKS || plan.grid == 0 || plan.grid > ARX_MAX_BLOCKS || plan.block == 0 ||
        plan.dtype > 2 || plan.family > 2 || plan.kernel >= COUNTS[plan.family])
        return 2;
    const u64 size = plan.dtype == 2 ? 4 : 2, bytes = plan.count * size, out_bytes = plan.out_count * size;
    const bool norm = plan.norm != 0;
    const u64 rows = plan.hidden ? plan.count / plan.hidden : 0, weight_bytes = plan.hidden * size;
    // Inputs of every call, then the results.
    const u64 per_call = plan.world * bytes + (norm ? bytes + weight_bytes : 0);
    std::vector<char> inputs(plan.calls * per_call);
    if (std::fread(inputs.data(), 1, inputs.size(), in) != inputs.size()) return 2;
    const u64 per_result = out_bytes + (norm ? bytes : 0);
    const u64 results = plan.calls * plan.world * per_result;
    const u64 packet_bytes = 2ull * ARX_MAX_RANKS * plan.ll_packets * 8;
    const u64 flag_bytes = (u64)ARX_MAX_BLOCKS * ARX_PHASES * ARX_MAX_RANKS * 8;
    // The epoch counters, then car's one-block words (arrivals, release) or symm_ll_norm's row counts.
    const u64 counter_bytes = 3 * ARX_MAX_BLOCKS * 8 + rows * 4;
    // Staging halves: room for a slot of every rank's whole input, more than any design needs.
    const u64 half_bytes = plan.world * ((bytes + 255) / 256 * 256);
    // The *_table kernels' peer tables: symm's (inputs, outputs), car's (both parities' views, then the flags).
    const u64 table_bytes = 3 * ARX_MAX_RANKS * 8;
    const u64 each = 4 * (bytes + 256) + out_bytes + 256 + 2 * half_bytes + packet_bytes + flag_bytes + counter_bytes +
                     sizeof(pthread_barrier_t) + 2 * table_bytes + 7 * 256;
    Arena arena{nullptr, 0, plan.world * each + results + inputs.size() + 4096};
    void* mem = mmap(nullptr, arena.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return 3;
    arena.base = (char*)mem;  // zeroed, as the communicator zeroes its flags, packets and counters
    char* shared_inputs = arena.take(inputs.size());
    std::memcpy(shared_inputs, inputs.data(), inputs.size());
    char* out = arena.take(results);
    std::vector<Rank> ranks(plan.world);
    pthread_barrierattr_t attr;
    pthread_barrierattr_init(&attr);
    pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    TunedParams base{};
    for (u32 r = 0; r < plan.world; ++r) {
        Rank& k = ranks[r];
        k.input = arena.take(bytes), k.caller = arena.take(bytes), k.output = arena.take(out_bytes);
        k.residual = arena.take(bytes);
        k.weight = arena.take(weight_bytes + 16), k.staging = arena.take(2 * half_bytes);
        k.packets = (u64*)arena.take(packet_bytes), k.flags = (u64*)arena.take(flag_bytes);
        k.counters = (u64*)arena.take(counter_bytes), k.status = (u64*)arena.take(64);
        for (u32 b = 0; b < ARX_MAX_BLOCKS; ++b) k.counters[b] = plan.first_epoch;
        k.boundary = (pthread_barrier_t*)arena.take(sizeof(pthread_barrier_t));
        pthread_barrier_init(k.boundary, &attr, plan.grid);
        base.inputs[r] = (u64)k.input, base.outputs[r] = (u64)k.output;
        base.packets[r] = (u64)k.packets, base.flags[r] = (u64)k.flags, base.staging[r] = (u64)k.staging;
    }
    // The *_table kernels read every rank's views from a table: inputs, then outputs.
    u64* table = (u64*)arena.take(table_bytes);
    for (u32 r = 0; r < ARX_MAX_RANKS; ++r) table[r] = base.inputs[r], table[ARX_MAX_RANKS + r] = base.outputs[r];
    base.peer_table = (u64)table, base.half_bytes = half_bytes;
    // car: its buffers are the staging halves, its fixed input buffers (the two-shot's) the registered inputs, its
    // pushed one-shot's slots a whole input apart; the peer-table variant reads both parities' views, then the flags.
    CarParams car{};
    u64* car_table = (u64*)arena.take(table_bytes);
    for (u32 r = 0; r < plan.world; ++r) {
        car.bufs[r] = base.staging[r], car.flags[r] = base.flags[r], car.inputs[r] = base.inputs[r];
        car_table[r] = base.staging[r], car_table[ARX_MAX_RANKS + r] = base.staging[r] + half_bytes;
        car_table[2 * ARX_MAX_RANKS + r] = base.flags[r];
    }
    car.count = plan.count, car.half_bytes = half_bytes, car.timeout_ns = plan.timeout_ns, car.table = (u64)car_table;
    car.slot_bytes = (bytes + 255) / 256 * 256, car.world = plan.world, car.dtype = plan.dtype, car.tag = 1;
    car.hidden = plan.hidden, car.eps = plan.eps;
    // symm: its symmetric buffers are the registered inputs (the host's memcpy fills them where the kernel does not
    // copy in), its signal pads the flag arrays.
    SymmParams symm{};
    for (u32 r = 0; r < plan.world; ++r) symm.bufs[r] = base.inputs[r], symm.pads[r] = base.flags[r];
    symm.count = plan.count, symm.timeout_ns = plan.timeout_ns, symm.world = plan.world, symm.dtype = plan.dtype;
    base.count = plan.count, base.ll_packets = plan.ll_packets, base.timeout_ns = plan.timeout_ns;
    base.world = plan.world, base.dtype = plan.dtype, base.tag = 1, base.hidden = plan.hidden, base.eps = plan.eps;
    // Process i runs block i % grid of rank i / grid.
    auto block = [&](u32 i) {
        const u32 r = i / plan.grid, b = i % plan.grid;
        blockIdx.x = b, gridDim.x = plan.grid;
        const Rank& k = ranks[r];
        Launch p{base, car, symm};
        p.tuned.rank = r, p.tuned.counters = (u64)k.counters, p.tuned.status = (u64)k.status;
        p.tuned.residual = (u64)k.residual, p.tuned.weight = (u64)k.weight;
        p.tuned.copy_from = plan.copy_in ? (u64)k.caller : 0;
        p.car.rank = r, p.car.counters = (u64)k.counters, p.car.status = (u64)k.status;
        p.car.residual = (u64)k.residual, p.car.weight = (u64)k.weight;
        p.car.input = (u64)k.caller, p.car.output = (u64)k.output;
        p.symm.rank = r, p.symm.status = (u64)k.status, p.symm.input = (u64)k.caller, p.symm.output = (u64)k.output;
        for (u32 c = 0; c < plan.calls; ++c) {
            const char* call = shared_inputs + c * per_call;
            pthread_barrier_wait(k.boundary);
            if (b == 0) {  // the caller between launches: this call's input, residual and weight
                // car and symm read the caller's buffer, or the buffer the host's memcpy fills before them.
                if (plan.family != 0 || plan.copy_in) std::memcpy(k.caller, call + r * bytes, bytes);
                if (plan.family != 0 || !plan.copy_in) std::memcpy(k.input, call + r * bytes, bytes);
                if (norm) {
                    std::memcpy(k.residual, call + plan.world * bytes, bytes);
                    std::memcpy(k.weight, call + plan.world * bytes + bytes, weight_bytes);
                }
            }
            pthread_barrier_wait(k.boundary);
            run_block(plan, p);
            pthread_barrier_wait(k.boundary);
            if (b == 0) {
                char* dst = out + (c * plan.world + r) * per_result;
                std::memcpy(dst, k.output, out_bytes);
                if (norm) std::memcpy(dst + out_bytes, k.residual, bytes);
            }
            if (k.status[1] != 0) break;  // a failed wait: the communicator is poisoned
        }
    };
    auto name = [&](u32 i) { return "rank " + std::to_string(i / plan.grid) + " block " + std::to_string(i % plan.grid); };
    bool failed = !arx_sim_fork(plan.world * plan.grid, 120, block, name);
    for (u32 r = 0; r < plan.world; ++r)
        if (ranks[r].status[1] != 0) {
            const u64* s = ranks[r].status;
            std::fprintf(stderr, "rank %u failed a wait: peer %llu, what %#llx, after %llu ns, read %#llx at %llu for %#llx\n",
                         r, s[2], s[3], s[4], s[5], s[6], s[7]);
            failed = true;
        }
    // symm_tuned.cu's kernels leave nothing past the epoch counters (symm_ll_norm's row counts are zeroed by the
    // blocks that complete them, ready for the next call).
    for (u32 r = 0; r < plan.world && plan.family == 0; ++r)
        for (u64 i = ARX_MAX_BLOCKS * 8; i < counter_bytes; ++i)
            if (((const char*)ranks[r].counters)[i] != 0) {
                std::fprintf(stderr, "rank %u left byte %llu past its epoch counters nonzero\n", r,
                             i - ARX_MAX_BLOCKS * 8);
                failed = true;
                break;
            }
    if (failed) return 4;
    FILE* f = std::fopen(argv[2], "wb");
    if (!f || std::fwrite(out, 1, results, f) != results || std::fclose(f) != 0) return 4;
    return 0;
}
