#!/bin/bash
# stop 55 call 2: boundary Casts folded into the replay's copies: GPU tests, same-engine A/B, the suite at batch 1
export TRITON_CACHE_DIR=/tmp/tc PYTHONPATH=src:.
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/log.txt
timeout 100 python -m pytest -q -m gpu tests/runtime > $OUT/gpu-tests.log 2>&1; tail -3 $OUT/gpu-tests.log >> $OUT/log.txt
timeout 200 python -m benchmarks.probes.gpu_pdl_ab --out $OUT/ab --cache /tmp/c \
  --rows mobilenet_v2:1,resnet50:1,vit_b_16:1,bert:1 --variants on,unfolded,off --rounds 5 --budget-seconds 170 >> $OUT/log.txt 2>&1
timeout 330 python -m benchmarks.suite --models resnet50,mobilenet_v2,vit_b_16,bert --batches 1 \
  --peers eager,reduce-overhead --out $OUT/suite --cache /tmp/c --budget-seconds 300 > $OUT/suite.log 2>&1
tail -25 $OUT/suite.log >> $OUT/log.txt
tail -40 $OUT/log.txt
