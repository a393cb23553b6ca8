#!/usr/bin/env bash
# Session 25, one call: does `mov.u64 %globaltimer` tear on this GPU (timer_probe.py), does comm-bench norm's
# --skew_us find session 24's fault within one run on a build without the fix (dist/reverted/comm-bench: b0e2e71's
# kernels/include reverted) and not on main's, and, with NORM=1, #28's grid on main (fused against unfused, eager and graph).
#   OUT=dir PACK=1 bash results/h100-mps/s25/s25_call.sh     (from the repository root, dist/ from cargo xtask bundle)
set -u
out=$OUT
cd dist
source ./gpu_env.sh $out
norm=(norm --backend cuda --num_ranks 8 --hidden 4096 --tokens 8 --repeats 1 --num_iters 3 --num_warmup_iters 1)
# The first run of each build compiles its kernels (about 40 s at 8 ranks): give its set-up room.
for b in ${BUILDS:-main:./comm-bench reverted:./reverted/comm-bench}; do
  step warm_${b%%:*} timeout 200 env ALLREDUCE_TIMEOUT_S=300 ${b#*:} "${norm[@]}" --methods unfused:symm_ll,fused_ll
done
if [ "${SKEW_RUNS:-1}" = 1 ]; then
  [ "${TIMER:-1}" = 1 ] && step timer timeout 60 python3 ../results/h100-mps/s24/timer_probe.py 10
  for rep in $(seq ${REPS:-1}); do
    for b in ${BUILDS:-main:./comm-bench reverted:./reverted/comm-bench}; do
      for m in ${METHODS:-unfused:symm_ll fused_ll}; do
        step skew_${b%%:*}_${m/:/-}_$rep timeout 150 ${b#*:} "${norm[@]}" --methods $m --bursts ${BURSTS:-400} \
          --skew_us ${SKEW:-10000}
      done
    done
  done
fi
if [ "${NORM:-0}" = 1 ]; then
  for h in 4096 8192; do
    for mode in eager graph; do
      flag=(); [ $mode = graph ] && flag=(--graph)
      step norm_${h}_$mode timeout 120 ./comm-bench norm --backend cuda --num_ranks 8 --hidden $h --repeats 5 \
        --methods fused_ll,fused_1shot,fused_epoch_1shot,unfused,auto "${flag[@]}"
    done
  done
fi
exit $status
