#!/bin/bash
# Session 42: a mini-student base for a flywheel experiment, trained on the GPU box in fp32 and brought back as parts.
# Two device calls, because the wheels and a corpus together pass the 64 MiB a call carries:
#   1. carry .dev_wheels/all (transformers, pydantic and their dependencies as cp312 wheels, numpy left out):
#        bash benchmarks/base_mini_gpu.sh install      -> /tmp/site and /tmp/m_mini stay while the box is warm;
#                                                         $OUT/visual.xz.* is the init's vision tower
#   2. carry .dev_gpu/corpus.parquet (benchmarks/midtrain_corpus.py's export) and .dev_gpu/plan.json
#      (benchmarks/base_sweep_gpu.py's plan with "init": "/tmp/m_mini" and "base_only" variants):
#        bash benchmarks/base_mini_gpu.sh train        -> $OUT/<variant>.lm.xz.* + report.json
# Then here: benchmarks/assemble_weights.py runs/<name> --lm <files>/<variant>.lm --visual <files>/visual --size mini
# USE_HUB_KERNELS=0: transformers >= 5.2x loads Hub kernels on CUDA by default, and the box is offline.
set -o pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 USE_HUB_KERNELS=0
case "$1" in
install)
  rm -rf /tmp/site /tmp/m_mini
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .dev_wheels/all/*.whl || exit 1
  python3 -c "from training.models import init_model; from pathlib import Path
init_model('qwen3-vl', 'mini', Path('/tmp/m_mini'), seed=0, device='cpu')" || exit 1
  python3 benchmarks/keep_weights.py /tmp/m_mini/model.safetensors "$OUT/visual" --part visual ;;
train)
  python3 benchmarks/base_sweep_gpu.py "${PLAN:-.dev_gpu/plan.json}" 2>&1 | grep -v Warning | tail -20 ;;
*) echo "usage: $0 install|train" >&2; exit 2 ;;
esac
