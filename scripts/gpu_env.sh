# Sourced by the GPU-node scripts: the environment every run shares, and MPS when ranks share GPUs.
#   source gpu_env.sh OUT_DIR   (sets ranks, gpus, mps_started and out=OUT_DIR; adds what runs where to
#   OUT_DIR/machine.txt; stops MPS on exit; defines step and fits). PACK=1: on exit, everything in OUT_DIR becomes one
#   OUT_DIR/results.tgz, for nodes that send back only a few files.
# Never NVLink multicast: it can take a shared host's GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Compiled kernels outside OUT_DIR (keyed by their source's hash, so builds share it safely), so the results that
# a GPU node sends back are only results; a kcache/ beside this file (an earlier call's, carried with dist/) saves a
# fresh node the compiling.
default_cache=${TMPDIR:-/tmp}/arx-kernel-cache
[ -d "$(dirname "${BASH_SOURCE[0]}")/kcache" ] && default_cache=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/kcache
export ARX_KERNEL_CACHE=${ARX_KERNEL_CACHE:-$default_cache}
# fits N: whether a step whose timeout is N seconds ends within SECS (default 560) of sourcing this file, so that a
# script guards its steps (fits 90 && step ...) and ends before the node's limit cuts it mid-step.
steps_end=$(($(date +%s) + ${SECS:-560}))
fits() { (($(date +%s) + $1 <= steps_end)); }
ranks=${RANKS:-8}
gpus=$( (nvidia-smi -L 2>/dev/null; rocm-smi --showid 2>/dev/null | grep 'Device ID') | grep -c '^GPU' || true)
mps_started=0
stop_mps() {
    if [ "$mps_started" = 1 ]; then echo quit | nvidia-cuda-mps-control || true; fi
}
pack_out() {
    [ "${PACK:-0}" = 1 ] && [ -d "$out" ] || return 0
    local tgz
    tgz=$(mktemp "${TMPDIR:-/tmp}/arx-results.XXXXXX") &&
        tar -C "$out" -czf "$tgz" . && find "$out" -mindepth 1 -delete && mv "$tgz" "$out/results.tgz"
}
trap 'stop_mps; pack_out' EXIT
# 8 ranks on fewer NVIDIA GPUs run under MPS, so their kernels run at once (without it they time-slice and every
# cross-rank barrier takes milliseconds); NO_MPS=1 keeps it off, as compute-sanitizer needs.
if command -v nvidia-cuda-mps-control >/dev/null && [ "$gpus" -lt "$ranks" ] && [ "${NO_MPS:-0}" != 1 ]; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/arx-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/arx-mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d && mps_started=1
    echo "# $ranks ranks on $gpus GPU(s): MPS started"
fi
out=$1
# What runs where (date, device, driver, ranks, MPS), added by every sourcing, so no script can leave it out.
mkdir -p "$out"
{
    echo "date: $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    echo "ranks: $ranks, gpus: $gpus, mps: $mps_started"
} | tee -a "$out/machine.txt"
# restart_mps: a fresh MPS server, where this script started one: a run that ended in a stuck wait (or was killed
# with kernels in flight) left the server unable to make contexts for the next ("cuDevicePrimaryCtxRetain failed").
restart_mps() {
    [ "$mps_started" = 1 ] || return 0
    echo quit | nvidia-cuda-mps-control || true
    sleep 2
    nvidia-cuda-mps-control -d
}
# step NAME CMD...: runs CMD with its output in OUT_DIR/NAME.txt and shows its end; a failure is marked there, sets
# status=1 and restarts MPS, and the script goes on with the next step. Each step's wall seconds end its file, so the
# next plan can size its calls to the device time a session has.
status=0
step() {
    local name=$1 began=$SECONDS
    shift
    echo "## $name: $*" | tee "$out/$name.txt"
    if ! "$@" >>"$out/$name.txt" 2>&1; then
        echo "## $name FAILED" | tee -a "$out/$name.txt"
        status=1
        restart_mps
    fi
    echo "## $name took $((SECONDS - began)) s" >>"$out/$name.txt"
    tail -n 12 "$out/$name.txt"
}
