#!/usr/bin/env bash
# Two A/Bs on caller buffers, each in one run with the copy floor (comm-bench's bound block):
#  - the pulled two-shot's copy-in fused into its kernel, leaving this rank's own shard in the caller's input
#    (symm_zc_2shot_pull_fusedcopy, main at 9263da2), against the memcpy of the whole input before the kernel
#    (symm_zc_2shot_pull): per rank 5 - 2/W input sizes of memory traffic instead of 5;
#  - dist/diag/comm-bench: main + diag-copy-unroll.patch (copy_range with 4 loads in flight per thread), the same
#    methods, run right after main's on the same sizes.
#   OUT=dir PACK=1 SECS=560 [WORLDS="8 4 3"] bash results/h200-mps/s30/ab.sh
set -u
out=$OUT
cd dist
export ALLREDUCE_TUNE_DIR=$out/cache
source ./gpu_env.sh $out
export ALLREDUCE_SETUP_TIMEOUT_S=200
# First a short tune (own cache, so the sweeps below follow the built-in tables): the first GPU run of the tune's
# check that every candidate passing at a size gives the same bits (c2637a9).
fits 90 && step samebits timeout 90 env RANKS=8 ALLREDUCE_TUNE_DIR=$out/cache-samebits ./comm-bench --backend cuda \
  --num_ranks 8 --tune $out/tune_samebits.json --counts 1024,1048576 --tune_hidden 0 --num_iters 5 --repeats 1
m=symm_zc_2shot_pull,symm_zc_2shot_pull_fusedcopy,symm_zc_2shot,symm_epoch_1shot,auto
run() {  # NAME BINARY WORLD [--graph]
  local name=$1 bin=$2 w=$3
  shift 3
  fits 90 && step $name timeout 90 env RANKS=$w $bin --backend cuda --num_ranks $w \
    --counts 1048576,4194304,16777216 --methods $m --repeats 5 --max_seconds 70 "$@"
}
for w in ${WORLDS:-8 4 3}; do
  run main_${w}_eager ./comm-bench $w
  run diag_${w}_eager ./diag/comm-bench $w
  if [ $w = 8 ]; then
    run main_${w}_graph ./comm-bench $w --graph
    run diag_${w}_graph ./diag/comm-bench $w --graph
  fi
done
for f in $out/main_*.txt $out/diag_*.txt; do
  [ -f $f ] && { echo "== $f"; grep -E "^\[rank 0\] +[0-9]+ +[0-9]+ +bf16" $f | awk '{print $4, $6, $7}' | column -t; \
    grep -A5 "against its bound" $f | grep "rank 0\] #" | cut -c1-100; }
done
exit $status
