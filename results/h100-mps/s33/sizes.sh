#!/usr/bin/env bash
# For the next session (not yet run): `auto` against every method at every comm_bench.py size on the built-in tables,
# for the world sizes in WORLDS, eager and graph, under MPS (gpu_env.sh starts it: without it the ranks take turns on
# the GPU and every call takes milliseconds). Each sweep starts no size after 250 s and keeps those it finished.
#   OUT=dir PACK=1 SECS=570 WORLDS="8" bash results/h100-mps/s33/sizes.sh
set -u
out=$OUT
cd dist
source ./gpu_env.sh $out
machine | tee $out/machine.txt
export ALLREDUCE_SETUP_TIMEOUT_S=200
m=car_1shot,car_2shot,auto,symm_epoch_1shot,symm_zc_1shot,symm_zc_2shot,symm_zc_2shot_pull
for w in $WORLDS; do
  for mode in eager graph; do
    flag=(); [ $mode = graph ] && flag=(--graph)
    fits 270 && step sizes_${w}_$mode timeout 270 env RANKS=$w ./comm-bench --backend cuda --num_ranks $w \
      --methods $m --repeats 3 --max_seconds 250 "${flag[@]}"
  done
done
for f in $out/sizes_*.txt; do
  [ -f $f ] && { echo "== $f"; grep -A24 "fastest other caller" $f | grep "rank 0\] #  *[0-9]" | cut -c1-100; }
done
exit $status
