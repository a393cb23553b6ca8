#!/usr/bin/env bash
# Session 25: are the packet designs' lost calls under --skew_us an occupancy deadlock (every rank's blocks not
# resident at once)? dist/diag/comm-bench divides every resident-block cap by ARX_DIAG_CAP_DIV and prints the caps.
#   OUT=dir PACK=1 bash results/h100-mps/s25/s25_caps.sh
set -u
out=$OUT
cd dist
source ./gpu_env.sh $out
norm=(norm --backend cuda --num_ranks 8 --hidden 4096 --tokens 8 --repeats 1 --num_iters 3 --num_warmup_iters 1)
step caps timeout 200 env ALLREDUCE_TIMEOUT_S=300 ARX_DIAG_CAP_DIV=1 ./diag/comm-bench "${norm[@]}" --methods unfused:symm_ll,fused_ll
for rep in $(seq ${REPS:-2}); do
  for m in unfused:symm_ll fused_ll; do
    step half_${m/:/-}_$rep timeout 150 env ARX_DIAG_CAP_DIV=2 ./diag/comm-bench "${norm[@]}" --methods $m \
      --bursts ${BURSTS:-1500} --skew_us ${SKEW:-3000}
  done
done
exit $status
