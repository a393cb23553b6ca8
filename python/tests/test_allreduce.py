"""allreduce_rs on the host driver: each multi-rank test runs a scenario of jobs.py as the ranks of a job started by
the package's launcher (``python -m allreduce_rs.launch``), which fails when any rank fails."""

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import allreduce_rs as ar
from allreduce_rs import launch

JOBS = str(Path(__file__).with_name("jobs.py"))
# Fresh random inputs on every run; the seed is in the environment of every job, and printed when one fails.
SEED = str(random.randrange(1 << 30))


def run_job(world, scenario, timeout=300, script=JOBS, env=None):
    """Runs ``script`` (jobs.py) SCENARIO as a ``world``-rank job, with ``env`` added to its environment; returns its
    output, failing the test (with the output) if the job failed or rank 0 did not report its checks passed."""
    cmd = [sys.executable, "-m", "allreduce_rs.launch", "-n", str(world), "--", sys.executable, script, scenario]
    env = {**os.environ, **(env or {}), "ARX_PY_SEED": SEED, "PYTHONUNBUFFERED": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    output = f"seed {SEED}; exit {p.returncode}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}"
    assert p.returncode == 0, f"{scenario} failed: {output}"
    assert f"[rank 0] {scenario} ok" in p.stdout, f"{scenario}: rank 0 did not finish its checks: {output}"
    return p.stdout + p.stderr


def test_sums_against_float64_same_bits_on_every_rank_and_path():
    run_job(3, "sums")


def test_allreduce_add_rms_norm_against_float64_same_bits_on_every_rank_and_algorithm():
    run_job(3, "norms")


def test_all_gather_is_every_input_in_rank_order_on_every_rank():
    run_job(3, "gathers")


def test_prepared_calls_match_the_plain_ones():
    run_job(3, "prepared")


def test_a_communicator_describes_itself_and_closes(tmp_path):
    run_job(2, "facts", env={"ALLREDUCE_TUNE_DIR": str(tmp_path)})


def test_every_bad_argument_raises_its_error():
    run_job(2, "bad_arguments")


def test_bad_construction_arguments_are_refused():
    p = subprocess.run([sys.executable, JOBS, "wrong_construction"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "wrong_construction ok" in p.stdout, p.stdout + p.stderr


def test_half_of_a_two_node_job_is_refused_at_once():
    """torchrun's variables for half of a 2-node job: UnsupportedError saying the job spans nodes, with no wait for
    the ranks of the other node."""
    code = textwrap.dedent("""
        import time, allreduce_rs as ar
        start = time.monotonic()
        try:
            ar.Communicator.from_env(backend="host")
        except ar.UnsupportedError as e:
            assert "spans nodes" in str(e) and time.monotonic() - start < 5, (str(e), time.monotonic() - start)
            print("refused")
        """)
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "0",
           "TORCHELASTIC_RUN_ID": "two-nodes", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    env.pop("ALLREDUCE_JOB_ID", None)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0 and "refused" in p.stdout, p.stdout + p.stderr


def test_across_nodes_on_the_host_driver_is_refused_on_every_rank():
    run_job(4, "across_refused")


def test_registered_buffers_through_dlpack():
    run_job(2, "registered")


def test_torch_path_with_a_stand_in_for_torch():
    run_job(2, "fake_torch_tensors")


def test_ranks_that_disagree_are_named():
    run_job(2, "mismatch")


def test_ranks_that_run_different_kernels_name_each_other():
    run_job(2, "different_kernels")


def test_a_peer_that_dies_is_named():
    out = run_job(3, "peer_dies")
    assert "[rank 2]" in out


def test_abort_ends_the_communicator_on_its_rank():
    run_job(2, "aborted")


def test_a_peer_that_never_comes_is_named():
    run_job(2, "peer_never_comes")


def test_import_loads_no_gpu_library_and_neither_torch_nor_numpy():
    code = textwrap.dedent("""
        import sys, allreduce_rs
        maps = open("/proc/self/maps").read()
        gpu_libs = ["libcuda", "libamdhip64", "libnvrtc", "libhiprtc", "libnccl", "librccl"]
        loaded = [lib for lib in gpu_libs if lib in maps]
        assert not loaded, loaded
        assert "torch" not in sys.modules and "numpy" not in sys.modules
        print("clean")
        """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "clean" in p.stdout, p.stdout + p.stderr


def test_the_launcher_names_the_rank_that_failed(capfd):
    code = "import os, sys; sys.exit(3 if os.environ['RANK'] == '1' else 0)"
    with pytest.raises(ar.LauncherError) as e:
        launch.run(2, [sys.executable, "-c", code])
    assert e.value.rank == 1 and "rank 1 failed" in str(e.value)
    p = subprocess.run(
        [sys.executable, "-m", "allreduce_rs.launch", "-n", "2", "--", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 1 and "rank 1 failed" in p.stderr, p.stderr


def test_no_launcher_is_a_launcher_error(monkeypatch):
    for var in list(os.environ):
        if var in ("RANK", "ALLREDUCE_JOB_ID") or var.startswith(("OMPI_", "SLURM_", "PMI_", "MPI_")):
            monkeypatch.delenv(var)
    with pytest.raises(ar.LauncherError, match="no launcher environment"):
        ar.Communicator.from_env(backend="host")


def test_bench_prints_its_table():
    cmd = [
        sys.executable,
        "-m",
        "allreduce_rs.launch",
        "-n",
        "2",
        "--",
        sys.executable,
        "-m",
        "allreduce_rs.bench",
        "--backend",
        "host",
        "--min_size",
        "10",
        "--max_size",
        "14",
        "--size_steps",
        "3",
        "--num_iters",
        "3",
        "--num_warmup_iters",
        "1",
        "--repeats",
        "1",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    for n in ["1024", "4096", "16384"]:
        assert n in p.stdout, p.stdout


def test_bench_times_each_sizes_methods_in_rounds(tmp_path):
    """Three repeats: every method's row holds one timing a round, each passed after its rounds."""
    out = tmp_path / "rows.json"
    cmd = [sys.executable, "-m", "allreduce_rs.launch", "-n", "2", "--", sys.executable, "-m", "allreduce_rs.bench"]
    cmd += ["--backend", "host", "--counts", "1024,4099", "--num_iters", "2", "--num_warmup_iters", "1"]
    cmd += ["--repeats", "3", "--output", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    import json

    rows = json.loads(out.read_text())["rows"]
    assert [(r["method"], r["count"]) for r in rows] == [
        (m, n) for n in [1024, 4099] for m in ["py", "py_inplace", "py+reg", "py_prepared"]
    ], rows
    for r in rows:
        assert r["status"] == "passed" and len(r["repeats_ms"]) == 3 and r["algorithm"], r


@pytest.mark.parametrize("flag", [["--repeats", "0"], ["--num_iters", "0"], ["--num_warmup_iters", "-1"]])
def test_bench_refuses_counts_it_cannot_time_before_any_work(flag, capsys):
    from allreduce_rs import bench

    with pytest.raises(SystemExit) as e:
        bench.main(["--backend", "host", *flag])
    assert e.value.code == 2 and "at least" in capsys.readouterr().err


def test_bench_rounds_give_each_method_a_slow_spell_alike(monkeypatch):
    """The rounds' order (every method once a round, in turn), a slow spell on the first round falling on both
    methods alike, the design each ran, a skipped method passed through in place, and a check after the last round
    that fails its method's row."""
    from types import SimpleNamespace

    from allreduce_rs import bench

    order = []
    arrays = SimpleNamespace(graph=False, comm=SimpleNamespace(last_algorithm=None))

    def check(method, count, arrays_, timer, op):
        if method == "skipped":
            return {"method": method, "status": "skipped"}

        def repeat():
            order.append(method)
            arrays.comm.last_algorithm = f"design of {method}"
            return (1.0 + (5.0 if len(order) <= 2 else 0.0), 1e-6)

        def recheck():
            return {"method": method, "status": "failed", "reason": "after the replays"} if method == "b" else None

        return bench.Pending({"method": method, "bytes": 2 * count}, repeat, recheck)

    monkeypatch.setattr(bench, "check_method", check)
    rows = bench.measure_size(["a", "skipped", "b"], 1024, arrays, SimpleNamespace(repeats=3), "allreduce")
    assert order == ["a", "b"] * 3
    assert [(r["method"], r["status"]) for r in rows] == [("a", "passed"), ("skipped", "skipped"), ("b", "failed")]
    assert rows[0]["repeats_ms"] == [6.0, 1.0, 1.0] and rows[0]["time_ms"] == 1.0, rows
    assert rows[0]["algorithm"] == "design of a" and rows[0]["issue_us"] == pytest.approx(1.0), rows


def test_the_stub_matches_the_module():
    """Every class, method and function of _native.pyi exists at run time with the same parameter names."""
    import ast
    import inspect

    from allreduce_rs import _native

    stub = Path(_native.__file__).with_name("_native.pyi")
    assert stub.with_name("py.typed").exists()
    tree = ast.parse(stub.read_text())

    def check(node, owner, where):
        for item in node.body:
            if isinstance(item, ast.ClassDef):
                check(item, getattr(owner, item.name), f"{where}{item.name}.")
            elif isinstance(item, ast.FunctionDef):
                runtime = getattr(owner, item.name)
                assert runtime is not None, f"{where}{item.name} missing"
                if isinstance(runtime, property) or item.name.startswith("__") or not callable(runtime):
                    continue
                a = item.args
                want = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg != "self"]
                got = [p for p in inspect.signature(runtime).parameters if p != "self"]
                assert got == want, f"{where}{item.name}: stub {want}, module {got}"

    check(tree, _native, "")
