#!/usr/bin/env bash
# Session 21: on an H200, its caller-buffer tables for the world sizes in H200_WORLDS (tuned into OUT/cache, with the
# near-tie re-timing) and 1M / 16M sweeps on them; on an H100, full comm_bench.py-size sweeps on the built-in tables
# for the world sizes in SWEEP (caller and registered, eager and graph).
#   OUT=dir PACK=1 H200_WORLDS="8" SWEEP="3 6" s21_call.sh
set -u
out=$OUT
cd dist
source ./gpu_env.sh $out
m=car_1shot,car_2shot,auto,symm_epoch_1shot,symm_zc_1shot,symm_zc_2shot,symm_zc_2shot_pull
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  export ALLREDUCE_TUNE_DIR=$out/cache
  for w in $H200_WORLDS; do
    step tune_w$w timeout 330 env RANKS=$w ./comm-bench --backend cuda --num_ranks $w --tune $out/tune_w$w.json \
      --tune_hidden 0 --tune_residency caller --num_iters 10 --num_warmup_iters 3 --repeats 3
    for mode in eager graph; do
      flag=(); [ $mode = graph ] && flag=(--graph)
      step sweep_${w}_$mode timeout 90 ./comm-bench --backend cuda --num_ranks $w --counts 1048576,16777216 \
        --methods $m --repeats 3 "${flag[@]}"
    done
  done
else
  export ALLREDUCE_TUNE_DIR=/tmp/arx-tune-none
  for w in $SWEEP; do
    for mode in eager graph; do
      flag=(); [ $mode = graph ] && flag=(--graph)
      step full_${w}_$mode timeout $((40 + 12 * w)) ./comm-bench --backend cuda --num_ranks $w --methods $m --repeats 3 "${flag[@]}"
    done
  done
fi
for f in $out/*_eager.txt $out/*_graph.txt; do
  [ -f $f ] && { echo "== $f"; grep -A30 "auto against the fastest other" $f | grep -v "^\[rank [1-9]" | cut -c1-160 | head -30; }
done
