#!/usr/bin/env bash
# After the A/B (ab/): main with in-kernel copies of four loads in flight per thread and the pulled two-shot's
# copy-in fused (the engine's, `CopyIn::Cheapest`). The 8-rank caller tables re-tuned on those kernels (the tune
# keeps what it finished within 150 s), then the sweep on them, eager, with the memcpy variant beside it.
#   OUT=dir PACK=1 SECS=360 bash results/h100-mps/s30/retune.sh
set -u
out=$OUT
cd dist
export ALLREDUCE_TUNE_DIR=$out/cache
source ./gpu_env.sh $out
machine | tee $out/machine.txt
export ALLREDUCE_SETUP_TIMEOUT_S=200
fits 200 && step tune_caller_w8 timeout 200 env RANKS=8 ./comm-bench --backend cuda --num_ranks 8 \
  --tune $out/tune_caller_w8.json --tune_hidden 0 --tune_residency caller --num_iters 10 --num_warmup_iters 3 \
  --repeats 3 --max_seconds 150
m=car_1shot,car_2shot,auto,symm_epoch_1shot,symm_zc_1shot,symm_zc_2shot,symm_zc_2shot_pull,symm_zc_2shot_pull_memcpy
for mode in eager graph; do
  flag=(); [ $mode = graph ] && flag=(--graph)
  fits 100 && step sweep_8_$mode timeout 100 env RANKS=8 ./comm-bench --backend cuda --num_ranks 8 \
    --counts 1024,65536,1048576,4194304,16777216 --methods $m --repeats 3 --max_seconds 80 "${flag[@]}"
done
for f in $out/sweep_*.txt; do
  [ -f $f ] && { echo "== $f"; grep -A7 "fastest other\|against its bound" $f | grep "rank 0\] #" | cut -c1-110; }
done
exit $status
