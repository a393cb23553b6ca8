#!/usr/bin/env bash
# Session 35: upstream FBGEMM car (built on the node from .fbgemm, timed by scripts/peer_bench.py as comm_bench.py
# times it) against our car_1shot / car_2shot and auto, W ranks (default 4), caller buffers, eager then graph, one call.
#   OUT=dir PACK=1 SECS=560 [W=8] [REPEATS=3] [MODES=graph] bash results/h100-mps/s35/car.sh (carry [".fbgemm", "dist"])
set -u
root=$PWD
w=${W:-4} r=${REPEATS:-3}
export RANKS=$w ALLREDUCE_SETUP_TIMEOUT_S=200
cd dist
source ./gpu_env.sh $OUT
cd "$root"
# Upstream car's graph last: its waits have no deadline, so a replay that hung would hold the node to the step's end.
for mode in ${MODES:-eager graph}; do
  flag=(); [ $mode = graph ] && flag=(--graph)
  fits 90 && step ours_$mode timeout 90 dist/comm-bench --backend cuda --num_ranks $w \
    --methods car_1shot,car_2shot,auto --repeats $r --export_csv --output_dir $out/ours_$mode "${flag[@]}"
  fits 200 && step peer_$mode timeout 200 python3 scripts/peer_bench.py --num_ranks $w --fbgemm_src .fbgemm \
    --methods fbgemm_car_1shot,fbgemm_car_2shot --repeats $r --timeout_s 180 --output_dir $out/peer_$mode "${flag[@]}"
done
exit $status
