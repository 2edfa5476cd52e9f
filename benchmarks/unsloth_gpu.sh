#!/bin/bash
# Issue #33, where Unsloth's full fine-tune wins at 4 samples a step: our packed B4 step (before/after) with one step
# profiled, then Unsloth's full fine-tune on the same B4 batches with one step profiled, and on the padded 24-sample
# batches of our 24-sample / 24,576-token packed step. Same carries as benchmarks/mfu_gpu.sh. JSONs and log in $OUT.
set -o pipefail
OUT=${OUT:-/tmp/unsloth_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
T0=$(date +%s)
el() { echo "[$(($(date +%s) - T0))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
rm -rf /tmp/site /tmp/uns /tmp/dump
pip() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$@"; }
pip /tmp/site .dev_wheels/pyd/*.whl .dev_wheels/extra/*.whl || exit 1
mkdir -p /tmp/uns && tar xzf .dev_wheels/uns/uns_site.tgz -C /tmp/uns
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
DATA=${DATA:-.dev_data/mix.parquet}
PYTHONPATH=/tmp/site:$PWD timeout "${T_SFT:-120}" python3 benchmarks/sft_mfu.py --data "$DATA" --out "$OUT" --steps 5 \
  --groups b4 --profile b4_after --dump /tmp/dump --dump-big >/tmp/sft_mfu.stdout
el "sft_mfu rc=$?"
PYTHONPATH=/tmp/uns timeout "${T_UNS:-200}" python3 benchmarks/sft_unsloth.py --dump /tmp/dump --side unsloth \
  --modes full --warmup 3 --profile --big --out "$OUT/unsloth.json" >/dev/null 2>"$OUT/unsloth.log"
el "unsloth rc=$?"
