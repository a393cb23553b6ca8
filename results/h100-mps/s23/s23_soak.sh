#!/usr/bin/env bash
# Session 23: the unfused burst failure at 8 x 4096 eager, narrowed by allreduce: comm-bench norm runs back to back
# for SECS seconds, each checking (one call each, then 6 consecutive calls) the unfused sequence on symm_ll,
# car_1shot and symm_epoch_1shot, the tables' choice, and fused_ll; the first run's output and every failed run's are
# kept. Run from a folder that holds gpu_env.sh and a comm-bench (COMM_BENCH; in session 23 target/ab with N/, a
# build of a843f90): e.g. `cd dist && OUT=out COMM_BENCH=./comm-bench bash ../results/h100-mps/s23/s23_soak.sh`.
source ./gpu_env.sh $OUT >/dev/null
end=$((SECONDS + ${SECS:-270})); i=0; f=0
while [ $SECONDS -lt $end ]; do
  i=$((i + 1))
  timeout 60 ${COMM_BENCH:-./N/comm-bench} norm --backend cuda --num_ranks 8 --hidden 4096 --tokens 8 \
    --methods ${METHODS:-unfused,unfused:symm_ll,unfused:car_1shot,unfused:symm_epoch_1shot,fused_ll} \
    --repeats 1 --num_iters 3 --num_warmup_iters 1 > $OUT/soak_$i.txt 2>&1 && { [ $i = 1 ] || rm $OUT/soak_$i.txt; continue; }
  f=$((f + 1)); echo "run $i: $(grep -m1 -o 'error: .*' $OUT/soak_$i.txt | cut -c1-150)"
done
echo "runs $i, failed $f"
