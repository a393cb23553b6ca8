#!/usr/bin/env bash
# Session 29's device call. An H200 (none lent since session 18) re-tunes its caller tables at 8 ranks under the cap
# (s27/next.sh); an H100 measures what session 28 left: caller-registered tables for 2 and 3 ranks, the 11K-61K
# registered range on the 8-rank tables, and the first GPU look at comm-bench's copy floor (auto on caller buffers
# against auto+reg plus every rank's copy).
#   OUT=dir PACK=1 SECS=570 bash results/h200-mps/s29/call.sh
set -u
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  RES=caller WORLDS=8 exec bash results/h100-mps/s27/next.sh
fi
out=$OUT
cd dist
export ALLREDUCE_TUNE_DIR=$out/cache
source ./gpu_env.sh $out
export ALLREDUCE_SETUP_TIMEOUT_S=200
for w in 2 3; do
  fits 150 && step tune_caller_registered_w$w timeout 150 env RANKS=$w ./comm-bench --backend cuda --num_ranks $w \
    --tune $out/tune_caller_registered_w$w.json --tune_hidden 0 --tune_residency caller_registered --num_iters 10 \
    --num_warmup_iters 3 --repeats 3
done
for mode in eager graph; do
  flag=(); [ $mode = graph ] && flag=(--graph)
  fits 90 && step range_$mode timeout 90 ./comm-bench --backend cuda --num_ranks 8 \
    --methods auto,symm_ll,symm_epoch_1shot,car_1shot --counts 11008,22016,36608,60928 --repeats 5 "${flag[@]}"
done
fits 130 && step floor_eager timeout 130 ./comm-bench --backend cuda --num_ranks 8 \
  --methods auto,car_1shot,car_2shot,symm_zc_2shot --counts 65536,1048576,4194304,16777216 --repeats 3 \
  --max_seconds 100
for f in $out/range_*.txt $out/floor_*.txt; do
  [ -f $f ] && { echo "== $f"; grep -A12 "fastest other\|against its bound" $f | grep "rank 0\] #" | cut -c1-120; }
done
exit $status
