#!/usr/bin/env python3
"""Runs of N (default 6) or more identical lines shared between two groups of files: the check that the CUDA and
HIP drivers say only what differs (everything they share lives in crates/gpu/src/device/). Lines are compared with
whitespace folded; blank lines, comments and lines of bare punctuation are skipped. Exits 1 when a run is shared.

    scripts/shared_runs.py crates/gpu/src/cuda crates/gpu/src/hip [--min 6]
"""
import argparse
import pathlib
import re
import sys


def lines(root):
    out = []
    for path in sorted(pathlib.Path(root).rglob("*.rs")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            text = re.sub(r"\s+", " ", line.strip())
            if not text or text.startswith("//") or re.fullmatch(r"[{}()\[\];,]*", text):
                continue
            out.append((text, path, number))
    return out


def shared(a, b, n):
    windows = {}
    for k in range(len(b) - n + 1):
        windows.setdefault(tuple(t for t, _, _ in b[k : k + n]), b[k])
    for k in range(len(a) - n + 1):
        other = windows.get(tuple(t for t, _, _ in a[k : k + n]))
        if other:
            yield a[k], other


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--min", type=int, default=6, help="shortest run reported [6]")
    opts = p.parse_args()
    hits = list(shared(lines(opts.a), lines(opts.b), opts.min))
    for (_, pa, la), (_, pb, lb) in hits:
        print(f"{pa}:{la} ~ {pb}:{lb}")
    print(f"{len(hits)} shared runs of {opts.min} lines between {opts.a} and {opts.b}")
    return 1 if hits else 0


if __name__ == "__main__":
    sys.exit(main())
