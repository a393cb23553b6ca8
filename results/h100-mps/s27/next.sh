#!/usr/bin/env bash
# One residency's tables re-tuned under the spare-multiprocessor cap for the world
# sizes in WORLDS (RES: caller, registered or caller_registered; norm: the norm calls' tables at hidden 4096, all
# residencies), then the 1M / 16M sweep on them, eager and graph. The H100 has caller tables only (3-8 ranks re-tuned
# in this session); the H200's of every residency predate the cap. Uses gpu_env.sh's fits (main after 3a54d2a).
# Run with RES=caller for 2 to 8 ranks on the H100 in session 33 (results/h100-mps/s33).
#   OUT=dir PACK=1 SECS=570 RES=registered WORLDS="8" [TUNE_S=330] bash results/h100-mps/s27/next.sh
# TUNE_MAX_S (from main at a79262f): the tune starts no table after that many seconds and keeps those it finished.
set -u
out=$OUT
cd dist
export ALLREDUCE_TUNE_DIR=$out/cache
source ./gpu_env.sh $out
export ALLREDUCE_SETUP_TIMEOUT_S=200
tune=(--tune_hidden 0 --tune_residency $RES)
[ "$RES" = norm ] && tune=(--tune_hidden 4096 --tune_norm_only)
m=car_1shot,car_2shot,auto,symm_epoch_1shot,symm_zc_1shot,symm_zc_2shot,symm_zc_2shot_pull
for w in $WORLDS; do
  fits ${TUNE_S:-330} && step tune_${RES}_w$w timeout ${TUNE_S:-330} env RANKS=$w ./comm-bench --backend cuda \
    --num_ranks $w --tune $out/tune_${RES}_w$w.json "${tune[@]}" --num_iters 10 --num_warmup_iters 3 --repeats 3 \
    ${TUNE_MAX_S:+--max_seconds $TUNE_MAX_S}
  for mode in eager graph; do
    flag=(); [ $mode = graph ] && flag=(--graph)
    fits 120 && step sweep_${w}_$mode timeout 120 env RANKS=$w ./comm-bench --backend cuda --num_ranks $w \
      --counts 1024,65536,1048576,16777216 --methods $m --repeats 3 --max_seconds 90 "${flag[@]}"
  done
done
# The lagging-rank stress gpu_verify.sh now runs (there with 1,000 bursts).
fits 100 && step lagging timeout 100 env ALLREDUCE_TIMEOUT_S=5 ./comm-bench norm --backend cuda --num_ranks 8 \
  --hidden 4096 --tokens 8 --repeats 1 --num_iters 3 --num_warmup_iters 1 --skew_us 3000 \
  --methods unfused:symm_ll,fused_ll --bursts 600
for f in $out/sweep_*.txt; do
  [ -f $f ] && { echo "== $f"; grep -A4 "fastest other" $f | grep "rank 0\] #  *[0-9]" | cut -c1-120; }
done
exit $status
