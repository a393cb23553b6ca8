#!/usr/bin/env python3
"""The ablation table of docs/symm-vs-car.md from comm-bench JSON: per factor, the time of the method on the right
over the method on the left (geometric mean over the sizes of each class), eager and graph. Each ratio comes from
one run: of the folders given, the last that measured both methods.

    scripts/factor_table.py results/h200-mps/ablation results/h200-mps/ablation-copyin
"""
import math
import sys

from comm_json import times_us

# (factor, from, to): each pair differs in that factor only, unless the note says otherwise.
FACTORS = [
    ("signalling: torch's CAS handshake -> epoch release store (1 barrier)", "car_1shot_cas", "car_1shot"),
    ("barriers, one-shot: 2 CAS (torch) -> 1 CAS (parity buffers)", "symm_1shot", "car_1shot_cas"),
    ("barriers, two-shot: 3 -> 2 (exit barrier dropped)", "car_2shot_3bar", "car_2shot"),
    ("barrier placement: one block for the grid -> every block", "car_1shot_oneblock", "car_1shot"),
    ("mapping: VMM + fd -> classic IPC (car's kernel)", "car_1shot_vmm", "car_1shot"),
    ("mapping of tuned staging: classic IPC -> VMM", "symm_epoch_1shot_ipc", "symm_epoch_1shot"),
    ("arithmetic: bf16 rounding per add -> f32 accumulation", "car_1shot_round", "car_1shot"),
    ("peer pointers: device array -> kernel arguments", "car_1shot_ptrtable", "car_1shot"),
    ("data flow: push into peers -> pull from peers", "car_1shot_push", "car_1shot"),
    ("launch: car's rule -> 4 x 512", "car_1shot", "car_1shot@4x512"),
    ("launch: car's rule -> 16 x 512", "car_1shot", "car_1shot@16x512"),
    ("launch: car's rule -> 1 x 512", "car_1shot", "car_1shot@1x512"),
    ("launch: 16 x 512 -> 16 x 128", "car_1shot@16x512", "car_1shot@16x128"),
    ("launch: 16 x 512 -> 16 x 1024", "car_1shot@16x512", "car_1shot@16x1024"),
    ("copy-in: separate memcpy -> fused (torch's two-shot)", "symm_2shot", "symm_2shot_fused"),
    ("copy-in: fused -> none (two-shot, peers read registered inputs)", "car_2shot", "symm_zc_2shot"),
    ("copy-in: fused -> none (one-shot, + exit barrier)", "symm_epoch_1shot", "symm_zc_1shot"),
    ("barrier -> none (flag-and-data packets, <= 96 KiB)", "car_1shot", "symm_ll"),
]

CLASSES = [("small (<= 16K el.)", 0, 16384), ("medium", 16385, 4 << 20), ("large (>= 4M el.)", (4 << 20) + 1, 1 << 40)]


def ratio(t, a, b, lo, hi):
    pairs = [(t[(a, n)], t[(b, n)]) for (m, n) in t if m == a and lo <= n <= hi and (b, n) in t]
    if not pairs:
        return "-"
    return "%.2f" % math.exp(sum(math.log(y / x) for x, y in pairs) / len(pairs))


def main(folders):
    runs = [{m: times_us(f"{f}/{m}/comm_ops_benchmark.json", strict=False) for m in ("graph", "eager")} for f in folders]
    modes = list(runs[0])
    head = " | ".join(f"{c} {m}" for m in modes for c, _, _ in CLASSES)
    print(f"| factor | from -> to | {head} |")
    print("|---|---|" + "---|" * (len(CLASSES) * len(modes)))
    for name, a, b in FACTORS:
        cells = []
        for m in modes:
            run = [r[m] for r in runs if any(k[0] == a for k in r[m]) and any(k[0] == b for k in r[m])]
            t = run[-1] if run else {}
            cells += [ratio(t, a, b, lo, hi) for _, lo, hi in CLASSES]
        print(f"| {name} | `{a}` -> `{b}` | {' | '.join(cells)} |")


if __name__ == "__main__":
    main(sys.argv[1:] or ["results/h200-mps/ablation"])
