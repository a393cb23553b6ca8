#!/usr/bin/env bash
# The library on a GPU node, from the binaries `cargo xtask bundle` put into dist/ (nothing is built here):
#   gpu_library.sh OUT_DIR
# gpu_smoke and cuda_foreign (streams and memory the caller owns), the communicator's tests on the GPU driver
# (every algorithm the same bits on both sides of every hand-over; ranks that run different kernels on one call
# named), the row calls' tests, a rank dead on another emulated node (the NCCL
# watchdog), the cudarc example (its own stream, eager and inside its own graph, every comm_bench.py size checked, and
# norm calls), and the communicator's public call (`auto`) at 1024
# elements, eager and graph. With fewer GPUs than ranks the ranks run under MPS.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: gpu_library.sh OUT_DIR}
mkdir -p "$out"
export ALLREDUCE_TUNE_DIR=$out/tune-cache
source "$here/gpu_env.sh" "$out"
# Warm the kernel cache with one rank, so 8 cold compiles do not race the set-up deadline.
step smoke "$here/gpu_smoke" --backend cuda
step foreign "$here/cuda_foreign"
step communicator_tests env ARX_TEST_BACKEND=cuda ARX_TEST_RANKS="$ranks" "$here/communicator_tests" --test-threads 1 \
    every_algorithm_gives_the_same_bits_on_both_sides_of_every_handover bad_calls_get_typed_errors_before_any_work \
    registered_caller_buffers_are_read_in_place packets_stay_exact_across_the_flag_wrap
# Ranks that run different kernels on one call: named, not passed.
step disagreeing_ranks_tests env ARX_TEST_BACKEND=cuda ARX_TEST_RANKS="$ranks" "$here/disagreeing_ranks_tests" \
    --test-threads 1 ranks_that_run_different_algorithms_on_one_call_fail_naming_each_other
# The row calls: the residual add and RMSNorm on every design, fused and unfused, and the last-dimension split.
step rows_tests env ARX_TEST_BACKEND=cuda ARX_TEST_RANKS="$ranks" "$here/rows_tests" --test-threads 1 \
    every_algorithm_carries_the_residual_add_and_rms_norm_with_the_same_bits \
    reduce_scatter_along_the_last_dimension_gives_each_rank_its_columns
# A dead, a stopped and an aborted peer: the survivors' calls fail, named, and their contexts live on.
step dead_peer_tests env ARX_TEST_BACKEND=cuda "$here/dead_peer_tests" --test-threads 1
# A rank dead on another (emulated) node: the survivors' NCCL step ends at the watchdog, their devices live on.
step across_dead_peer env ARX_TEST_BACKEND=cuda ARX_TEST_RANKS="$ranks" ARX_TEST_NODES=2 "$here/across_tests" \
    --test-threads 1 a_peer_that_dies_on_another_node_ends_the_survivors_nccl_steps_and_the_device_lives_on
step cuda_example "$here/comm-bench" launch -n "$ranks" -- "$here/cuda_graph_allreduce"
for mode in eager graph; do
    flag=(); [ "$mode" = graph ] && flag=(--graph)
    step "overhead_$mode" "$here/comm-bench" --backend cuda --num_ranks "$ranks" --counts 1024 \
        --methods auto --num_iters 200 --repeats 15 --export_csv --output_dir "$out/overhead_$mode" \
        "${flag[@]}"
done
exit $status
