#!/usr/bin/env bash
# The Python package on a GPU node, from what `cargo xtask bundle` put into dist/ (the allreduce_rs wheel,
# comm-bench, gpu_smoke, row_parallel.py and these scripts; nothing is built here):
#   gpu_python.sh OUT_DIR
# Installs the wheel into a private folder (pip --no-index --target), then: real torch tensors eagerly and inside
# torch.cuda.graph at every comm_bench.py size and dtype, checked against the float64 sum of every rank's input and
# for the same bits on every rank (plus in place, reduce-scatter, the registered buffers through DLPack, register of
# a torch tensor, the refusals, and allreduce_rs.ops under torch.compile, with reduce-overhead's CUDA graphs too);
# CPU tensors on the host driver; the README's row-parallel layer under torchrun;
# the Python bench's sweep, eager and graph; and the Python path's per-call cost over comm-bench's own
# `auto` at 1024 elements (OUT_DIR/overhead.txt).
# With fewer GPUs than ranks the ranks run under MPS.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: gpu_python.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export ALLREDUCE_TUNE_DIR=$out/tune-cache PYTHONUNBUFFERED=1
source "$here/gpu_env.sh" "$out"
python=${PYTHON:-python3}
wheels=("$here"/allreduce_rs-*.whl)
[ -f "${wheels[0]}" ] || { echo "no allreduce_rs wheel in $here: run cargo xtask bundle" >&2; exit 1; }
site=$(mktemp -d /tmp/allreduce-rs-site.XXXXXX)
"$python" -m pip install --quiet --no-index --no-deps --target "$site" "${wheels[@]}"
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
"$python" -c "import sys, torch, allreduce_rs; print('python', sys.version.split()[0], 'torch', torch.__version__, 'allreduce_rs', allreduce_rs.__version__)" |
    tee -a "$out/machine.txt"
launch=("$python" -m allreduce_rs.launch -n "$ranks" --)
bench=("$python" -m allreduce_rs.bench --backend cuda)
# Warm the kernel cache with one rank, so 8 cold compiles do not race the set-up deadline.
step smoke "$here/gpu_smoke" --backend cuda
step check_cuda "${launch[@]}" "$python" "$here/gpu_python_check.py" check --backend cuda
step check_host "$python" -m allreduce_rs.launch -n 2 -- "$python" "$here/gpu_python_check.py" check --backend host
step torchrun "$python" -m torch.distributed.run --nproc-per-node "$ranks" "$here/row_parallel.py"
step dead_peer "$python" -m allreduce_rs.launch -n 4 -- "$python" "$here/gpu_dead_peer.py"
step sweep_eager "${launch[@]}" "${bench[@]}" --output "$out/sweep_eager.json"
step sweep_graph "${launch[@]}" "${bench[@]}" --graph --output "$out/sweep_graph.json"
# The per-call cost at 1024 elements: the Python path and comm-bench's auto (the communicator's public call), the same iterations.
for mode in eager graph; do
    flag=(); [ "$mode" = graph ] && flag=(--graph)
    step "cb_$mode" "$here/comm-bench" --backend cuda --num_ranks "$ranks" --counts 1024 --methods auto \
        --num_iters 200 --repeats 15 --export_csv --output_dir "$out/cb_$mode" "${flag[@]}"
    step "py_$mode" "${launch[@]}" "${bench[@]}" --counts 1024 --methods py,py_inplace,py+reg,py_op,py_torch_op --num_iters 200 \
        --num_warmup_iters 20 --repeats 15 --output "$out/py_$mode.json" "${flag[@]}"
done
step overhead "$python" "$here/gpu_python_check.py" overhead "$out"
cat "$out/overhead.txt" 2>/dev/null || true
rm -rf "$site"
exit $status
