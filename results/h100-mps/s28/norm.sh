#!/usr/bin/env bash
# Issue 28's grid on norm tables re-tuned under the spare-multiprocessor cap: the norm tune at 8 ranks (hidden 4096,
# every residency), then fused against unfused at hidden 4096 and 8192, eager and graph, on those tables.
#   OUT=dir PACK=1 SECS=570 [TUNE_S=300] [TUNE_MAX_S=S] bash results/h100-mps/s28/norm.sh
# TUNE_MAX_S (from main at a79262f): the tune starts no table after S seconds and keeps those it finished.
set -u
out=$OUT
cd dist
export ALLREDUCE_TUNE_DIR=$out/cache
source ./gpu_env.sh $out
export ALLREDUCE_SETUP_TIMEOUT_S=200
fits ${TUNE_S:-300} && step tune_norm_w8 timeout ${TUNE_S:-300} env RANKS=8 ./comm-bench --backend cuda --num_ranks 8 \
  --tune $out/tune_norm_w8.json --tune_hidden 4096 --tune_norm_only --num_iters 10 --num_warmup_iters 3 --repeats 3 \
  ${TUNE_MAX_S:+--max_seconds $TUNE_MAX_S}
for h in 4096 8192; do
  for mode in eager graph; do
    flag=(); [ $mode = graph ] && flag=(--graph)
    fits 62 && step norm_${h}_$mode timeout 62 ./comm-bench norm --backend cuda --num_ranks 8 --hidden $h -n 50 \
      --repeats 5 --methods fused_ll,fused_1shot,fused_epoch_1shot,unfused,auto --max_seconds 45 "${flag[@]}"
  done
done
grep -h "auto\b.*x$\|# auto" $out/norm_*.txt | cut -c1-120
exit $status
