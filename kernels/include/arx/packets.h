// LL packets ("low latency", as mscclpp's LL8Packet): 8 bytes, 4 bytes of data in the low word and the call's flag in
// the high word. An 8-byte store is single-copy atomic, so data and flag land together: a reader polls with relaxed
// loads and needs no barrier or fence on either vendor.

#ifndef ARX_PACKETS_H
#define ARX_PACKETS_H

#include "arx/elements.h"
#include "arx/sync.h"

// The packet flag of epoch e, in a packet's high word: e mod (2^32 - 1) + 1, never 0, so a zeroed slot never reads as
// data. The flags wrap every 2^32 - 1 calls; a slot not written since the last wrap could then carry a current flag,
// so the last call to use each area before a wrap zeroes it: every slot then holds either nothing or a packet of the
// flags' current period. (== symm::tuned::ll_flag)
ARX_DEV u64 ll_flag(u64 epoch) { return (epoch % 0xffffffffull + 1) << 32; }

// Element k of a 4-byte packet payload.
template <int DT> ARX_DEV float payload(u32 w, int k) {
    return DT == 2 ? u32_as_f32(w) : (DT == 0 ? bf16_to_f32((u16)(w >> (16 * k))) : f16_to_f32((u16)(w >> (16 * k))));
}
// The payload of the 4 / Elem<DT>::SIZE elements at `a`.
template <int DT> ARX_DEV u32 pack_payload(const float* a) {
    if (DT == 2) return f32_as_u32(a[0]);
    if (DT == 0) return (u32)f32_to_bf16(a[0]) | ((u32)f32_to_bf16(a[1]) << 16);
    return (u32)f32_to_f16(a[0]) | ((u32)f32_to_f16(a[1]) << 16);
}

struct LlPacket {
    // Stores `data` flagged `flag` at `slot`.
    ARX_DEV void write(u64* slot, u32 data, u64 flag) { st_relaxed_sys(slot, flag | data); }
    // Polls `slot` (number `at` of its area) until it carries `flag` (from rank `src`) and returns its data; when the
    // wait ends without it (see Spin), `s.failed` says so and the data is meaningless. The data is returned, not
    // written through a pointer, so a caller's unrolled array of words stays in registers.
    ARX_DEV u32 poll(const u64* slot, u64 at, u64 flag, Spin& s, u32 src) {
        u64 v;
        while (((v = ld_relaxed_sys(slot)) & 0xffffffff00000000ull) != flag)
            if (!s.check(src, ARX_WAIT_PACKETS, Seen{v, at, flag})) break;
        return (u32)v;
    }
};

// Polls slot j of every source's part of this rank's packet area `inbox` (sources `ll_packets` apart) and sums the
// packets' elements in rank order with f32 accumulation (as sum_at) into acc[0 .. 4 / Elem<DT>::SIZE). When a wait
// ends without its packet, `s.failed` says so and acc is meaningless.
template <int DT>
ARX_DEV void ll_poll_sum(const u64* inbox, u64 ll_packets, u64 j, u64 flag, u32 world, Spin& s, float* acc) {
    const int per = 4 / Elem<DT>::SIZE;
    u32 words[ARX_MAX_RANKS];
    // Every pending source's slot is read in one pass, so the loads overlap: spinning source by source costs a
    // memory round trip per source even when every packet is already there.
    u32 pending = (1u << world) - 1u;
    while (pending != 0) {
        u32 missing = ARX_MAX_RANKS;  // the lowest source still missing, whom a failed wait names
        u64 seen = 0;                 // and what its slot held
#pragma unroll
        for (u32 src = 0; src < ARX_MAX_RANKS; ++src) {
            if (!(pending >> src & 1u)) continue;
            u64 v = ld_relaxed_sys(inbox + src * ll_packets + j);
            if ((v & 0xffffffff00000000ull) == flag) {
                words[src] = (u32)v;
                pending &= ~(1u << src);
            } else if (missing == ARX_MAX_RANKS) {
                missing = src;
                seen = v;
            }
        }
        if (pending != 0 && !s.check(missing, ARX_WAIT_PACKETS, Seen{seen, j, flag})) return;
    }
    for (int k = 0; k < per; ++k) acc[k] = payload<DT>(words[0], k);
#pragma unroll
    for (u32 src = 1; src < ARX_MAX_RANKS; ++src)
        if (src < world)
            for (int k = 0; k < per; ++k) acc[k] += payload<DT>(words[src], k);
}

// Writes one packet at `offset` (in packets) into the packet area of every rank in `areas`.
ARX_DEV void ll_push(const u64* areas, u32 world, u64 offset, u32 data, u64 flag) {
    for (u32 d = 0; d < world; ++d) LlPacket::write((u64*)areas[d] + offset, data, flag);
}

#endif  // ARX_PACKETS_H
