#!/usr/bin/env bash
# Session 27, first call: the A/B of the spare-multiprocessor cap that session 26 could not settle, made adaptive.
# dist/diag/comm-bench = main + s26/diag-no-spare.patch (ARX_DIAG_NO_SPARE=1: the grids before the cap). Two runs of
# the old grids first; only if one fails does the machine tell the builds apart, and the rest alternates cap / old.
# Otherwise the time goes to re-tuning the 8-rank caller-buffer tables under the cap (into OUT/cache) and the
# 1M / 16M sweeps on them. A step starts only if its timeout ends within SECS of the start.
#   OUT=dir PACK=1 SECS=560 bash results/h100-mps/s27/call1.sh   (dist/kcache: earlier compiled kernels)
set -u
end=$(( $(date +%s) + ${SECS:-560} ))
fits() { (( $(date +%s) + $1 <= end )); }
out=$OUT
cd dist
export ARX_KERNEL_CACHE=$PWD/kcache ALLREDUCE_TUNE_DIR=$out/cache
source ./gpu_env.sh $out
export ALLREDUCE_SETUP_TIMEOUT_S=200
stress=(norm --backend cuda --num_ranks 8 --hidden 4096 --tokens 8 --repeats 1 --num_iters 3 --num_warmup_iters 1 --skew_us 3000 --methods unfused:symm_ll)
old() { step $1 timeout 55 env ALLREDUCE_TIMEOUT_S=5 ARX_DIAG_NO_SPARE=1 ./diag/comm-bench "${stress[@]}" --bursts 1000; }
cap() { step $1 timeout 55 env ALLREDUCE_TIMEOUT_S=5 ./comm-bench "${stress[@]}" --bursts 1000; }
lost() { grep -l "never arrived" $out/old_*.txt 2>/dev/null | wc -l; }
step warm timeout 60 ./comm-bench "${stress[@]}" --bursts 20
old old_1; fits 55 && old old_2
if [ "$(lost)" -gt 0 ]; then
  for rep in 1 2 3 4 5; do
    fits 55 && cap cap_$rep
    fits 55 && old old_$((rep + 2))
  done
else
  m=car_1shot,car_2shot,auto,symm_epoch_1shot,symm_zc_1shot,symm_zc_2shot,symm_zc_2shot_pull
  fits 280 && step tune_w8 timeout 280 env RANKS=8 ./comm-bench --backend cuda --num_ranks 8 --tune $out/tune_w8.json \
    --tune_hidden 0 --tune_residency caller --num_iters 10 --num_warmup_iters 3 --repeats 3
  for mode in eager graph; do
    flag=(); [ $mode = graph ] && flag=(--graph)
    fits 90 && step sweep_8_$mode timeout 90 ./comm-bench --backend cuda --num_ranks 8 --counts 1048576,16777216 \
      --methods $m --repeats 3 "${flag[@]}"
  done
fi
for f in $out/old_* $out/cap_*; do
  [ -f $f ] && echo "$(basename $f .txt): $(grep -c FAILED $f) failed; $(grep -ho 'burst [0-9]*, rank [0-9]*: peer.*before)' $f | head -1)"
done
exit $status
