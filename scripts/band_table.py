#!/usr/bin/env python3
"""The goal table of a band measurement from comm-bench JSON: folders named MODE-PASS (e.g. graph-1), each holding
one run's comm_ops_benchmark.json with car variants (methods named car_*) and symmetric-memory methods. Prints, per
mode and size, the best car variant (lowest mean over the passes of the median time, us) and each listed method's
mean time, its ratio to that best car variant, and its ratio in every pass (against the best car variant of that
pass); "-" where a method has no row. Skipped rows (a method outside its size range) are left out; any other row that did not pass its checks
fails the script.

    scripts/band_table.py results/h200-mps/band-confirm symm_1shot_tuned symm_2shot_tuned auto
"""
import collections
import pathlib
import sys

from comm_json import times_us


def load(root):
    times = collections.defaultdict(dict)
    for f in sorted(pathlib.Path(root).glob("*-*/comm_ops_benchmark.json")):
        mode, run = f.parent.name.split("-")
        for (method, count), us in times_us(f).items():
            times[(mode, method, count)][run] = us
    if not times:
        sys.exit(f"{root}: no MODE-PASS/comm_ops_benchmark.json")
    return times


def mean(values):
    return sum(values) / len(values)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    times = load(sys.argv[1])
    methods = sys.argv[2:]
    print("| N | mode | best car variant, us | " + " | ".join(f"`{m}`, us (ratio; per pass)" for m in methods) + " |")
    print("|---|---|---|" + "---|" * len(methods))
    for mode in ("graph", "eager"):
        for count in sorted({k[2] for k in times if k[0] == mode}):
            cars = {k[1]: v for k, v in times.items() if k[0] == mode and k[2] == count and k[1].startswith("car_")}
            if not cars:
                sys.exit(f"{mode} {count}: no car variant")
            best = min(cars, key=lambda m: mean(cars[m].values()))
            best_time = mean(cars[best].values())
            runs = sorted(cars[best])
            best_per_run = {r: min(v[r] for v in cars.values() if r in v) for r in runs}
            cells = []
            for m in methods:
                t = times.get((mode, m, count))
                if t is None:
                    cells.append("-")
                    continue
                per_run = ", ".join(f"{t[r] / best_per_run[r]:.3f}" for r in runs if r in t)
                cells.append(f"{mean(t.values()):.2f} ({mean(t.values()) / best_time:.3f}; {per_run})")
            print(f"| {count} | {mode} | {best_time:.2f} (`{best}`) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
