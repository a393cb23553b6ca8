#!/usr/bin/env bash
# Two builds' comm-bench timings side by side on a GPU node, passes interleaved (A B A B ...) so drift hits both:
#   gpu_ab.sh A_DIR B_DIR OUT_DIR
# A_DIR and B_DIR each hold a comm-bench (e.g. the dist/ of two commits: `cargo xtask bundle --rev REV` makes
# dist-REV/ beside dist/). Writes OUT_DIR/MODE-BUILD-PASS/ and
# OUT_DIR/table.md (scripts/ab_table.py). METHODS, COUNTS, MODES and PASSES override what is timed. OP=norm times
# `comm-bench norm` instead (the allreduce + residual add + RMSNorm methods at HIDDEN, default 4096, and TOKENS,
# default comm-bench's; METHODS default to all of them).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
a=$(cd "${1:?usage: gpu_ab.sh A_DIR B_DIR OUT_DIR}" && pwd)
b=$(cd "${2:?usage: gpu_ab.sh A_DIR B_DIR OUT_DIR}" && pwd)
out=${3:?usage: gpu_ab.sh A_DIR B_DIR OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
source "$here/gpu_env.sh" "$out"
op=${OP:-allreduce}
methods=${METHODS:-car_1shot,car_2shot,symm_ll,symm_epoch_1shot,symm_zc_2shot,auto}
counts=${COUNTS:-1024,16777216}
case $op in
allreduce) what=(--methods "$methods" --counts "$counts" --export_csv) ;;
norm)
    what=(norm --hidden "${HIDDEN:-4096}")
    [ -n "${TOKENS:-}" ] && what+=(--tokens "$TOKENS")
    [ -n "${METHODS:-}" ] && what+=(--methods "$METHODS")
    ;;
*) echo "OP=$op: allreduce or norm" >&2; exit 2 ;;
esac
for pass in $(seq 1 "${PASSES:-2}"); do
    for mode in ${MODES:-eager graph}; do
        flag=(); [ "$mode" = graph ] && flag=(--graph)
        for build in A B; do
            dir=$a; [ "$build" = B ] && dir=$b
            ARX_KERNEL_CACHE=$ARX_KERNEL_CACHE/$build "$dir/comm-bench" "${what[@]}" --backend cuda \
                --num_ranks "$ranks" --num_iters 50 --repeats 11 --output_dir "$out/$mode-$build-$pass" "${flag[@]}" \
                >"$out/$mode-$build-$pass.txt" 2>&1 ||
                { echo "$mode-$build-$pass FAILED"; tail -n 5 "$out/$mode-$build-$pass.txt"; exit 1; }
        done
    done
done
python3 "$here/ab_table.py" "$out" | tee "$out/table.md"
