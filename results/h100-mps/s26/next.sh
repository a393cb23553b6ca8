#!/usr/bin/env bash
# For the next session (not yet run): the A/B that call 2 could not settle, five runs of each build alternating on one
# machine. dist/diag/comm-bench = main + diag-no-spare.patch (ARX_DIAG_NO_SPARE=1: the grids before the cap). A step
# starts only if its timeout ends within SECS of the start.
#   OUT=dir PACK=1 SECS=560 bash results/h100-mps/s26/next.sh
set -u
end=$(( $(date +%s) + ${SECS:-560} ))
fits() { (( $(date +%s) + $1 <= end )); }
out=$OUT
cd dist
source ./gpu_env.sh $out
export ALLREDUCE_SETUP_TIMEOUT_S=200 ALLREDUCE_TIMEOUT_S=5
stress=(norm --backend cuda --num_ranks 8 --hidden 4096 --tokens 8 --repeats 1 --num_iters 3 --num_warmup_iters 1 --skew_us 3000)
step warm timeout 120 ./comm-bench "${stress[@]}" --methods unfused:symm_ll,fused_ll
for rep in 1 2 3 4 5; do
  fits 50 && step base_$rep timeout 50 env ARX_DIAG_NO_SPARE=1 ./diag/comm-bench "${stress[@]}" --methods unfused:symm_ll --bursts 1200
  fits 50 && step fix_$rep timeout 50 ./comm-bench "${stress[@]}" --methods unfused:symm_ll --bursts 1200
done
for f in $out/base_* $out/fix_*; do
  echo "$(basename $f .txt): $(grep -c FAILED $f) failed; $(grep -ho 'burst [0-9]*, rank [0-9]*: peer.*before)' $f | head -1)"
done
exit $status
