#!/usr/bin/env python3
"""Does a 64-bit read of %globaltimer tear? Every thread of a full GPU reads the timer back to back for SECS seconds
(long enough to cross the low word's wrap, every 2^32 ns = 4.3 s, twice) and counts readings earlier than the one
before (a torn read 2^32 ns late is followed by one, a torn read 2^32 ns early is one) and steps forward of more than
2^31 ns. Once with `mov.u64 %globaltimer` (what the waits' deadlines read until session 24), once with the halves read
high, low, high again (what they read since). Needs cupy. Run on the GPU node: `python3 timer_probe.py [SECS]`."""
import sys

import cupy as cp

SOURCE = r"""
__device__ __forceinline__ unsigned long long whole() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned long long halves() {
    unsigned int hi, lo, again;
    asm volatile("mov.u32 %0, %%globaltimer_hi;" : "=r"(hi));
    asm volatile("mov.u32 %0, %%globaltimer_lo;" : "=r"(lo));
    asm volatile("mov.u32 %0, %%globaltimer_hi;" : "=r"(again));
    return hi == again ? ((unsigned long long)hi << 32 | lo) : (unsigned long long)again << 32;
}
extern "C" __global__ void probe(int use_halves, unsigned long long span, unsigned long long* counts) {
    unsigned long long first = use_halves ? halves() : whole(), prev = first, reads = 0, back = 0, leaps = 0;
    for (;;) {
        unsigned long long t = use_halves ? halves() : whole();
        ++reads;
        if (t < prev) ++back;
        else if (t - prev > (1ull << 31)) ++leaps;
        prev = t;
        if (t > first && t - first > span) break;
    }
    atomicAdd(&counts[0], reads);
    atomicAdd(&counts[1], back);
    atomicAdd(&counts[2], leaps);
}
"""


def main():
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    kernel = cp.RawKernel(SOURCE, "probe")
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    for name, use_halves in (("mov.u64 %globaltimer", 0), ("halves, high read twice", 1)):
        counts = cp.zeros(3, dtype=cp.uint64)
        kernel((sms * 2,), (512,), (cp.int32(use_halves), cp.uint64(int(secs * 1e9)), counts))
        cp.cuda.Device().synchronize()
        reads, back, leaps = (int(c) for c in counts.get())
        print(f"{name}: {reads} readings by {sms * 2 * 512} threads in {secs} s, {back} earlier than the one before, "
              f"{leaps} more than 2^31 ns after it")


if __name__ == "__main__":
    main()
