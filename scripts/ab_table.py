#!/usr/bin/env python3
"""Tables of an A/B measurement of builds from comm-bench JSON: folders named MODE-BUILD-PASS (e.g. graph-A-1), each
holding one run's comm_ops_benchmark.json (or `comm-bench norm`'s norm_benchmark.json). Prints, per mode, every method and build at every size: the mean over the
passes of the median time, in us, and each pass's value. Fails on any row that failed its checks.

    scripts/ab_table.py results/h200-mps/regviews
"""
import collections
import pathlib
import sys

from comm_json import times_us


def load(root):
    times = collections.defaultdict(list)
    found = [f for name in ("comm_ops_benchmark", "norm_benchmark") for f in pathlib.Path(root).glob(f"*-*-*/{name}.json")]
    for f in sorted(found):
        mode, build, _ = f.parent.name.split("-")
        for (method, count), us in times_us(f).items():
            times[(mode, method, build, count)].append(us)
    return times


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    times = load(sys.argv[1])
    if not times:
        sys.exit(f"no MODE-BUILD-PASS/comm_ops_benchmark.json under {sys.argv[1]}")
    counts = sorted({k[3] for k in times})
    for mode in sorted({k[0] for k in times}, reverse=True):
        print(f"\n{mode}: mean over passes of the median time, us (each pass)\n")
        print("| method | build | " + " | ".join(str(c) for c in counts) + " |")
        print("|---|---|" + "---|" * len(counts))
        for method, build in sorted({(k[1], k[2]) for k in times if k[0] == mode}):
            cells = []
            for c in counts:
                v = times.get((mode, method, build, c))
                cells.append(f"{sum(v) / len(v):.2f} ({' / '.join(f'{x:.2f}' for x in v)})" if v else "-")
            print(f"| `{method}` | {build} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
