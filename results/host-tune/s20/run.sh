#!/usr/bin/env bash
# Host driver, 2 and 3 ranks: sweeps on the built-in tables, tunes (with the pulled two-shot and near-tie re-timing),
# sweeps on the new tables.
set -u
cd /work/main
out=target/tmp/host20
cb=target/release/comm-bench
m=car_1shot,car_2shot,symm_2shot,auto,symm_ll,symm_epoch_1shot,symm_zc_1shot,symm_zc_2shot,symm_zc_2shot_push,symm_zc_2shot_pull,symm_zc_2shot_ll
for w in 2 3; do
  rm -rf /tmp/htune-none; mkdir -p /tmp/htune-none
  ALLREDUCE_TUNE_DIR=/tmp/htune-none $cb --backend host --num_ranks $w --methods $m --export_csv --output_dir $out/before-w$w > $out/before-w$w.log 2>&1
done
rm -rf /tmp/htune20; mkdir -p /tmp/htune20
for w in 2 3; do
  ALLREDUCE_TUNE_DIR=/tmp/htune20 $cb --backend host --num_ranks $w --tune $out/host-w$w.json --tune_hidden 0 > $out/tune-w$w.log 2>&1
done
for w in 2 3; do
  ALLREDUCE_TUNE_DIR=/tmp/htune20 $cb --backend host --num_ranks $w --methods $m --export_csv --output_dir $out/after-w$w > $out/after-w$w.log 2>&1
done
echo done > $out/DONE
