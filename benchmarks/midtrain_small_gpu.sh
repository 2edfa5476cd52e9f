#!/bin/bash
# How session 16 trained the small base on the H100 (docs/bench_midtrain_s16.json). Carry .dev_gpu/corpus2.parquet (a midtrain corpus export,
# <lake>/_datasets/midtrain-<id>/train.parquet), .dev_gpu/held.parquet (midtrain_skills.py held-out export) and .dev_wheels/pyd
# (pydantic + transformers >= 5.18 wheels). 348 s of training for 2,800 steps; the model comes back as S.tgz.* parts.
# GPU: the small student mid-trained on the 3,600-page real corpus (corpus2), then offline step accuracy on held-out pages.
exec > >(tee -a $OUT/log) 2>&1
rm -rf /tmp/site; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev_wheels/pyd/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
[ -d /tmp/m_small ] || python3 -c "from training.models import init_model; from pathlib import Path; init_model('qwen3-vl', 'small', Path('/tmp/m_small'), seed=0)" || exit 1
t0=$(date +%s)
timeout ${TLIM:-440} python3 -m training.sft --base /tmp/m_small --data .dev_gpu/corpus2.parquet --out /tmp/S --no-progress \
  --settings "{\"method\": \"full\", \"lr\": 0.001, \"batch_size\": 16, \"max_steps\": ${STEPS:-2800}, \"epochs\": 100, \"targets\": \"action\", \"save_every\": 100000}" > /tmp/S.log 2>&1
echo "trained rc=$? in $(( $(date +%s) - t0 )) s: $(tail -2 /tmp/S.log)"
[ -f /tmp/S/sft_result.json ] || exit 1
timeout 70 python3 benchmarks/step_accuracy.py --data .dev_gpu/held.parquet --max-samples 320 --batch 64 --model /tmp/S --json $OUT/step_accuracy.json | python3 -c "
import json,sys; d=json.load(sys.stdin)
for r in d['results']: print(r['model'], r['parse_fail_rate'], r['accuracy'])"
(cd /tmp/S && tar cf - --exclude=state . | gzip -1 | split -b 15m - $OUT/S.tgz.)
ls -la $OUT
