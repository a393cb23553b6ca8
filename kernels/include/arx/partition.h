// The work partition (== crates/collective-core: shard_elems, shard_range, block_range), on 128-byte lines.
#ifndef ARX_PARTITION_H
#define ARX_PARTITION_H

#include "arx/portability.h"

struct Range { u64 lo, hi; };
ARX_DEV u64 div_ceil(u64 a, u64 b) { return (a + b - 1) / b; }
// Edges on 128-byte lines (8 vectors), so no two ranks or blocks write one cache line.
#define ARX_LINE_VECS 8
ARX_DEV u64 shard_elems(u64 count, u64 world, u64 vec) {
    return div_ceil(div_ceil(count, vec * ARX_LINE_VECS), world) * vec * ARX_LINE_VECS;
}
ARX_DEV Range shard_range(u64 count, u64 shard, u64 s) {
    u64 lo = s * shard < count ? s * shard : count;
    u64 hi = lo + shard < count ? lo + shard : count;
    return Range{lo, hi};
}
ARX_DEV Range block_range(Range r, u64 b, u64 grid, u64 vec) {
    u64 per = div_ceil(div_ceil(r.hi - r.lo, grid), vec * ARX_LINE_VECS) * vec * ARX_LINE_VECS;
    u64 lo = r.lo + b * per < r.hi ? r.lo + b * per : r.hi;
    u64 hi = lo + per < r.hi ? lo + per : r.hi;
    return Range{lo, hi};
}

#endif  // ARX_PARTITION_H
