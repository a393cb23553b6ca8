#!/usr/bin/env bash
# Session 22: #28's fused packets, variants against main (A = bcdcd48), 8 ranks, passes interleaved; each pair's
# table in $OUT/ab_AX_H/table.md. D: blocks own rows (no row counters); F: D with r held in registers (a lane's
# vectors per thread); E: one acq_rel atomic on the row counter; C: the first vector of r and weight held across the
# reduction. PAIRS in priority order; stops starting pairs after BUDGET seconds. Runs in a folder holding dist/'s
# gpu_ab.sh, gpu_env.sh, ab_table.py and comm_json.py, and A/, D/, ... each with its build's comm-bench.
#   OUT=dir [PAIRS="E:4096 E:8192"] s22_ab.sh
cd "$(dirname "$0")"
start=$(date +%s)
for pair in ${PAIRS:-F:4096 D:4096 F:8192 E:4096 D:8192 C:4096}; do
  x=${pair%%:*} h=${pair##*:}
  [ $(( $(date +%s) - start )) -lt ${BUDGET:-420} ] || { echo "budget spent before $pair"; break; }
  [ -x $x/comm-bench ] || continue
  echo "=== A vs $x, hidden $h"
  PACK=1 OP=norm HIDDEN=$h TOKENS=${TOKENS:-1,8,32} PASSES=2 METHODS=fused_ll,unfused \
    timeout ${T:-150} bash gpu_ab.sh A $x $OUT/ab_A${x}_$h 2>&1 | tail -14
done
