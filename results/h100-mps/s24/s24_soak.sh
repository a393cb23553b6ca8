#!/usr/bin/env bash
# Session 24: the packet designs' consecutive-call fault (session 23), with many bursts per run so that a run shows
# whether a wrong burst is a one-off or every later burst is wrong too (an epoch counter out of step), and which
# calls of a burst go wrong. For each build in BUILDS (comm-bench binaries; main's, and R: packets pushed with
# st.release.sys and polled with ld.acquire.sys), each method alone, BURSTS bursts of 6 consecutive checked calls of
# 8 x 4096 bf16 at NRANKS (8) ranks, REPS times; then a plain comm-bench loop on symm_ll alone (no norm) for PLAIN_SECS.
# Run from dist/: `cd dist && OUT=out BUILDS="./comm-bench ./R/comm-bench" bash ../results/h100-mps/s24/s24_soak.sh`
# (R/ a build with results/h100-mps/s24/first-call/R.patch applied); a failed run restarts MPS (gpu_env.sh).
source ./gpu_env.sh $OUT >/dev/null
methods=${METHODS:-unfused:symm_ll fused_ll unfused:car_1shot unfused:symm_epoch_1shot}
for b in ${BUILDS:-./comm-bench}; do
  tag=$(basename $(dirname $b)); [ "$tag" = . ] && tag=main
  for m in $methods; do for rep in $(seq ${REPS:-1}); do
    t0=$SECONDS; log=$OUT/${tag}_${m/:/-}_r${NRANKS:-8}_$rep.txt
    timeout ${PER:-100} $b norm --backend cuda --num_ranks ${NRANKS:-8} --hidden 4096 --tokens ${TOKENS:-8} --methods $m \
      --repeats 1 --num_iters 3 --num_warmup_iters 1 --bursts ${BURSTS:-1000} > $log 2>&1
    rc=$?
    echo "$tag $m ${NRANKS:-8} ranks: rc $rc in $((SECONDS - t0)) s: $(grep -m1 -o 'error: .*' $log | cut -c1-600)"
    [ $rc = 0 ] || restart_mps
  done; done
done
end=$((SECONDS + ${PLAIN_SECS:-0})); i=0; f=0
while [ $SECONDS -lt $end ]; do
  i=$((i + 1))
  timeout 60 ${PLAIN:-./comm-bench} --backend cuda --num_ranks ${NRANKS:-8} --methods symm_ll --counts 4096,32768 \
    --num_warmup_iters 60 --num_iters 5 --repeats 1 > $OUT/plain_$i.txt 2>&1 && { [ $i = 1 ] || rm $OUT/plain_$i.txt; continue; }
  f=$((f + 1)); restart_mps; echo "plain run $i: $(grep -m1 -o 'error: .*' $OUT/plain_$i.txt | cut -c1-300)"
done
echo "plain runs $i, failed $f"
