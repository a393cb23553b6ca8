#!/usr/bin/env bash
# For the next session (not yet run): what a lost packet's slot held (the failed wait's record, status words 5-7),
# and which conditions change the rate: graph replays (no host between calls), the work queues per MPS client
# (CUDA_DEVICE_MAX_CONNECTIONS), and 4 ranks. Each failing run stops at its first lost call (5 s deadline).
#   OUT=dir PACK=1 bash results/h100-mps/s25/next.sh
set -u
out=$OUT
cd dist
source ./gpu_env.sh $out
export ALLREDUCE_SETUP_TIMEOUT_S=200 ALLREDUCE_TIMEOUT_S=5
norm=(norm --backend cuda --hidden 4096 --tokens 8 --repeats 1 --num_iters 3 --num_warmup_iters 1 --skew_us 3000)
step warm timeout 150 ./comm-bench "${norm[@]}" --num_ranks 8 --methods unfused:symm_ll,fused_ll
for rep in 1 2; do
  step eager_$rep timeout 60 ./comm-bench "${norm[@]}" --num_ranks 8 --methods unfused:symm_ll --bursts 1200
  step graph_$rep timeout 60 ./comm-bench "${norm[@]}" --num_ranks 8 --methods unfused:symm_ll --bursts 600 --graph
done
for c in 1 32; do
  step connections_$c timeout 60 env CUDA_DEVICE_MAX_CONNECTIONS=$c ./comm-bench "${norm[@]}" --num_ranks 8 \
    --methods unfused:symm_ll --bursts 1200
done
step ranks4 timeout 60 env RANKS=4 ./comm-bench "${norm[@]}" --num_ranks 4 --methods unfused:symm_ll --bursts 2000
grep -h "never arrived" $out/*.txt | sed 's/.*: peer/peer/' | sort | uniq -c
exit $status
