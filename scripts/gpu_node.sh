#!/usr/bin/env bash
# Runs the GPU sweep on a GPU node (auto's tune table first, then every method eager and graph) from the binaries `cargo xtask bundle` put into dist/ (nothing is built here).
#   [TUNE=0] [MODES="eager graph"] [METHODS=all] gpu_node.sh OUT_DIR [comm-bench args...]
# With fewer GPUs than ranks (e.g. 8 ranks on one H200) it runs the ranks under MPS, so their kernels run
# concurrently (without MPS they time-slice and every cross-rank barrier takes milliseconds).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: gpu_node.sh OUT_DIR [comm-bench args...]}
shift
mkdir -p "$out"
source "$here/gpu_env.sh" "$out"
"$here/gpu_smoke" --backend cuda 2>&1 | tee "$out/gpu_smoke.txt"
# auto's table, measured here in graph mode (kernel and protocol cost, launches out of the way); TUNE=0 skips it
# (e.g. for `--methods ablation`, which has no auto).
table=()
if [ "${TUNE:-1}" = 1 ]; then
    "$here/comm-bench" --backend cuda --num_ranks "$ranks" --graph --tune "$out/tune.json" "$@" 2>&1 | tee "$out/tune.txt"
    table=(--tune_table "$out/tune.json")
fi
for mode in ${MODES:-eager graph}; do
    flag=(); [ "$mode" = graph ] && flag=(--graph)
    "$here/comm-bench" --backend cuda --num_ranks "$ranks" --export_csv --output_dir "$out/$mode" \
        --methods "${METHODS:-all}" "${table[@]}" "${flag[@]}" "$@" 2>&1 | tee "$out/$mode.txt"
done
# One file to carry back: the device tool returns at most 8.
tar -C "$out" --exclude kernel-cache -czf "$out.tar.gz" .
