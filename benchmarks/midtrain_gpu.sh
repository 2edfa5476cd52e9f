#!/bin/bash
# How session 15's GPU numbers for mid-training were made (docs/LOG.md 2026-11-25, docs/bench_midtrain_s15.json).
# Run on the GPU box from the repo root, with, carried: .dev_gpu/corpus.parquet (the corpus dataset export,
# <lake>/_datasets/midtrain-<id>/train.parquet), .dev_gpu/held.parquet (benchmarks/midtrain_skills.py's held-out
# oracle export, <lake>/_datasets/held-<run key>/train.parquet) and .dev_wheels/gpu (pydantic + its deps and
# transformers >= 5.18, whose chat-template generation marker the SFT labels need; the image has 5.17).
# About 9-10 minutes of H100 time in all: split it over two calls if one would pass its limit.
# Logs go to $OUT/log through tee: never pipe a long command into `tail` (a timed-out call returns nothing).
exec > >(tee -a "$OUT/log") 2>&1
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev_wheels/gpu/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
for size in mini small; do
  [ -d /tmp/m_$size ] || python3 -c "from training.models import init_model; from pathlib import Path; init_model('qwen3-vl', '$size', Path('/tmp/m_$size'), seed=0)"
done
models=""
for cfg in "mini 400" "mini 800" "mini 1600" "small 400" "small 800"; do   # one at a time: two side by side ran slower
  set -- $cfg; out=/tmp/ck_$1_$2
  timeout 280 python3 -m training.sft --base /tmp/m_$1 --data .dev_gpu/corpus.parquet --out $out --no-progress \
    --settings "{\"method\": \"full\", \"lr\": 0.001, \"batch_size\": 16, \"max_steps\": $2, \"epochs\": 100, \"targets\": \"action\"}"
  [ -f $out/sft_result.json ] && models="$models --model $out"
done
python3 benchmarks/step_accuracy.py --data .dev_gpu/held.parquet --max-samples 320 --batch 64 $models --model /tmp/m_mini \
  --json "$OUT/step_accuracy.json"
