#!/usr/bin/env bash
# The landed kernels through the communicator (main at 24fccec): auto on caller buffers, 8 ranks, eager, on the
# built-in tables, beside the pulled two-shot and its memcpy variant, checked as every sweep is.
#   OUT=dir PACK=1 SECS=150 bash results/h100-mps/s30/confirm.sh
set -u
out=$OUT
cd dist
export ALLREDUCE_TUNE_DIR=$out/cache
source ./gpu_env.sh $out
machine | tee $out/machine.txt
export ALLREDUCE_SETUP_TIMEOUT_S=100
fits 120 && step confirm_8_eager timeout 120 env RANKS=8 ./comm-bench --backend cuda --num_ranks 8 \
  --counts 1048576,4194304,16777216 --methods auto,symm_epoch_1shot,symm_zc_2shot_pull,symm_zc_2shot_pull_memcpy \
  --repeats 3 --max_seconds 90
grep -A6 "fastest other\|against its bound" $out/confirm_8_eager.txt | grep "rank 0\] #" | cut -c1-110
exit $status
