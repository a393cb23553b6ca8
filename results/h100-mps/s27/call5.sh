#!/usr/bin/env bash
# Session 27, fifth call: full comm_bench.py-size sweeps at the world sizes in SWEEP on the tables re-tuned in calls 2-4
# (dist/tune-s27 = their caches), caller and registered, eager and graph.
#   OUT=dir PACK=1 SECS=300 SWEEP="8" bash results/h100-mps/s27/call5.sh
set -u
end=$(( $(date +%s) + ${SECS:-560} ))
fits() { (( $(date +%s) + $1 <= end )); }
out=$OUT
cd dist
export ARX_KERNEL_CACHE=$PWD/kcache ALLREDUCE_TUNE_DIR=$PWD/tune-s27
source ./gpu_env.sh $out
export ALLREDUCE_SETUP_TIMEOUT_S=200
m=car_1shot,car_2shot,auto,symm_epoch_1shot,symm_zc_1shot,symm_zc_2shot,symm_zc_2shot_pull
for w in $SWEEP; do
  for mode in eager graph; do
    flag=(); [ $mode = graph ] && flag=(--graph)
    t=$((40 + 12 * w))
    fits $t && step full_${w}_$mode timeout $t env RANKS=$w ./comm-bench --backend cuda --num_ranks $w --methods $m --repeats 3 "${flag[@]}"
  done
done
for f in $out/full_*.txt; do
  [ -f $f ] && { echo "== $f"; grep -B2 "sizes above 1.05x" $f | grep -v "^\[rank [1-9]" | cut -c1-160; }
done
exit $status
