#!/usr/bin/env bash
# Session 27, second call: the caller-buffer tables for the world sizes in WORLDS re-tuned under the
# spare-multiprocessor cap (into OUT/cache, which auto then follows), and the 1M / 16M sweeps on them, eager and graph.
#   OUT=dir PACK=1 SECS=560 WORLDS="8" [TUNE_S=280] bash results/h100-mps/s27/call2.sh   (dist/kcache: earlier compiled kernels)
set -u
end=$(( $(date +%s) + ${SECS:-560} ))
fits() { (( $(date +%s) + $1 <= end )); }
out=$OUT
cd dist
export ARX_KERNEL_CACHE=$PWD/kcache ALLREDUCE_TUNE_DIR=$out/cache
source ./gpu_env.sh $out
export ALLREDUCE_SETUP_TIMEOUT_S=200
tune_s=${TUNE_S:-280}
m=car_1shot,car_2shot,auto,symm_epoch_1shot,symm_zc_1shot,symm_zc_2shot,symm_zc_2shot_pull
for w in $WORLDS; do
  fits $tune_s && step tune_w$w timeout $tune_s env RANKS=$w ./comm-bench --backend cuda --num_ranks $w --tune $out/tune_w$w.json \
    --tune_hidden 0 --tune_residency caller --num_iters 10 --num_warmup_iters 3 --repeats 3
  for mode in eager graph; do
    flag=(); [ $mode = graph ] && flag=(--graph)
    fits 90 && step sweep_${w}_$mode timeout 90 env RANKS=$w ./comm-bench --backend cuda --num_ranks $w \
      --counts 1048576,16777216 --methods $m --repeats 3 "${flag[@]}"
  done
done
for f in $out/sweep_*.txt; do
  [ -f $f ] && { echo "== $f"; grep -A12 "auto against the fastest other" $f | grep -v "^\[rank [1-9]" | cut -c1-160; }
done
exit $status
