#!/usr/bin/env bash
# Session 26, second call: is the lost packet call the lagging rank's work never getting a multiprocessor? main's
# grids (dist/diag/comm-bench: main + diag-max-grid.patch, the variable unset; symm_ll 32 blocks per rank, 224
# spinning blocks on 132 SMs) against the spare-multiprocessor cap (dist/comm-bench: 16 per rank at 8 ranks, 128 in
# all), alternating on one machine; then, with the cap, #28's grid at hidden 4096 / 8192 and #24's sweep at
# 1K / 64K / 1M / 16M elements, eager and graph.
#   OUT=dir PACK=1 SECS=500 bash results/h100-mps/s26/call2.sh   (dist/kcache: call 1's compiled kernels; a step
#   starts only if its timeout ends within SECS of the start)
set -u
end=$(( $(date +%s) + ${SECS:-560} ))
fits() { (( $(date +%s) + $1 <= end )); }
out=$OUT
cd dist
export ARX_KERNEL_CACHE=$PWD/kcache
source ./gpu_env.sh $out
export ALLREDUCE_SETUP_TIMEOUT_S=200
stress=(norm --backend cuda --num_ranks 8 --hidden 4096 --tokens 8 --repeats 1 --num_iters 3 --num_warmup_iters 1 --skew_us 3000)
step warm timeout 60 ./comm-bench "${stress[@]}" --methods unfused:symm_ll,fused_ll
for rep in 1 2; do
  fits 35 && step base_$rep timeout 35 env ALLREDUCE_TIMEOUT_S=5 ./diag/comm-bench "${stress[@]}" --methods unfused:symm_ll --bursts 600
  fits 35 && step fix_$rep timeout 35 env ALLREDUCE_TIMEOUT_S=5 ./comm-bench "${stress[@]}" --methods unfused:symm_ll --bursts 600
done
fits 35 && step fix_fused timeout 35 env ALLREDUCE_TIMEOUT_S=5 ./comm-bench "${stress[@]}" --methods fused_ll --bursts 600
for f in $out/base_* $out/fix_*; do
  echo "$(basename $f .txt): $(grep -c FAILED $f) failed; $(grep -ho 'burst [0-9]*, rank [0-9]*: peer.*before)' $f | head -1)"
done
for h in 4096 8192; do
  for mode in eager graph; do
    flag=(); [ $mode = graph ] && flag=(--graph)
    fits 45 && step norm_${h}_$mode timeout 45 ./comm-bench norm --backend cuda --num_ranks 8 --hidden $h --repeats 5 \
      --methods fused_ll,fused_1shot,fused_epoch_1shot,unfused,auto "${flag[@]}"
  done
done
m=car_1shot,car_2shot,auto,symm_epoch_1shot,symm_zc_1shot,symm_zc_2shot,symm_zc_2shot_pull
for mode in eager graph; do
  flag=(); [ $mode = graph ] && flag=(--graph)
  fits 50 && step sweep_$mode timeout 50 ./comm-bench --backend cuda --num_ranks 8 --counts 1024,65536,1048576,16777216 \
    --methods $m --repeats 3 "${flag[@]}"
done
exit $status
