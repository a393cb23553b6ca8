#!/usr/bin/env bash
# The pulled two-shot's copy-in fused into its kernel, leaving this rank's own shard in the caller's input (main +
# the change of this session), against the memcpy of the whole input before the kernel, on caller buffers: the
# traffic of a caller-buffer call falls from 5 to 5 - 2/W input sizes per rank. Also the pushed two-shot's fused
# variant and auto, with the copy floor (comm-bench's bound block), in the same run.
#   OUT=dir PACK=1 SECS=570 [WORLDS="8 4 3 2"] bash results/h200-mps/s30/ab.sh
set -u
out=$OUT
cd dist
export ALLREDUCE_TUNE_DIR=$out/cache
source ./gpu_env.sh $out
machine | tee $out/machine.txt
export ALLREDUCE_SETUP_TIMEOUT_S=200
m=symm_zc_2shot_pull,symm_zc_2shot_pull_fusedcopy,symm_zc_2shot,symm_zc_2shot_fusedcopy,auto
for w in ${WORLDS:-8 4 3 2}; do
  for mode in eager graph; do
    flag=(); [ $mode = graph ] && flag=(--graph)
    fits 100 && step ab_${w}_$mode timeout 100 env RANKS=$w ./comm-bench --backend cuda --num_ranks $w \
      --counts 1048576,2097152,4194304,8388608,16777216 --methods $m --repeats 5 --max_seconds 80 "${flag[@]}"
  done
done
for f in $out/ab_*.txt; do
  [ -f $f ] && { echo "== $f"; grep -E "^\[rank 0\] +[0-9]+ +[0-9]+ +bf16" $f | awk '{print $3, $5, $6}' | column -t; \
    grep -A7 "against its bound" $f | grep "rank 0\] #" | cut -c1-100; }
done
exit $status
