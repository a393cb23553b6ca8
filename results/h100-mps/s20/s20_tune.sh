#!/usr/bin/env bash
# Session 20: caller-buffer tables (with symm_zc_2shot_pull and the larger grid past 2 MiB) for the world sizes
# given, into OUT/cache (the tune cache), then 1M / 16M sweeps on them, eager and graph.
#   OUT=dir WORLDS="2 3" SWEEP="2" s20_tune.sh
set -u
out=$OUT
cd dist
source ./gpu_env.sh $out
export ALLREDUCE_TUNE_DIR=$out/cache
for w in $WORLDS; do
  step tune_w$w timeout 280 env RANKS=$w ./comm-bench --backend cuda --num_ranks $w --tune $out/tune_w$w.json \
    --tune_hidden 0 --tune_residency caller --num_iters 10 --num_warmup_iters 3 --repeats 3
done
m=car_1shot,car_2shot,auto,symm_epoch_1shot,symm_zc_1shot,symm_zc_2shot,symm_zc_2shot_pull
for w in $SWEEP; do
  for mode in eager graph; do
    flag=(); [ $mode = graph ] && flag=(--graph)
    step sweep_${w}_$mode timeout 90 ./comm-bench --backend cuda --num_ranks $w --counts 1048576,16777216 \
      --methods $m --repeats 3 "${flag[@]}"
    grep -A3 "auto against the fastest other caller" $out/sweep_${w}_$mode.txt | tail -2 | cut -c1-120
  done
done
