#!/usr/bin/env bash
# Session 25: grids capped at half a shared device's resident blocks (Team::device_shares): the skewed
# consecutive-call check on the packet designs, then what the smaller grids cost against dist/diag/comm-bench (the
# exact-fit caps of before): comm-bench at 1M and 16M elements and the fused norm at hidden 4096, eager.
#   OUT=dir PACK=1 bash results/h100-mps/s25/s25_half.sh
set -u
out=$OUT
cd dist
source ./gpu_env.sh $out
norm=(norm --backend cuda --num_ranks 8 --hidden 4096 --tokens 8 --repeats 1 --num_iters 3 --num_warmup_iters 1)
step warm timeout 200 env ALLREDUCE_TIMEOUT_S=300 ./comm-bench "${norm[@]}" --methods unfused:symm_ll,fused_ll
for rep in 1 2; do
  for m in unfused:symm_ll fused_ll; do
    step skew_${m/:/-}_$rep timeout 150 ./comm-bench "${norm[@]}" --methods $m --bursts 1500 --skew_us 3000
  done
done
sweep=(--backend cuda --num_ranks 8 --counts 1048576,16777216 --methods auto,car_2shot,symm_zc_2shot,symm_zc_2shot_pull --repeats 5)
step sweep_half timeout 100 ./comm-bench "${sweep[@]}"
step sweep_exact timeout 100 ./diag/comm-bench "${sweep[@]}"
normgrid=(norm --backend cuda --num_ranks 8 --hidden 4096 --repeats 5 --methods fused_ll,unfused,auto)
step norm_half timeout 100 ./comm-bench "${normgrid[@]}"
step norm_exact timeout 100 ./diag/comm-bench "${normgrid[@]}"
exit $status
