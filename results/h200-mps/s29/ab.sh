#!/usr/bin/env bash
# The spare-multiprocessor cap refined, A/B on one machine: dist/diag/comm-bench is main + diag-spare-refined.patch,
# whose grids leave a multiprocessor free when all ranks but one spin ((SMs - 1) / (ranks per device - 1) blocks
# each) and, with ARX_DIAG_SPARE_OLD=1, main's cap ((SMs - 1) / ranks per device). First the lagging-rank stresses
# with the refined grids (a zero-copy two-shot of 16M elements at 4 ranks, whose grid the refinement grows from 32
# to 43 blocks; the packet designs at 8 ranks), then the 1M / 16M sweep at 3 and 4 ranks, old and new alternately.
#   OUT=dir PACK=1 SECS=570 bash results/h200-mps/s29/ab.sh
set -u
out=$OUT
cd dist
export ALLREDUCE_TUNE_DIR=$out/cache
source ./gpu_env.sh $out
export ALLREDUCE_SETUP_TIMEOUT_S=200
cb=./diag/comm-bench
stress() { # NAME RANKS TOKENS METHODS BURSTS [env...]
  local name=$1 w=$2 tokens=$3 methods=$4 bursts=$5
  shift 5
  fits 110 && step $name timeout 110 env RANKS=$w ALLREDUCE_TIMEOUT_S=5 "$@" $cb norm --backend cuda --num_ranks $w \
    --hidden 4096 --tokens $tokens --repeats 1 --num_iters 3 --num_warmup_iters 1 --skew_us 3000 \
    --methods $methods --bursts $bursts
}
stress lag_zc_w4_new 4 4096 unfused:symm_zc_2shot,unfused:car_2shot 150
stress lag_ll_w8_new 8 8 unfused:symm_ll,fused_ll 400
for round in 1 2; do
  for w in 4 3; do
    for v in old new; do
      e=(); [ $v = old ] && e=(ARX_DIAG_SPARE_OLD=1)
      fits 60 && step sweep_w${w}_${v}_$round timeout 60 env RANKS=$w "${e[@]}" $cb --backend cuda --num_ranks $w \
        --counts 1048576,16777216 --methods auto,symm_zc_2shot,symm_zc_2shot_pull,car_2shot --repeats 3
    done
  done
done
stress lag_zc_w4_new2 4 4096 unfused:symm_zc_2shot,unfused:car_2shot 150
for f in $out/sweep_*.txt; do
  [ -f $f ] && { echo "== $f"; grep "capped\|Summary" -A8 $f | grep "rank 0\] #" | grep -v "^--" | cut -c1-150; }
done
grep -h "passed\|failed\|bursts" $out/lag_*.txt | head -20
exit $status
