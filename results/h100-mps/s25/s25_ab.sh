#!/usr/bin/env bash
# Session 25: unfused:symm_ll (whose allreduce grid, 32 blocks, is the same under both caps) under the skewed
# consecutive-call check, alternating dist/diag/comm-bench (exact-fit caps) and dist/comm-bench (half), one call.
#   OUT=dir PACK=1 bash results/h100-mps/s25/s25_ab.sh
set -u
out=$OUT
cd dist
source ./gpu_env.sh $out
norm=(norm --backend cuda --num_ranks 8 --hidden 4096 --tokens 8 --repeats 1 --num_iters 3 --num_warmup_iters 1)
step warm timeout 200 env ALLREDUCE_TIMEOUT_S=300 ./comm-bench "${norm[@]}" --methods unfused:symm_ll
for pass in 1 2 3; do
  for b in exact:./diag/comm-bench half:./comm-bench; do
    [ $pass = 3 ] && [ ${b%%:*} = half ] && continue
    step ${b%%:*}_$pass timeout 80 ${b#*:} "${norm[@]}" --methods unfused:symm_ll --bursts 1200 --skew_us 3000
  done
done
exit $status
