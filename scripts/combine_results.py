#!/usr/bin/env python3
"""Puts comm-bench's results next to its peers' and against the link bound, and says whether the goals are met.

    combine_results.py [FILE.json ...] [--ours F ...] [--peers F ...] [--link_gbs 450] [--out_dir DIR]

Inputs are comm-bench's comm_ops_benchmark.json and peer_bench.py's peer_ops_benchmark.json, eager and graph
(each file's `graph` field says which), and comm_bench.py's CSV (FBGEMM's own figures: eager, on --world ranks,
its methods named comm_bench.py/<column>, e.g. comm_bench.py/fbgemm_1shot). Positional files are sorted by content:
a CSV, a file with `torch_version`, or one whose methods are all torch_*, is a peer file. Writes DIR/combined_results.md and DIR/combined_results.csv and
prints the markdown.

Per mode and size: every method's time (us), algbw and busbw (GB/s); our best method and the best peer (lowest
passed time); ours / best peer (time: below 1 is faster); the link bound, time_bound = 2(W-1)/W x S / link with
S = N x 2 bytes, and ours / bound. "Ours" are comm-bench's own implementations: its methods other than the NCCL
wrappers (nccl*), which are shown but compete as neither side (override with --our_methods).

Goals, per mode: (1) at every size our best <= the best peer; (2) our best <= 6 us at every size up to 16384
elements; (3) our two-shot at 16777216 elements has busbw >= 350 GB/s; (4) our car_1shot and car_2shot each <= upstream
FBGEMM car's one-shot and two-shot (peer_bench's fbgemm_car_*, or comm_bench.py's fbgemm_* columns) at every size.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from typing import Any, Optional

ELEM_SIZE = 2  # bf16: S = N * 2 bytes
SMALL_MAX_COUNT = 16384
SMALL_MAX_US = 6.0
TWO_SHOT_COUNT = 16777216
TWO_SHOT_MIN_BUSBW = 350.0
MODES = ("eager", "graph")
# Our car and the names upstream car's same algorithm has in peer_bench.py's files and in comm_bench.py's CSV.
CAR_PAIRS = (("car_1shot", ("fbgemm_car_1shot", "comm_bench.py/fbgemm_1shot")),
             ("car_2shot", ("fbgemm_car_2shot", "comm_bench.py/fbgemm_2shot")))


def is_peer_doc(doc: dict[str, Any]) -> bool:
    methods = [r["method"] for r in doc.get("rows", [])]
    return ("torch_version" in doc or doc.get("source") == CSV_SOURCE
            or (bool(methods) and all(m.startswith("torch_") for m in methods)))


CSV_SOURCE = "comm_bench.py CSV"


def load_comm_bench_csv(path: str, world: int) -> dict[str, Any]:
    """comm_bench.py's CSV (N, then <method>_time in ms and <method>_bwidth in GB/s) as a document like ours."""
    with open(path, newline="") as f:
        table = [r for r in csv.reader(f) if r]
    head = table[0] if table else []
    stems = [t[:-len("_time")] for t in head[1::2]]
    if (not head or head[0] != "N" or len(head) % 2 != 1
            or any(t != s + "_time" or b != s + "_bwidth" for s, t, b in zip(stems, head[1::2], head[2::2]))):
        raise ValueError(f"{path}: line 1: expected comm_bench.py's CSV header N,<method>_time,<method>_bwidth,...")
    rows = []
    for line, cells in enumerate(table[1:], start=2):
        if len(cells) != len(head):
            raise ValueError(f"{path}: line {line}: {len(cells)} cells where the header has {len(head)}")
        count = int(cells[0])
        for k, stem in enumerate(stems):
            name, cell = f"comm_bench.py/{stem}", cells[1 + 2 * k]
            if cell == "":
                rows.append({"method": name, "count": count, "status": "skipped", "reason": "empty in the CSV"})
                continue
            ms = float(cell)
            algbw = count * ELEM_SIZE / (ms * 1e-3) / 1e9
            rows.append({"method": name, "count": count, "status": "passed", "time_ms": ms, "algbw_gbs": algbw,
                         "busbw_gbs": algbw * 2 * (world - 1) / world})
    return {"source": CSV_SOURCE, "world": world, "graph": False, "rows": rows}


def default_is_ours(method: str) -> bool:
    return not method.startswith("nccl")


def bound_us(count: int, world: int, link_gbs: float) -> float:
    """Time to move an allreduce's bus bytes, 2(W-1)/W x S, over one link of `link_gbs` GB/s, in us."""
    return 2 * (world - 1) / world * count * ELEM_SIZE / (link_gbs * 1e9) * 1e6


def _cell(row: dict[str, Any]) -> dict[str, Any]:
    status, reason = row["status"], row.get("reason")
    if status == "passed" and row.get("time_ms") is None:
        status, reason = "failed", "passed without a time"
    passed = status == "passed"
    return {
        "status": status,
        "reason": None if passed else reason,
        "time_us": row["time_ms"] * 1e3 if passed else None,
        "algbw": row.get("algbw_gbs") if passed else None,
        "busbw": row.get("busbw_gbs") if passed else None,
    }


def _best(cells: dict[str, dict[str, Any]], names: list[str]) -> Optional[tuple[str, float]]:
    timed = [(cells[n]["time_us"], n) for n in names if n in cells and cells[n]["time_us"] is not None]
    return (min(timed)[1], min(timed)[0]) if timed else None


def combine(ours: list[dict[str, Any]], peers: list[dict[str, Any]], link_gbs: float = 450.0,
            is_ours=default_is_ours) -> dict[str, Any]:
    """The combined table: {mode: {"world", "methods": {"ours", "peers", "other"}, "sizes": [entry, ...]}}."""
    modes: dict[str, Any] = {}
    for kind, docs in (("ours", ours), ("peer", peers)):
        for doc in docs:
            mode = "graph" if doc.get("graph") else "eager"
            m = modes.setdefault(mode, {"world": None, "worlds": set(), "methods": {"ours": [], "peers": [],
                                                                                       "other": []},
                                        "cells": {}})
            m["worlds"].add(doc["world"])
            if kind == "ours" or m["world"] is None:  # the bound is for the world our methods ran on
                m["world"] = doc["world"]
            for row in doc["rows"]:
                name = row["method"]
                group = "peers" if kind == "peer" else ("ours" if is_ours(name) else "other")
                if name not in m["methods"][group]:
                    m["methods"][group].append(name)
                key = (row["count"], name)
                if key in m["cells"]:
                    raise ValueError(f"{mode}: {name} at {row['count']} elements appears in more than one file")
                m["cells"][key] = _cell(row)
    out: dict[str, Any] = {}
    for mode in [x for x in MODES if x in modes]:
        m = modes[mode]
        counts = sorted({c for c, _ in m["cells"]})
        sizes = []
        for count in counts:
            cells = {name: cell for (c, name), cell in m["cells"].items() if c == count}
            our_best, best_peer = _best(cells, m["methods"]["ours"]), _best(cells, m["methods"]["peers"])
            b = bound_us(count, m["world"], link_gbs)
            sizes.append({
                "count": count, "bytes": count * ELEM_SIZE, "cells": cells, "our_best": our_best,
                "best_peer": best_peer, "bound_us": b,
                "ours_over_peer": our_best[1] / best_peer[1] if our_best and best_peer else None,
                "ours_over_bound": our_best[1] / b if our_best else None,
            })
        out[mode] = {"world": m["world"], "worlds": sorted(m["worlds"]), "methods": m["methods"], "sizes": sizes,
                     "link_gbs": link_gbs}
    return out


def goals(combined: dict[str, Any]) -> list[dict[str, Any]]:
    """Each goal per mode: {"mode", "key", "goal" (its wording), "verdict": met | not met | not measured, "detail",
    "per_size": [(count, True | False | None for n/a)]}."""
    wording = {"le_peer": "our best <= best peer at every size",
               "le_6us": f"our best <= {SMALL_MAX_US:g} us up to {SMALL_MAX_COUNT} elements",
               "two_shot": f"two-shot busbw >= {TWO_SHOT_MIN_BUSBW:g} GB/s at {TWO_SHOT_COUNT} elements",
               "car_le_upstream": "car_1shot and car_2shot each <= upstream car's same method at every size"}
    out = []
    for mode, m in combined.items():
        sizes = m["sizes"]
        if not m["methods"]["ours"]:
            out += [{"mode": mode, "key": k, "goal": w, "verdict": "not measured",
                     "detail": "no comm-bench results in this mode", "per_size": []} for k, w in wording.items()]
            continue
        # (1) our best <= best peer, at every size where a peer passed.
        per_size, misses = [], []
        for s in sizes:
            if s["best_peer"] is None:
                ok = None
            else:
                ok = s["our_best"] is not None and s["our_best"][1] <= s["best_peer"][1]
                if not ok:
                    ours = f"{s['our_best'][1]:.2f} us ({s['our_best'][0]})" if s["our_best"] else "no passed method"
                    misses.append(f"{s['count']}: {ours} vs {s['best_peer'][1]:.2f} us ({s['best_peer'][0]})")
            per_size.append((s["count"], ok))
        compared = [ok for _, ok in per_size if ok is not None]
        if not compared:
            verdict, detail = "not measured", "no size with a passed peer"
        elif all(compared):
            worst = max(s["ours_over_peer"] for s in sizes if s["ours_over_peer"] is not None)
            verdict, detail = "met", f"{len(compared)}/{len(compared)} sizes; worst ours/peer {worst:.3f}"
        else:
            verdict = "not met"
            detail = f"{sum(compared)}/{len(compared)} sizes; not at " + "; ".join(misses)
        out.append({"mode": mode, "key": "le_peer", "goal": wording["le_peer"], "verdict": verdict, "detail": detail,
                    "per_size": per_size})

        # (2) <= 6 us up to 16384 elements.
        small = [s for s in sizes if s["count"] <= SMALL_MAX_COUNT]
        per_size = [(s["count"], s["our_best"] is not None and s["our_best"][1] <= SMALL_MAX_US) for s in small]
        figures = "; ".join(f"{s['count']}: " + (f"{s['our_best'][1]:.2f} us ({s['our_best'][0]})" if s["our_best"]
                                                 else "no passed method") for s in small)
        verdict = "not measured" if not small else ("met" if all(ok for _, ok in per_size) else "not met")
        out.append({"mode": mode, "key": "le_6us", "goal": wording["le_6us"], "verdict": verdict,
                    "detail": figures or f"no size <= {SMALL_MAX_COUNT}", "per_size": per_size})

        # (3) two-shot busbw at 16M elements: the best of our two-shot methods.
        big = next((s for s in sizes if s["count"] == TWO_SHOT_COUNT), None)
        two = [n for n in m["methods"]["ours"] if "2shot" in n]
        timed = [] if big is None else [(big["cells"][n]["busbw"], n) for n in two
                                        if n in big["cells"] and big["cells"][n]["busbw"] is not None]
        if big is None or not two:
            verdict, detail = "not measured", f"no two-shot result at {TWO_SHOT_COUNT} elements"
        elif not timed:
            why = "; ".join(f"{n} {big['cells'][n]['status']}" for n in two if n in big["cells"])
            verdict, detail = "not met", f"no two-shot passed ({why})"
        else:
            bw, n = max(timed)
            verdict = "met" if bw >= TWO_SHOT_MIN_BUSBW else "not met"
            detail = f"{n} {bw:.1f} GB/s busbw ({big['cells'][n]['time_us']:.1f} us)"
        out.append({"mode": mode, "key": "two_shot", "goal": wording["two_shot"], "verdict": verdict, "detail": detail,
                    "per_size": []})
        out.append(_car_goal(mode, sizes, wording["car_le_upstream"]))
    return out


def _car_goal(mode: str, sizes: list[dict[str, Any]], goal: str) -> dict[str, Any]:
    """(4): at each size where upstream car's counterpart passed, our car method passed and was no slower."""
    per_size, misses, worst = [], [], {}
    for s in sizes:
        cells, verdicts = s["cells"], []
        for ours, names in CAR_PAIRS:
            theirs = next((n for n in names if n in cells and cells[n]["time_us"] is not None), None)
            if theirs is None or ours not in cells:
                continue
            mine, up = cells[ours]["time_us"], cells[theirs]["time_us"]
            if mine is None:
                verdicts.append(False)
                misses.append(f"{s['count']}: {ours} {cells[ours]['status']}")
                continue
            ratio = mine / up
            worst[ours] = max(worst.get(ours, 0.0), ratio)
            verdicts.append(ratio <= 1.0)
            if ratio > 1.0:
                misses.append(f"{s['count']}: {ours} {mine:.2f} us vs {up:.2f} us ({theirs}), {ratio:.3f}x")
        per_size.append((s["count"], all(verdicts) if verdicts else None))
    judged = [ok for _, ok in per_size if ok is not None]
    worst_text = ", ".join(f"{n}/upstream {r:.3f}" for n, r in worst.items())
    if not judged:
        verdict, detail = "not measured", "no size with both our car and upstream car's same method"
    elif all(judged):
        verdict, detail = "met", f"{len(judged)}/{len(judged)} sizes; worst {worst_text}"
    else:
        verdict = "not met"
        detail = f"{sum(judged)}/{len(judged)} sizes; not at " + "; ".join(misses)
    return {"mode": mode, "key": "car_le_upstream", "goal": goal, "verdict": verdict, "detail": detail,
            "per_size": per_size}


def _fmt(v: Optional[float], digits: int = 2) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def _md_cell(cell: Optional[dict[str, Any]]) -> str:
    if cell is None:
        return "-"
    if cell["time_us"] is None:
        return "FAILED" if cell["status"] == "failed" else "skipped"
    return f"{cell['time_us']:.2f} / {cell['algbw']:.2f} / {cell['busbw']:.2f}"


def render_md(combined: dict[str, Any], goal_list: list[dict[str, Any]]) -> str:
    lines = ["# comm-bench vs peers (allreduce, bf16)", ""]
    for mode, m in combined.items():
        names = m["methods"]["ours"] + m["methods"]["other"] + m["methods"]["peers"]
        lines += [f"## {mode}", "",
                  f"W = {m['world']}" + (f" (files disagree: {m['worlds']})" if len(m["worlds"]) > 1 else "")
                  + f"; cells are time us / algbw / busbw GB/s; bound = 2(W-1)/W x N x 2 B / {m['link_gbs']:g} GB/s;"
                  f" ours: {', '.join(m['methods']['ours']) or 'none'}; peers: "
                  f"{', '.join(m['methods']['peers']) or 'none'}", "",
                  "| N | bytes | " + " | ".join(names)
                  + " | our best | best peer | ours/peer | bound us | ours/bound |",
                  "|---:|---:|" + "---:|" * len(names) + "---|---|---:|---:|---:|"]
        for s in m["sizes"]:
            best = lambda b: f"{b[0]} {b[1]:.2f}" if b else "-"  # noqa: E731
            lines.append(f"| {s['count']} | {s['bytes']} | " + " | ".join(_md_cell(s["cells"].get(n)) for n in names)
                         + f" | {best(s['our_best'])} | {best(s['best_peer'])} | {_fmt(s['ours_over_peer'], 3) or '-'}"
                         f" | {s['bound_us']:.3g} | {_fmt(s['ours_over_bound'], 2) or '-'} |")
        notes = sorted({(n, c["status"], c["reason"]) for s in m["sizes"] for n, c in s["cells"].items()
                        if c["time_us"] is None})
        if notes:
            lines += ["", "Not timed:"]
            lines += [f"- {n} {st}: {r or '(no reason given)'}" for n, st, r in notes]
        lines.append("")
    lines += ["## Goals", ""]
    for g in goal_list:
        lines.append(f"- **{g['mode']}**, {g['goal']}: **{g['verdict']}**: {g['detail']}")
    for mode in combined:
        per = {g["goal"]: dict(g["per_size"]) for g in goal_list if g["mode"] == mode and g["per_size"]}
        if not per:
            continue
        lines += ["", f"Per size ({mode}):", "", "| N | " + " | ".join(per) + " |", "|---:|" + "---|" * len(per)]
        for s in combined[mode]["sizes"]:
            marks = [{True: "yes", False: "no", None: "n/a"}[p.get(s["count"])] if s["count"] in p else "-"
                     for p in per.values()]
            lines.append(f"| {s['count']} | " + " | ".join(marks) + " |")
    return "\n".join(lines) + "\n"


def render_csv(combined: dict[str, Any], goal_list: list[dict[str, Any]]) -> str:
    names: list[str] = []
    for m in combined.values():
        for n in m["methods"]["ours"] + m["methods"]["other"] + m["methods"]["peers"]:
            if n not in names:
                names.append(n)
    head = ["mode", "N", "bytes", "world"]
    for n in names:
        head += [f"{n}_time_us", f"{n}_algbw_gbs", f"{n}_busbw_gbs", f"{n}_status"]
    head += ["our_best", "our_best_time_us", "best_peer", "best_peer_time_us", "ours_over_best_peer", "bound_us",
             "ours_over_bound", "ours_le_peer", "le_6us", "car_le_upstream"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    yn = {True: "yes", False: "no", None: "n/a"}
    for mode, m in combined.items():
        per = {g["key"]: dict(g["per_size"]) for g in goal_list if g["mode"] == mode}
        le_peer, le_6, car = per.get("le_peer", {}), per.get("le_6us", {}), per.get("car_le_upstream", {})
        for s in m["sizes"]:
            row: list[Any] = [mode, s["count"], s["bytes"], m["world"]]
            for n in names:
                c = s["cells"].get(n)
                row += ["", "", "", ""] if c is None else [c["time_us"], c["algbw"], c["busbw"], c["status"]]
            ob, bp = s["our_best"], s["best_peer"]
            row += [ob[0] if ob else "", ob[1] if ob else "", bp[0] if bp else "", bp[1] if bp else "",
                    s["ours_over_peer"], s["bound_us"], s["ours_over_bound"],
                    yn[le_peer[s["count"]]] if s["count"] in le_peer else "",
                    yn[le_6[s["count"]]] if s["count"] in le_6 else "",
                    yn[car[s["count"]]] if s["count"] in car else ""]
            w.writerow(["" if v is None else v for v in row])
    return buf.getvalue()


def load(paths: list[str], world: int = 8) -> list[dict[str, Any]]:
    docs = []
    for p in paths:
        with open(p) as f:
            is_json = f.read(1) == "{"
        if is_json:
            with open(p) as f:
                doc = json.load(f)
        else:
            doc = load_comm_bench_csv(p, world)
        doc["_path"] = p
        docs.append(doc)
    return docs


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", help="JSON files, sorted into ours and peers by content")
    p.add_argument("--ours", nargs="*", default=[], help="comm-bench JSON files")
    p.add_argument("--peers", nargs="*", default=[], help="peer_bench.py JSON files")
    p.add_argument("--world", type=int, default=8, help="ranks of a comm_bench.py CSV's run (the CSV does not say)")
    p.add_argument("--link_gbs", "--link-gbs", type=float, default=450.0, help="per-GPU link bandwidth, GB/s")
    p.add_argument("--our_methods", "--our-methods", default=None,
                   help="comma-separated comm-bench methods that count as ours (default: all but nccl*)")
    p.add_argument("--out_dir", "--out-dir", default=".", help="where combined_results.md/.csv go")
    args = p.parse_args(argv)
    ours, peers = load(args.ours, args.world), load(args.peers, args.world)
    for doc in load(args.files, args.world):
        (peers if is_peer_doc(doc) else ours).append(doc)
    if not ours and not peers:
        p.error("no input files")
    is_ours = default_is_ours
    if args.our_methods is not None:
        chosen = {m.strip() for m in args.our_methods.split(",") if m.strip()}
        is_ours = chosen.__contains__
    combined = combine(ours, peers, args.link_gbs, is_ours)
    goal_list = goals(combined)
    md, table = render_md(combined, goal_list), render_csv(combined, goal_list)
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "combined_results.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out_dir, "combined_results.csv"), "w") as f:
        f.write(table)
    sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
