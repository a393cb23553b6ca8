"""Tests of the torch-free parts of peer_bench.py and of combine_results.py.

    python3 -m unittest scripts/test_peer_bench.py
"""

import csv
import io
import json
import os
import random
import struct
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import combine_results as cr  # noqa: E402
import peer_bench as pb  # noqa: E402

# The N column of comm_bench.py's table on MI300X (HIP alignment, 512), default sweep.
HIP_SIZES = [1024, 2048, 3072, 5120, 8192, 13312, 22016, 36864, 60928, 101888, 169472, 282112, 470016, 783360,
             1305600, 2175488, 3624960, 6041088, 10067456, 16777216]
W = 8


def refusal(argv: list[str]) -> object:
    """parse_args's exit code for argv (argparse's error exits 2), its message kept off the test output."""
    with open(os.devnull, "w") as null:
        old, sys.stderr = sys.stderr, null
        try:
            pb.parse_args(argv)
        except SystemExit as e:
            return e.code
        finally:
            sys.stderr = old
    return None


def bf16(x: float) -> float:
    """x rounded to bf16 (round to nearest even on the float32 bits)."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


class PeerBenchPure(unittest.TestCase):
    def test_import_is_torch_free_and_disables_multicast(self):
        if "torch" not in sys.modules:  # only meaningful when nothing else imported torch first
            import importlib

            importlib.reload(pb)
            self.assertNotIn("torch", sys.modules)
        self.assertEqual(os.environ["NCCL_NVLS_ENABLE"], "0")
        self.assertEqual(os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"], "1")
        self.assertEqual(os.environ["NVSHMEM_DISABLE_NVLS"], "1")

    def test_sizes_equal_comm_bench_py(self):
        self.assertEqual(pb.comm_bench_sizes(10, 24, 20, 512), HIP_SIZES)
        cuda = pb.comm_bench_sizes(10, 24, 20, 256)
        self.assertEqual(len(cuda), 20)
        self.assertEqual(cuda[:2], [1024, 1792])
        self.assertEqual(cuda[-1], 16777216)
        self.assertTrue(all(n % 256 == 0 for n in cuda))
        self.assertEqual(pb.comm_bench_sizes(12, 12, 1, 256), [4096])
        self.assertEqual(pb.round_up(1025, 256), 1280)

    def test_median(self):
        self.assertEqual(pb.median([3.0, 1.0, 2.0]), 2.0)
        self.assertEqual(pb.median([4.0, 1.0, 3.0, 2.0]), 2.5)
        self.assertTrue(pb.median([]) != pb.median([]))  # NaN

    def test_bandwidth_formulas(self):
        # comm_bench.py: N * elem_size / (time_ms * 1e-3) / 1e9
        self.assertAlmostEqual(pb.bwidth_gbs(16777216, 1.0), 33.554432)
        self.assertAlmostEqual(pb.bwidth_gbs(1024, 0.01), 1024 * 2 / 1e-5 / 1e9)
        self.assertAlmostEqual(pb.busbw_factor(8), 1.75)
        self.assertAlmostEqual(pb.busbw_factor(2), 1.0)

    def test_rows(self):
        row = pb.make_row("torch_nccl", 1024, W, "passed", repeats_ms=[0.012, 0.010, 0.011], rank0_ms=0.0105)
        self.assertEqual(row["time_ms"], 0.011)
        self.assertEqual(row["bytes"], 2048)
        self.assertAlmostEqual(row["algbw_gbs"], 2048 / 0.011e-3 / 1e9)
        self.assertAlmostEqual(row["busbw_gbs"], row["algbw_gbs"] * 1.75)
        self.assertEqual(row["repeats_ms"], [0.012, 0.010, 0.011])
        self.assertNotIn("reason", row)  # as comm-bench's serde: reason only for failed/skipped
        bad = pb.make_row("torch_symm_2shot", 1024, W, "failed", "rank 3: 4 wrong element(s)")
        self.assertEqual((bad["status"], bad["reason"], bad["time_ms"], bad["repeats_ms"]),
                         ("failed", "rank 3: 4 wrong element(s)", None, []))
        with self.assertRaises(AssertionError):
            pb.make_row("torch_nccl", 1024, W, "ok")

    def test_csv_columns_and_empty_cells(self):
        rows = [pb.make_row("torch_nccl", 1024, W, "passed", repeats_ms=[0.02]),
                pb.make_row("torch_symm_1shot", 1024, W, "failed", "wrong"),
                pb.make_row("torch_symm_2shot", 1024, W, "skipped", "symm_mem: refused"),
                pb.make_row("torch_nccl", 2048, W, "skipped", "no NCCL")]
        lines = pb.csv_text(rows).splitlines()
        # comm_bench.py's column order, and only the methods that ran (upstream car's need its source).
        self.assertEqual(lines[0], "N,symm_1shot_time,symm_1shot_bwidth,symm_2shot_time,symm_2shot_bwidth,"
                                   "nccl_time,nccl_bwidth")
        self.assertEqual(lines[1], f"1024,,,,,0.02,{pb.bwidth_gbs(1024, 0.02)!r}")
        self.assertEqual(lines[2], "2048,,,,,,")
        car = [pb.make_row("fbgemm_car_2shot", 1024, W, "passed", repeats_ms=[0.03])] + rows[:1]
        self.assertEqual(pb.csv_text(car).splitlines()[0], "N,fbgemm_2shot_time,fbgemm_2shot_bwidth,nccl_time,"
                                                           "nccl_bwidth")

    def test_json_has_comm_bench_structure(self):
        rows = [pb.make_row("torch_nccl", 1024, W, "passed", repeats_ms=[0.02], rank0_ms=0.02)]
        meta = {"driver": "cuda", "device": "NVIDIA H200", "arch": "sm_90", "world": W, "graph": True,
                "num_iters": 20, "num_warmup_iters": 10, "repeats": 3, "torch_version": "2.11.0",
                "nccl_version": "2.28.3"}
        with tempfile.TemporaryDirectory() as d:
            csv_path, json_path = pb.write_outputs(d, pb.outcome(meta, rows))
            self.assertEqual(os.path.basename(csv_path), "peer_ops_benchmark.csv")
            with open(json_path) as f:
                doc = json.load(f)
        for key in ("driver", "device", "world", "op", "dtype", "graph", "num_iters", "num_warmup_iters", "repeats",
                    "ceilings", "rows", "torch_version", "nccl_version"):
            self.assertIn(key, doc)
        self.assertEqual((doc["op"], doc["dtype"], doc["graph"]), ("allreduce", "bf16", True))
        self.assertEqual(set(doc["rows"][0]), {"method", "op", "dtype", "count", "bytes", "status", "time_ms",
                                               "repeats_ms", "rank0_ms", "algbw_gbs", "busbw_gbs"})
        self.assertTrue(cr.is_peer_doc(doc))

    def test_tolerance_passes_bf16_partial_rounding_and_catches_a_missing_rank(self):
        rng = random.Random(0)
        n = 2000
        inputs = [[bf16(rng.random()) for _ in range(n)] for _ in range(W)]
        ref = [sum(col) for col in zip(*inputs)]
        tol = pb.check_tolerance(W)

        def wrong(out):
            return sum(1 for o, r in zip(out, ref) if not abs(o - r) <= tol * abs(r) + 1e-30)

        # A ring or pairwise bf16 kernel: every partial sum rounded to bf16.
        ring = []
        for col in zip(*inputs):
            acc = col[0]
            for v in col[1:]:
                acc = bf16(acc + v)
            ring.append(acc)
        self.assertEqual(wrong(ring), 0)
        self.assertEqual(wrong([bf16(r) for r in ref]), 0)
        missing = [sum(col[:-1]) for col in zip(*inputs)]
        self.assertGreater(wrong(missing), n // 2)
        self.assertEqual(wrong(ring[:5] + [float("nan")] + ring[6:]), 1)

    def test_input_seeds_are_distinct(self):
        seeds = {pb.input_seed(0, c, r) for c in HIP_SIZES for r in range(W)}
        self.assertEqual(len(seeds), len(HIP_SIZES) * W)

    def test_args_defaults_match_comm_bench_py(self):
        a = pb.parse_args([])
        self.assertEqual((a.num_iters, a.num_warmup_iters, a.min_size, a.max_size, a.size_steps, a.repeats),
                         (20, 10, 10, 24, 20, 3))
        self.assertEqual(a.methods, ["torch_symm_1shot", "torch_symm_2shot", "torch_nccl"])
        self.assertEqual(pb.parse_args(["--methods", "torch_nccl,torch_symm_2shot"]).methods,
                         ["torch_symm_2shot", "torch_nccl"])
        self.assertEqual(refusal(["--methods", "torch_9shot"]), 2)

    def test_upstream_car_needs_an_fbgemm_tree(self):
        self.assertEqual(refusal(["--methods", "fbgemm_car_1shot"]), 2)
        with tempfile.TemporaryDirectory() as d:
            self.assertEqual(refusal(["--fbgemm_src", d]), 2)
            with self.assertRaisesRegex(ValueError, "car.cu.*car.cpp.*include"):
                pb.fbgemm_car_paths(d)
            comm = os.path.join(d, "fbgemm_gpu", "experimental", "gen_ai", "src", "comm")
            os.makedirs(comm)
            os.makedirs(os.path.join(d, "fbgemm_gpu", "include"))
            for f in ("car.cu", "car.cpp"):
                open(os.path.join(comm, f), "w").close()
            sources, include = pb.fbgemm_car_paths(d)
            self.assertEqual(sources, [os.path.join(comm, "car.cu"), os.path.join(comm, "car.cpp")])
            self.assertEqual(include, os.path.join(d, "fbgemm_gpu", "include"))
            self.assertEqual(pb.parse_args(["--fbgemm_src", d]).methods,
                             ["fbgemm_car_1shot", "torch_symm_1shot", "fbgemm_car_2shot", "torch_symm_2shot",
                              "torch_nccl"])
            self.assertEqual(pb.parse_args(["--fbgemm_src", d, "--methods", "fbgemm_car_2shot"]).methods,
                             ["fbgemm_car_2shot"])


def ours_row(method, count, status="passed", time_us=None, reason=None):
    """A comm-bench row (report.rs), timings from `time_us`."""
    row = {"method": method, "op": "allreduce", "dtype": "bf16", "count": count, "bytes": 2 * count,
           "status": status, "time_ms": None, "repeats_ms": [], "rank0_ms": None, "algbw_gbs": None,
           "busbw_gbs": None}
    if status != "passed":
        row["reason"] = reason
    else:
        t = time_us * 1e-3
        algbw = pb.bwidth_gbs(count, t)
        row.update(time_ms=t, repeats_ms=[t, t, t], rank0_ms=t, algbw_gbs=algbw, busbw_gbs=algbw * 1.75)
    return row


def peer_row(method, count, status="passed", time_us=None, reason=None):
    if status != "passed":
        return pb.make_row(method, count, W, status, reason)
    return pb.make_row(method, count, W, "passed", repeats_ms=[time_us * 1e-3])


BIG = 16777216


def ours_doc(graph, rows):
    return {"driver": "cuda", "device": "NVIDIA H200", "world": W, "op": "allreduce", "dtype": "bf16",
            "graph": graph, "num_iters": 20, "num_warmup_iters": 10, "repeats": 3, "ceilings": {}, "rows": rows}


def peer_doc(graph, rows):
    return pb.outcome({"world": W, "graph": graph, "torch_version": "2.11.0", "nccl_version": "2.28.3"}, rows)


def synthetic():
    ours_eager = ours_doc(False, [
        ours_row("car_1shot", 1024, time_us=5.0), ours_row("car_2shot", 1024, time_us=12.0),
        ours_row("symm_2shot", 1024, time_us=20.0), ours_row("nccl", 1024, "skipped", reason="no NCCL"),
        ours_row("car_1shot", BIG, time_us=600.0),
        ours_row("car_2shot", BIG, "failed", reason="before timing: rank 3 has 5 wrong element(s)"),
        ours_row("symm_2shot", BIG, time_us=160.0), ours_row("nccl", BIG, "skipped", reason="no NCCL")])
    peers_eager = peer_doc(False, [
        peer_row("torch_nccl", 1024, time_us=10.0), peer_row("torch_symm_1shot", 1024, time_us=8.0),
        peer_row("torch_symm_2shot", 1024, "skipped", "symm_mem: refused"),
        peer_row("torch_nccl", BIG, time_us=200.0), peer_row("torch_symm_1shot", BIG, "failed", "rank 1: wrong"),
        peer_row("torch_symm_2shot", BIG, "skipped", "symm_mem: refused")])
    ours_graph = ours_doc(True, [
        ours_row("car_1shot", 1024, time_us=7.0), ours_row("symm_2shot", BIG, time_us=200.0),
        ours_row("car_2shot", BIG, "skipped", reason="cannot be captured into a graph")])
    peers_graph = peer_doc(True, [
        peer_row("torch_nccl", 1024, time_us=6.5), peer_row("torch_nccl", BIG, "skipped", "capture refused")])
    return [ours_eager, ours_graph], [peers_eager, peers_graph]


class Combine(unittest.TestCase):
    def setUp(self):
        ours, peers = synthetic()
        self.c = cr.combine(ours, peers, 450.0)
        self.goals = {(g["mode"], g["key"]): g for g in cr.goals(self.c)}

    def size(self, mode, count):
        return next(s for s in self.c[mode]["sizes"] if s["count"] == count)

    def test_methods_are_sorted_into_ours_other_and_peers(self):
        m = self.c["eager"]["methods"]
        self.assertEqual(m["ours"], ["car_1shot", "car_2shot", "symm_2shot"])
        self.assertEqual(m["other"], ["nccl"])
        self.assertEqual(m["peers"], ["torch_nccl", "torch_symm_1shot", "torch_symm_2shot"])

    def test_best_ratios_and_bound(self):
        s = self.size("eager", 1024)
        self.assertEqual(s["our_best"], ("car_1shot", 5.0))
        self.assertEqual(s["best_peer"][0], "torch_symm_1shot")
        self.assertAlmostEqual(s["ours_over_peer"], 5.0 / 8.0)
        bound = 2 * 7 / 8 * 2048 / 450e9 * 1e6
        self.assertAlmostEqual(s["bound_us"], bound)
        self.assertAlmostEqual(s["ours_over_bound"], 5.0 / bound)
        # At 16M the failed car_2shot and the failed/skipped peers do not compete.
        s = self.size("eager", BIG)
        self.assertEqual(s["our_best"][0], "symm_2shot")
        self.assertEqual(s["best_peer"][0], "torch_nccl")
        self.assertAlmostEqual(s["ours_over_peer"], 0.8)
        self.assertAlmostEqual(s["bound_us"], 1.75 * BIG * 2 / 450e9 * 1e6)
        self.assertAlmostEqual(s["ours_over_bound"], 160.0 / (1.75 * BIG * 2 / 450e9 * 1e6))
        self.assertEqual(s["cells"]["car_2shot"]["status"], "failed")
        self.assertIsNone(s["cells"]["car_2shot"]["time_us"])
        self.assertEqual(s["cells"]["torch_symm_2shot"]["status"], "skipped")
        # Graph 16M: the only peer skipped, so no ratio.
        s = self.size("graph", BIG)
        self.assertIsNone(s["best_peer"])
        self.assertIsNone(s["ours_over_peer"])

    def test_goal_verdicts(self):
        g = self.goals
        self.assertEqual(g["eager", "le_peer"]["verdict"], "met")
        self.assertEqual(g["eager", "le_peer"]["per_size"], [(1024, True), (BIG, True)])
        self.assertEqual(g["eager", "le_6us"]["verdict"], "met")
        self.assertEqual(g["eager", "two_shot"]["verdict"], "met")  # symm_2shot: 367 GB/s; car_2shot failed
        self.assertIn("symm_2shot 367.0 GB/s", g["eager", "two_shot"]["detail"])
        self.assertEqual(g["graph", "le_peer"]["verdict"], "not met")
        self.assertEqual(g["graph", "le_peer"]["per_size"], [(1024, False), (BIG, None)])
        self.assertIn("1024: 7.00 us (car_1shot) vs 6.50 us (torch_nccl)", g["graph", "le_peer"]["detail"])
        self.assertEqual(g["graph", "le_6us"]["verdict"], "not met")
        self.assertEqual(g["graph", "two_shot"]["verdict"], "not met")  # 293.6 GB/s
        self.assertIn("293.6 GB/s", g["graph", "two_shot"]["detail"])

    def test_car_is_held_to_upstream_cars_same_method(self):
        self.assertEqual(self.goals["eager", "car_le_upstream"]["verdict"], "not measured")  # no upstream peer
        ours = [ours_doc(False, [
            ours_row("car_1shot", 1024, time_us=5.0), ours_row("car_2shot", 1024, time_us=12.0),
            ours_row("car_1shot", BIG, time_us=600.0), ours_row("car_2shot", BIG, "failed", reason="x")])]
        slower = [peer_doc(False, [
            peer_row("fbgemm_car_1shot", 1024, time_us=6.0), peer_row("fbgemm_car_2shot", 1024, time_us=11.0),
            peer_row("fbgemm_car_1shot", BIG, time_us=700.0), peer_row("fbgemm_car_2shot", BIG, time_us=300.0)])]
        g = {x["key"]: x for x in cr.goals(cr.combine(ours, slower))}["car_le_upstream"]
        self.assertEqual((g["verdict"], g["per_size"]), ("not met", [(1024, False), (BIG, False)]))
        self.assertIn("1024: car_2shot 12.00 us vs 11.00 us (fbgemm_car_2shot), 1.091x", g["detail"])
        self.assertIn(f"{BIG}: car_2shot failed", g["detail"])
        # comm_bench.py's own columns count as upstream too; our best elsewhere does not stand in for car.
        csv_rows = [{"method": f"comm_bench.py/fbgemm_{k}shot", "count": 1024, "status": "passed", "time_ms": ms,
                     "algbw_gbs": 1.0, "busbw_gbs": 1.0} for k, ms in ((1, 0.006), (2, 0.013))]
        ours = [ours_doc(False, [ours_row("car_1shot", 1024, time_us=5.0), ours_row("car_2shot", 1024, time_us=12.0),
                                 ours_row("symm_2shot", BIG, time_us=1.0)])]
        peers = [{"source": cr.CSV_SOURCE, "world": W, "graph": False, "rows": csv_rows}]
        g = {x["key"]: x for x in cr.goals(cr.combine(ours, peers))}["car_le_upstream"]
        self.assertEqual((g["verdict"], g["per_size"]), ("met", [(1024, True), (BIG, None)]))
        self.assertIn("worst car_1shot/upstream 0.833, car_2shot/upstream 0.923", g["detail"])

    def test_no_passed_two_shot_is_not_met_and_absent_size_not_measured(self):
        ours = [ours_doc(False, [ours_row("car_2shot", BIG, "failed", reason="x")])]
        g = {x["key"]: x for x in cr.goals(cr.combine(ours, []))}
        self.assertEqual(g["two_shot"]["verdict"], "not met")
        self.assertEqual(g["le_peer"]["verdict"], "not measured")
        self.assertEqual(g["le_6us"]["verdict"], "not measured")

    def test_peers_alone_are_not_judged(self):
        _, peers = synthetic()
        c = cr.combine([], peers)
        self.assertEqual(c["eager"]["sizes"][0]["best_peer"], ("torch_symm_1shot", 8.0))
        self.assertEqual({g["verdict"] for g in cr.goals(c)}, {"not measured"})

    def test_duplicate_rows_are_refused(self):
        ours, _ = synthetic()
        with self.assertRaises(ValueError):
            cr.combine([ours[0], ours[0]], [])

    def test_reads_comm_bench_py_csv_as_peer(self):
        ref = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "comm-bench", "tests", "data",
                           "mi300x-8rank-comm-bench.csv")
        [doc] = cr.load([ref])
        self.assertTrue(cr.is_peer_doc(doc))
        first = next(r for r in doc["rows"] if r["method"] == "comm_bench.py/fbgemm_1shot")
        self.assertEqual((first["count"], first["status"]), (1024, "passed"))
        self.assertAlmostEqual(first["busbw_gbs"], first["algbw_gbs"] * 1.75)
        combined = cr.combine([], [doc])
        self.assertIn("comm_bench.py/nccl", combined["eager"]["methods"]["peers"])
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write("size,time\n1,2\n")
        with self.assertRaisesRegex(ValueError, "line 1: expected comm_bench.py's CSV"):
            cr.load([f.name])
        os.unlink(f.name)

    def test_main_writes_markdown_and_csv(self):
        ours, peers = synthetic()
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for i, doc in enumerate(ours + peers):
                paths.append(os.path.join(d, f"{i}.json"))
                with open(paths[-1], "w") as f:
                    json.dump(doc, f)
            old, sys.stdout = sys.stdout, io.StringIO()
            try:
                self.assertEqual(cr.main(paths + ["--out_dir", d]), 0)  # sorted into ours/peers by content
            finally:
                sys.stdout = old
            with open(os.path.join(d, "combined_results.md")) as f:
                md = f.read()
            with open(os.path.join(d, "combined_results.csv")) as f:
                table = list(csv.DictReader(f))
        self.assertIn("| 1024 | 2048 | 5.00 / ", md)
        self.assertIn("FAILED", md)
        self.assertIn("skipped", md)
        self.assertIn("car_2shot failed: before timing: rank 3 has 5 wrong element(s)", md)
        self.assertIn("**graph**, our best <= best peer at every size: **not met**", md)
        self.assertEqual(len(table), 4)
        row = next(r for r in table if r["mode"] == "eager" and r["N"] == "1024")
        self.assertEqual((row["our_best"], row["best_peer"], row["ours_le_peer"], row["le_6us"]),
                         ("car_1shot", "torch_symm_1shot", "yes", "yes"))
        self.assertAlmostEqual(float(row["ours_over_best_peer"]), 0.625)
        self.assertEqual(row["car_2shot_status"], "passed")
        big = next(r for r in table if r["mode"] == "eager" and r["N"] == str(BIG))
        self.assertEqual((big["car_2shot_status"], big["car_2shot_time_us"], big["le_6us"]), ("failed", "", ""))
        graph_big = next(r for r in table if r["mode"] == "graph" and r["N"] == str(BIG))
        self.assertEqual((graph_big["best_peer"], graph_big["ours_le_peer"]), ("", "n/a"))


if __name__ == "__main__":
    unittest.main()
