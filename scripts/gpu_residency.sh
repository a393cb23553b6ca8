#!/usr/bin/env bash
# The caller-buffer runs on a GPU node, from what `cargo xtask bundle` put into dist/ (nothing is built here):
#   gpu_residency.sh OUT_DIR tune|sweep|python [comm-bench args...]
# tune:   the communicator's tests on the GPU driver (each residency's table, graph capture on the caller's buffers
#         registered when it ends, every algorithm's bits on caller, registered and caller-registered buffers), the cudarc example (its own graph on its own buffers),
#         and `comm-bench --tune`: every candidate, eager and graph, on caller, registered and caller-registered
#         buffers (OUT_DIR/tune.json, the set the built-in CUDA tables come from).
# sweep:  comm-bench eager and graph on caller buffers and registered ones (the `+reg` rows): auto against car,
#         torch's two-shot and the tuned designs; the summary flags every size where auto is >5% off the fastest.
# norm:   the rows tests (every design's fused norm, same bits), the norm tables alone (`comm-bench --tune --tune_norm_only`, OUT_DIR/tune-norm.json), then `comm-bench norm`
#         at hidden 4096 and 8192, eager and graph, on those tables: auto against fused and unfused.
# python: the Python package on torch tensors: graph_capture() checked, and the graph sweep with py_capture (caller
#         tensors registered at capture) beside py and py+reg.
# With fewer GPUs than ranks the ranks run under MPS.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: gpu_residency.sh OUT_DIR tune|sweep|norm|python [comm-bench args...]}
what=${2:?usage: gpu_residency.sh OUT_DIR tune|sweep|norm|python [comm-bench args...]}
shift 2
mkdir -p "$out"
out=$(cd "$out" && pwd)
export ALLREDUCE_TUNE_DIR=$out/tune-cache PYTHONUNBUFFERED=1
source "$here/gpu_env.sh" "$out"
bench=("$here/comm-bench" --backend cuda --num_ranks "$ranks")
methods=car_1shot,car_2shot,symm_2shot,auto,symm_ll,symm_epoch_1shot,symm_zc_1shot,symm_zc_2shot_ll,symm_zc_2shot,symm_zc_2shot_push
# Warm the kernel cache with one rank, so 8 cold compiles do not race the set-up deadline.
step smoke "$here/gpu_smoke" --backend cuda
case $what in
tune)
    step communicator_tests env ARX_TEST_BACKEND=cuda ARX_TEST_RANKS="$ranks" "$here/communicator_tests" \
        --test-threads 1 each_residency_follows_its_own_table graph_capture_registers_the_callers_buffers \
        registered_caller_buffers_are_read_in_place \
        every_algorithm_gives_the_same_bits_on_both_sides_of_every_handover
    step disagreeing_ranks_tests env ARX_TEST_BACKEND=cuda ARX_TEST_RANKS="$ranks" "$here/disagreeing_ranks_tests" \
        --test-threads 1 ranks_that_captured_different_calls_are_refused_on_every_rank
    step cuda_example "$here/comm-bench" launch -n "$ranks" -- "$here/cuda_graph_allreduce"
    step tune "${bench[@]}" --tune "$out/tune.json" "$@"
    ;;
sweep)
    for mode in eager graph; do
        flag=(); [ "$mode" = graph ] && flag=(--graph)
        step "sweep_$mode" "${bench[@]}" --methods "$methods" --export_csv --output_dir "$out/$mode" "${flag[@]}" "$@"
        # Every method's row too, not only the summary: a node may send back fewer files than it wrote.
        grep '^\[rank 0\] ' "$out/sweep_$mode.txt" | grep -v '^\[rank 0\] #' || true
    done
    ;;
norm)
    step rows_tests env ARX_TEST_BACKEND=cuda ARX_TEST_RANKS="$ranks" "$here/rows_tests" --test-threads 1
    step tune_norm "${bench[@]}" --tune "$out/tune-norm.json" --tune_norm_only "$@"
    for hidden in 4096 8192; do
        for mode in eager graph; do
            flag=(); [ "$mode" = graph ] && flag=(--graph)
            step "norm_${hidden}_$mode" "$here/comm-bench" norm --backend cuda --num_ranks "$ranks" --hidden "$hidden" \
                -n 50 --repeats 5 "${flag[@]}"
        done
    done
    ;;
python)
    python=${PYTHON:-python3}
    site=$(mktemp -d /tmp/allreduce-rs-site.XXXXXX)
    "$python" -m pip install --quiet --no-index --no-deps --target "$site" "$here"/allreduce_rs-*.whl
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
    launch=("$python" -m allreduce_rs.launch -n "$ranks" --)
    step check_capture "${launch[@]}" "$python" "$here/gpu_python_check.py" check --backend cuda \
        --only graph,graph_capture
    step py_graph "${launch[@]}" "$python" -m allreduce_rs.bench --backend cuda --graph \
        --methods py,py+reg,py_capture --output "$out/py_graph.json" "$@"
    ;;
*)
    echo "unknown step $what: tune, sweep, norm or python" >&2
    exit 2
    ;;
esac
exit $status
