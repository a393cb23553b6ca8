// The norm's device code (arx/norm.h) run on the host, one block of ARX_NORM_LANES threads, so that `cargo xtask
// kernel-check` can hold its bits against the host twin's (collective_core::norm) without a GPU.
//
// norm_sim IN OUT: IN holds u32 dtype (0 bf16, 1 fp16, 2 fp32), world, rows, hidden, f32 eps, then every rank's
// input, the residual (rows * hidden elements each) and the weight (hidden). OUT gets r and y of the one-shot
// designs' epilogue (add_rms_norm_row), then r and y of the two-shot designs' (add_residual_row into the output,
// then rms_norm_row from there, copying r into the residual).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "arx/norm.h"

namespace {

struct Buffer {
    void* p;
    explicit Buffer(size_t bytes) : p(std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256)) {}
    ~Buffer() { std::free(p); }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
};

bool read_exact(FILE* f, void* dst, size_t bytes) { return std::fread(dst, 1, bytes, f) == bytes; }

template <int DT> void run(u32 world, u32 rows, u32 hidden, float eps, FILE* in, FILE* out) {
    const size_t bytes = (size_t)rows * hidden * Elem<DT>::SIZE;
    std::vector<Buffer*> inputs;
    std::vector<u64> srcs;
    for (u32 r = 0; r < world; ++r) {
        inputs.push_back(new Buffer(bytes));
        srcs.push_back((u64)inputs.back()->p);
        if (!read_exact(in, inputs.back()->p, bytes)) std::exit(3);
    }
    Buffer residual(bytes), weight((size_t)hidden * Elem<DT>::SIZE);
    if (!read_exact(in, residual.p, bytes) || !read_exact(in, weight.p, (size_t)hidden * Elem<DT>::SIZE)) std::exit(3);
    Buffer r1(bytes), y1(bytes), r2(bytes), y2(bytes);
    std::memcpy(r1.p, residual.p, bytes);
    std::memcpy(r2.p, residual.p, bytes);
    arx_sim_run_block(ARX_NORM_LANES, [&](u32) {
        for (u32 row = 0; row < rows; ++row)
            add_rms_norm_row<DT>(srcs.data(), world, r1.p, weight.p, y1.p, (u64)row * hidden, hidden, eps);
        for (u32 row = 0; row < rows; ++row)
            add_residual_row<DT>(srcs.data(), world, r2.p, y2.p, (u64)row * hidden, hidden);
        __syncthreads();
        for (u32 row = 0; row < rows; ++row)
            rms_norm_row<DT>(y2.p, r2.p, weight.p, y2.p, (u64)row * hidden, hidden, eps);
    });
    for (const Buffer* b : {&r1, &y1, &r2, &y2})
        if (std::fwrite(b->p, 1, bytes, out) != bytes) std::exit(4);
    for (Buffer* b : inputs) delete b;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: norm_sim IN OUT\n");
        return 2;
    }
    FILE* in = std::fopen(argv[1], "rb");
    FILE* out = std::fopen(argv[2], "wb");
    if (!in || !out) return 2;
    u32 head[4];
    float eps;
    if (!read_exact(in, head, sizeof head) || !read_exact(in, &eps, sizeof eps)) return 3;
    const u32 dtype = head[0], world = head[1], rows = head[2], hidden = head[3];
    if (world == 0 || world > ARX_MAX_RANKS || rows == 0 || hidden == 0) return 2;
    if (dtype == 0) run<0>(world, rows, hidden, eps, in, out);
    else if (dtype == 1) run<1>(world, rows, hidden, eps, in, out);
    else if (dtype == 2) run<2>(world, rows, hidden, eps, in, out);
    else return 2;
    return std::fclose(out) == 0 ? 0 : 4;
}
