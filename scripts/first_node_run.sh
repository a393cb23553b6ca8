#!/usr/bin/env bash
# The first run on a real GPU node (8 GPUs, or fewer under MPS), from the binaries `cargo xtask bundle` put into
# dist/ (nothing is built here). Each step is its own process with short per-call timeouts, so a hang (a kernel's
# wait past its deadline, which fails the step's calls) in one method group ends that step only and the others still run; everything lands in OUT_DIR and in
# OUT_DIR.tar.gz, the one file to send back.
#   [RANKS=8] [BACKEND=cuda|hip] [SKIP="step ..."] [SOAK_CALLS=2000] [SOAK_SECONDS=600] [BENCH_ARGS="--counts ..."]
#   first_node_run.sh OUT_DIR [--with-nvls]
# (SKIP, the soak's bounds and BENCH_ARGS, extra comm-bench flags for every sweep, trim it to a time limit.)
# --with-nvls also runs NCCL as the node configures it (NVLink multicast allowed); by default multicast stays off,
# since it can take a shared host's GPUs out of service.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: first_node_run.sh OUT_DIR [--with-nvls]}
with_nvls=${2:-}
mkdir -p "$out"
export ALLREDUCE_TUNE_DIR=${ALLREDUCE_TUNE_DIR:-$out/tune-cache}
source "$here/gpu_env.sh" "$out"
if [ -z "${BACKEND:-}" ]; then
    if [ -e /dev/kfd ]; then BACKEND=hip; else BACKEND=cuda; fi
fi
read -r -a extra <<<"${BENCH_ARGS:-}"
bench=("$here/comm-bench" --backend "$BACKEND" --num_ranks "$ranks" --timeout_s 5 --setup_timeout_s 300 "${extra[@]}")
failed=()
step() {
    local name=$1
    shift
    if [[ " ${SKIP:-} " == *" $name "* ]]; then echo "## $name: skipped (SKIP)"; return; fi
    echo "## $name: $*" | tee "$out/$name.txt"
    if "$@" >>"$out/$name.txt" 2>&1; then echo "## $name: ok" | tee -a "$out/$name.txt"; else
        echo "## $name: FAILED (exit $?)" | tee -a "$out/$name.txt"
        failed+=("$name")
    fi
}
{
    echo "backend: $BACKEND"
    nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
    nvidia-smi topo -m 2>/dev/null || true
    rocm-smi --showproductname --showbus --showdriverversion 2>/dev/null || true
    rocm-smi --showtopo 2>/dev/null || true
} >>"$out/machine.txt" 2>&1
# The device checks and one rank compiling every kernel library into the cache, so 8 cold compiles do not race
# the set-up deadline.
[ "$BACKEND" = cuda ] && step smoke "$here/gpu_smoke" --backend cuda
step warm_cache "$here/comm-bench" --backend "$BACKEND" --num_ranks 1 --counts 1024 --num_iters 2 --repeats 1 \
    --methods car_1shot,car_1shot_vmm,symm_1shot,symm_2shot,symm_1shot_tuned,symm_zc_2shot_ll
# Placement (rank, device, bus id) and the peer link matrix are in every comm-bench header; one method group per
# process.
for group in "car_1shot,car_2shot,symm_1shot,symm_2shot" "auto,symm_1shot_tuned,symm_2shot_tuned" \
    "ablation" "staging" "shapes"; do
    name=group_$(echo "$group" | tr ',' '_' | cut -c1-40)
    step "$name" "${bench[@]}" --methods "$group" --export_csv --output_dir "$out/$name"
done
step group_graph "${bench[@]}" --graph --methods "car_1shot,car_2shot,auto,symm_1shot_tuned,symm_2shot_tuned" \
    --export_csv --output_dir "$out/group_graph"
step rs "${bench[@]}" --op reduce_scatter --export_csv --output_dir "$out/rs"
step ag "${bench[@]}" --op all_gather --export_csv --output_dir "$out/ag"
# Every method at large counts, back to back, every result checked.
step soak "$here/comm-bench" soak --backend "$BACKEND" --num_ranks "$ranks" --max_count 8388608 \
    --calls "${SOAK_CALLS:-2000}" --max_seconds "${SOAK_SECONDS:-600}" --timeout_s 10
# This node's tune tables (graph and eager), stored in the cache the library reads.
step tune_graph "${bench[@]}" --graph --tune "$out/tune-graph.json"
step tune_eager "${bench[@]}" --tune "$out/tune-eager.json"
# NCCL / RCCL: multicast off (labelled), and as the node configures it only when asked.
if [ "$gpus" -lt "$ranks" ]; then
    # NCCL refuses two ranks on one GPU, and comm-bench fails a run that measured nothing.
    echo "## nccl_no_nvls: skipped (NCCL needs a GPU per rank: $ranks ranks on $gpus GPU(s))"
else
    step nccl_no_nvls "${bench[@]}" --methods nccl,nccl_symm --export_csv --output_dir "$out/nccl_no_nvls"
fi
if [ "$with_nvls" = --with-nvls ] && [ "$gpus" -ge "$ranks" ]; then
    step nccl_node_default env -u NCCL_NVLS_ENABLE "${bench[@]}" --methods nccl,nccl_symm --export_csv \
        --output_dir "$out/nccl_node_default"
fi
# Across nodes (crates/across): two emulated nodes on this one (NCCL over its socket transport, a host id per rank).
# On two real nodes the same binary under the cluster's launcher runs on the launcher's nodes, e.g.
#   srun -N2 --ntasks-per-node=8 env ARX_TEST_BACKEND=$BACKEND dist/across_tests --test-threads 1
# and from Python (the wheel installed as gpu_python.sh does): srun -N2 --ntasks-per-node=8 python dist/gpu_across.py
# --nodes 0 (the launcher's nodes; it tunes the two paths and checks that calls follow the table).
step across_emulated env NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 ARX_TEST_BACKEND="$BACKEND" ARX_TEST_RANKS="$ranks" \
    ARX_TEST_NODES=2 "$here/across_tests" --test-threads 1
echo "failed steps: ${failed[*]:-none}" | tee "$out/summary.txt"
tar -C "$(dirname "$out")" --exclude kernel-cache -czf "$out.tar.gz" "$(basename "$out")"
echo "send back: $out.tar.gz"
[ ${#failed[@]} -eq 0 ]
