#!/usr/bin/env bash
# The GPU node's correctness runs, from the binaries in dist/: a soak of back-to-back calls with random methods,
# sizes and dtypes and bursts of calls with one rank lagging (8 ranks, under MPS when they share GPUs), then
# compute-sanitizer memcheck and racecheck on the kernels (2 ranks without MPS, which the sanitizer does not support).
#   [SOAK_METHODS=list] gpu_verify.sh OUT_DIR [soak calls]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: gpu_verify.sh OUT_DIR [soak calls]}
calls=${2:-10000}
mkdir -p "$out"
# The shared environment (and PACK=1) without its MPS: the runs under MPS below start their own, the sanitizers run
# without.
NO_MPS=1 source "$here/gpu_env.sh" "$out"
status=0
# Runs its arguments with an MPS server of their own where ranks share GPUs.
under_mps() (
    if [ "$gpus" -lt "$ranks" ]; then
        export CUDA_MPS_PIPE_DIRECTORY=/tmp/arx-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/arx-mps-log
        mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
        nvidia-cuda-mps-control -d
        trap 'echo quit | nvidia-cuda-mps-control' EXIT
    fi
    "$@"
)
under_mps "$here/comm-bench" soak --backend cuda --num_ranks "$ranks" --calls "$calls" \
    ${SOAK_METHODS:+--methods "$SOAK_METHODS"} 2>&1 | tee "$out/soak.txt" || status=1
# A lagging rank: ranks enter each burst 3 ms apart, so the others' kernels spin while one is behind; where ranks share
# a GPU, grids that leave it no multiprocessor free lose a call here (results/h100-mps/s27).
under_mps env ALLREDUCE_TIMEOUT_S=5 "$here/comm-bench" norm --backend cuda --num_ranks "$ranks" --hidden 4096 \
    --tokens 8 --repeats 1 --num_iters 3 --num_warmup_iters 1 --skew_us 3000 --methods unfused:symm_ll,fused_ll \
    --bursts 1000 2>&1 | tee "$out/lagging.txt" || status=1
sanitize() {
    local tool=$1
    shift
    compute-sanitizer --tool "$tool" --target-processes all --error-exitcode 99 \
        "$here/comm-bench" --backend cuda --num_ranks 2 --timeout_s 120 --num_iters 2 --num_warmup_iters 1 \
        --repeats 1 --methods all "$@"
}
for tool in memcheck racecheck; do
    {
        sanitize "$tool" --counts 8,1000,4099,65536,1048583
        sanitize "$tool" --counts 840,1049160 --op reduce_scatter
        sanitize "$tool" --counts 8,13,4099,65536 --op all_gather
    } 2>&1 | tee "$out/$tool.txt" || status=1
done
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$out"/memcheck.txt "$out"/racecheck.txt
exit $status
