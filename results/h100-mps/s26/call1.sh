#!/usr/bin/env bash
# Session 26, first H200 call: does the packet designs' lost call (session 25, H100) happen on the H200, and what did
# the lost packet's slot hold; then #28's grid (fused against unfused, built-in norm tables) at hidden 4096 and 8192.
# The compiled kernels go back in OUT/kcache for the next calls to carry.
#   OUT=dir PACK=1 bash results/h100-mps/s26/call1.sh
set -u
out=$OUT
cd dist
export ARX_KERNEL_CACHE=$out/kcache
source ./gpu_env.sh $out
export ALLREDUCE_SETUP_TIMEOUT_S=200 ALLREDUCE_TIMEOUT_S=5
norm=(norm --backend cuda --hidden 4096 --tokens 8 --repeats 1 --num_iters 3 --num_warmup_iters 1 --skew_us 3000)
step warm timeout 120 ./comm-bench "${norm[@]}" --num_ranks 8 --methods unfused:symm_ll,fused_ll
for rep in 1 2; do
  step eager_$rep timeout 50 ./comm-bench "${norm[@]}" --num_ranks 8 --methods unfused:symm_ll --bursts 1200
done
step graph_1 timeout 50 ./comm-bench "${norm[@]}" --num_ranks 8 --methods unfused:symm_ll --bursts 600 --graph
step ranks4 timeout 50 env RANKS=4 ./comm-bench "${norm[@]}" --num_ranks 4 --methods unfused:symm_ll --bursts 2000
grep -h "never arrived" $out/*.txt | sed 's/.*: peer/peer/' | sort | uniq -c
unset ALLREDUCE_TIMEOUT_S
for h in 4096 8192; do
  for mode in eager graph; do
    flag=(); [ $mode = graph ] && flag=(--graph)
    step norm_${h}_$mode timeout 65 ./comm-bench norm --backend cuda --num_ranks 8 --hidden $h --repeats 5 \
      --methods fused_ll,fused_1shot,fused_epoch_1shot,unfused,auto "${flag[@]}"
  done
done
exit $status
