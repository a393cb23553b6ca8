#!/usr/bin/env bash
# Session 39, calls 3 and 4 (run inline then, the same steps): the tables of every residency for the world sizes in
# PAIRS (residency:world) re-tuned under the cap on the current kernels, then the comm_bench.py sweep on them for
# the worlds in SWEEP, eager and graph (auto against the fastest of its residency, and against its bound).
#   OUT=dir PACK=1 SECS=520 PAIRS="caller:6 registered:8 ..." SWEEP="8 4" bash results/h100-mps/s39/tune.sh
# TUNES=dir: earlier calls' tune cache (the tables the sweep should follow), copied into OUT_DIR/cache first.
set -u
mkdir -p $OUT/cache
[ -n "${TUNES:-}" ] && cp -r "$TUNES"/. $OUT/cache/
cd dist
export ALLREDUCE_TUNE_DIR=$OUT/cache ALLREDUCE_SETUP_TIMEOUT_S=200
source ./gpu_env.sh $OUT
for p in ${PAIRS:-}; do
  res=${p%:*} w=${p#*:}
  fits 75 && step tune_${res}_w$w timeout 75 env RANKS=$w ./comm-bench --backend cuda --num_ranks $w \
    --tune $out/tune_${res}_w$w.json --tune_hidden 0 --tune_residency $res --num_iters 10 --num_warmup_iters 3 \
    --repeats 3 --max_seconds 60
done
m=car_1shot,car_2shot,auto,symm_epoch_1shot,symm_zc_1shot,symm_zc_2shot,symm_zc_2shot_pull
for w in ${SWEEP:-}; do
  for mode in eager graph; do
    flag=(); [ $mode = graph ] && flag=(--graph)
    fits 60 && step sweep_${w}_$mode timeout 60 env RANKS=$w ./comm-bench --backend cuda --num_ranks $w \
      --methods $m --repeats 3 --max_seconds 50 "${flag[@]}"
  done
done
exit $status
