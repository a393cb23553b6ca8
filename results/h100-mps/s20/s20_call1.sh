#!/usr/bin/env bash
# Session 20, call 1: symm_zc_2shot_pull on CUDA: memcheck at 2 ranks, the communicator's tests at 3 ranks (every
# algorithm's bits, graph capture on caller buffers, registered caller buffers), then 1M / 16M at 2, 4 and 8 ranks,
# eager and graph, against the other two-shots on caller buffers.
set -u
out=$OUT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export ARX_KERNEL_CACHE=/tmp/arx-kernel-cache ALLREDUCE_TUNE_DIR=/tmp/arx-tune-none
cd dist
./gpu_smoke --backend cuda > $out/smoke.txt 2>&1; echo "smoke rc $?"
for dt in bf16 fp32; do
  timeout 100 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 99 ./comm-bench \
    --backend cuda --num_ranks 2 --dtype $dt --counts 4099,1048577 --methods symm_zc_2shot_pull --num_iters 2 \
    --num_warmup_iters 1 --repeats 1 --timeout_s 60 >> $out/memcheck.txt 2>&1; echo "memcheck $dt rc $?" | tee -a $out/memcheck.txt
done
grep -h "ERROR SUMMARY" $out/memcheck.txt
source ./gpu_env.sh $out
step communicator_tests timeout 150 env ARX_TEST_BACKEND=cuda ARX_TEST_RANKS=3 ./communicator_tests --test-threads 1 \
  every_algorithm_gives_the_same_bits_on_both_sides_of_every_handover graph_capture_registers_the_callers_buffers \
  registered_caller_buffers_are_read_in_place
for w in 2 4 8; do
  for mode in eager graph; do
    flag=(); [ $mode = graph ] && flag=(--graph)
    step sweep_${w}_$mode timeout 90 ./comm-bench --backend cuda --num_ranks $w --counts 1048576,16777216 \
      --methods car_2shot,auto,symm_zc_1shot,symm_zc_2shot,symm_zc_2shot_push,symm_zc_2shot_pull --repeats 3 "${flag[@]}"
  done
done
for f in $out/sweep_*.txt; do echo "== $f"; grep -A3 "# Summary" $f | cut -c1-250; done
