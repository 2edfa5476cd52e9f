#!/bin/bash
# Issue #33 in one device call: benchmarks/sft_mfu.py (packed SFT MFU with the tower running, the last commit's step
# vs now side by side; attention probes; checks), benchmarks/rl_gpu.py (the RL update, last commit vs now, and TRL's
# GRPOTrainer loss path), and with UNSLOTH=1 benchmarks/sft_unsloth.py (Unsloth, then Trainer +
# use_liger_kernel=True, each in its own process on the image's transformers). JSONs and the log in $OUT.
# Carried (git-ignored): .dev_wheels/pyd (pydantic, transformers >= 5.18), .dev_wheels/extra (liger-kernel 0.8.5,
# trl 1.16, datasets 5.2 and its dill / multiprocess / xxhash), DATA (the export), and with UNSLOTH=1
# .dev_wheels/uns/uns_site.tgz (Unsloth 2026.10.9 and its dependencies, unpacked wheels with bitsandbytes'
# other-CUDA/ROCm libraries and Unsloth's `studio` web app left out: 26 MB).
#   UNSLOTH=0 (default): skip the Unsloth and Trainer+Liger sides (session 20: the .tgz is no longer kept)
#   TESTS=1: first run the GPU tests of the kernels (tests/test_text_kernels.py, tests/test_rl_kernels.py)
#   SFT_ARGS / RL_ARGS: replace sft_mfu.py's / rl_gpu.py's arguments (defaults below)
set -o pipefail
OUT=${OUT:-/tmp/mfu_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
T0=$(date +%s)
el() { echo "[$(($(date +%s) - T0))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
rm -rf /tmp/site /tmp/liger /tmp/uns /tmp/dump
pip() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$@"; }
pip /tmp/site .dev_wheels/pyd/*.whl .dev_wheels/extra/*.whl || exit 1
UNSLOTH=${UNSLOTH:-0}
if [ "$UNSLOTH" = 1 ]; then
  pip /tmp/liger .dev_wheels/extra/liger_kernel-*.whl || exit 1
  mkdir -p /tmp/uns && tar xzf .dev_wheels/uns/uns_site.tgz -C /tmp/uns
fi
el installed
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
if [ "${TESTS:-0}" = 1 ]; then
  for t in tests/test_text_kernels.py tests/test_rl_kernels.py; do
    PYTHONPATH=/tmp/site:$PWD timeout "${T_TESTS:-120}" python3 "$t" >"$OUT/$(basename "$t" .py).log" 2>&1
    el "$t rc=$?"
  done
fi
DATA=${DATA:-.dev_data/mix.parquet}
SFT_ARGS=${SFT_ARGS:---lora --no-probe --profile after --groups checks variants}
if [ "$UNSLOTH" = 1 ]; then SFT_ARGS="$SFT_ARGS --dump /tmp/dump"; fi
# shellcheck disable=SC2086
PYTHONPATH=/tmp/site:$PWD timeout "${T_SFT:-300}" python3 benchmarks/sft_mfu.py --data "$DATA" --out "$OUT" $SFT_ARGS \
  >/tmp/sft_mfu.stdout
el "sft_mfu rc=$?"
RL_ARGS=${RL_ARGS:---modes full lora --algos grpo --steps 8 --warmup 2 --ablate-text --no-ablate-kernels --no-breakdown}
# shellcheck disable=SC2086
PYTHONPATH=/tmp/site:$PWD timeout "${T_RL:-200}" python3 benchmarks/rl_gpu.py --size 2b --batch 8 $RL_ARGS \
  --out "$OUT/rl_gpu.json" >/tmp/rl_gpu.stdout
el "rl_gpu rc=$?"
if [ "$UNSLOTH" = 1 ]; then
  PYTHONPATH=/tmp/uns timeout "${T_UNS:-160}" python3 benchmarks/sft_unsloth.py --dump /tmp/dump --side unsloth \
    --warmup 3 --out "$OUT/unsloth.json" >/dev/null 2>"$OUT/unsloth.log"
  el "unsloth rc=$?"
  PYTHONPATH=/tmp/liger timeout "${T_TL:-60}" python3 benchmarks/sft_unsloth.py --dump /tmp/dump --side trainer_liger \
    --warmup 3 --out "$OUT/trainer_liger.json" >/dev/null
  el "trainer_liger rc=$?"
fi
