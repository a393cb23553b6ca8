#!/usr/bin/env bash
# Session 23, one call whatever GPU comes. On an H200: the 8-rank caller-buffer tune and 1M / 16M sweeps on it
# (s21_call.sh's H200 branch, WORLDS). On an H100: #28's variant C (a thread's first vector of r and of the weight
# held across the norm's reduction): its rows tests on CUDA at 8 ranks, then C against main (A), hidden 4096 and
# 8192, passes interleaved.
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $gpu"
if echo "$gpu" | grep -q H200 && [ "${MODE:-tune}" = tune ]; then
  OUT=$OUT PACK=1 H200_WORLDS="${WORLDS:-8}" bash results/h100-mps/s21/s21_call.sh 2>&1 | tail -60
else
  (
    cd target/ab && source ./gpu_env.sh $OUT
    step rows_tests_C_cuda8 timeout ${ROWS_T:-150} env ARX_TEST_BACKEND=cuda ARX_TEST_RANKS=8 ./C/rows_tests --test-threads 1
  )
  mkdir -p $OUT/ab; OUT=$OUT/ab PAIRS="${PAIRS:-C:4096 C:8192}" BUDGET=200 T=150 bash target/ab/s22_ab.sh 2>&1 | tail -40
fi
