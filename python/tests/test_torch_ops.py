"""allreduce_rs.ops, the torch custom operators, with real torch: each multi-rank test runs a scenario of
torch_jobs.py as the ranks of a job (test_allreduce.run_job), on the host driver with CPU tensors and CPU Inductor;
the CUDA-graph test runs where torch sees a GPU."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from test_allreduce import run_job

TORCH_JOBS = str(Path(__file__).with_name("torch_jobs.py"))


@pytest.fixture(scope="module")
def inductor(tmp_path_factory):
    """The environment of jobs that compile: a fresh Inductor cache per test run, so every run compiles its graphs
    rather than loading them, shared by a job's ranks; one compile thread per rank, as CI has 2 cores."""
    return {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path_factory.mktemp("inductor")), "TORCHINDUCTOR_COMPILE_THREADS": "1"}


def test_ops_register_with_their_schemas_and_only_when_imported():
    code = textwrap.dedent("""
        import sys, allreduce_rs
        assert "torch" not in sys.modules, "import allreduce_rs imported torch"
        import allreduce_rs.ops, torch
        for name in ["all_reduce", "all_reduce_", "all_reduce_out", "reduce_scatter", "all_reduce_add_rms_norm"]:
            print(getattr(torch.ops.allreduce_rs, name).default._schema)
        """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines() == [
        "allreduce_rs::all_reduce(Tensor x, str group, Tensor? bias=None) -> Tensor",
        "allreduce_rs::all_reduce_(Tensor(a0!) x, str group, Tensor? bias=None) -> ()",
        "allreduce_rs::all_reduce_out(Tensor x, str group, Tensor(a2!) out, Tensor? bias=None) -> ()",
        "allreduce_rs::reduce_scatter(Tensor x, str group, bool split_last_dim=False) -> Tensor",
        "allreduce_rs::all_reduce_add_rms_norm(Tensor x, str group, Tensor(a2!) residual, Tensor weight, float eps)"
        " -> Tensor",
    ], p.stdout


def test_eager_calls_skip_the_dispatcher_only_where_no_one_would_see_the_operator():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from allreduce_rs.ops import _undispatched

    x, w = torch.ones(4), torch.ones(4, requires_grad=True)
    assert _undispatched(x) and _undispatched(x, None)
    with torch.no_grad():
        assert _undispatched(w)
    with torch.inference_mode():
        assert _undispatched(torch.ones(4))
    assert not _undispatched(x, w), "a tensor that asks for gradients"
    assert not _undispatched(torch.nn.Parameter(torch.ones(4), requires_grad=False)), "a tensor subclass"
    with TorchDispatchMode():
        assert not _undispatched(x), "a dispatch mode"
    with FakeTensorMode() as fake:
        assert not _undispatched(fake.from_tensor(x)), "fake tensors"
    with torch.device("cpu"):
        assert not _undispatched(x), "a function mode"
    with torch.autograd.profiler.profile():
        assert not _undispatched(x), "the profiler"
    assert not torch.func.vmap(lambda t: torch.tensor(float(_undispatched(t))))(torch.ones(2, 3)).any()
    assert torch.compile(lambda t: t + float(_undispatched(t)), fullgraph=True, backend="eager")(x).eq(1).all()
    assert _undispatched(x), "after every mode has ended"


def test_every_op_sums_like_the_plain_call_on_every_dtype_and_shape():
    run_job(3, "values", script=TORCH_JOBS)


def test_opcheck_passes_on_every_op():
    run_job(2, "opcheck", script=TORCH_JOBS, env={"TORCHINDUCTOR_COMPILE_THREADS": "1"})


def test_a_compiled_block_gives_the_eager_bits(inductor):
    run_job(3, "compiled", script=TORCH_JOBS, env=inductor)


def test_a_compiled_norm_block_gives_the_eager_bits(inductor):
    run_job(3, "norm_block", script=TORCH_JOBS, env=inductor)


def test_two_communicators_alternate_eagerly_and_compiled(inductor):
    run_job(3, "two_groups", script=TORCH_JOBS, env=inductor)


def test_bad_names_and_shapes_are_refused_eagerly_and_while_compiling(inductor):
    run_job(2, "refusals", script=TORCH_JOBS, env=inductor)


# pytest.rs fails a run that skips a test, and CI has no GPU: so this test exists only where torch sees one (one rank
# per GPU, at most 2; ranks sharing a GPU would need MPS).
if torch.cuda.is_available():

    def test_reduce_overhead_compile_replays_the_op_in_cuda_graphs(inductor):
        run_job(min(torch.cuda.device_count(), 2), "cuda_compiled", script=TORCH_JOBS, env=inductor)


def test_across_sets_up_through_torch_distributed_s_store():
    run_job(4, "across_store", script=TORCH_JOBS)
