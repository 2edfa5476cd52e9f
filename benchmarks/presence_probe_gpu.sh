#!/usr/bin/env bash
# Can the student's architecture learn click-tab-2's presence check ("is the link X on this tab?") at all, from
# unlimited fresh samples or from a click-tab-2-sized pool, and does size matter? benchmarks/copy_probe.py
# --kind presence, random init, text only, several runs in parallel on one GPU (session 48).
#   1. model folders (config + tokenizer; the probe re-initialises the weights), e.g.
#        for s in mini small medium; do .venv/bin/flywheel model init --size $s --out runs/pm/$s; done
#   2. device run, carrying .dev_wheels/min (pydantic for agents.actions) and the folders:
#        bash benchmarks/presence_probe_gpu.sh runs/pm
# Writes $OUT/presence_<size>_<variant>.json (the probe's JSON) and the logs beside them.
set -u
PM=${1:?model folders}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
[ -d /tmp/site/pydantic ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .dev_wheels/min/*.whl || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=${STEPS:-3000}
run() {  # size variant extra-args...
  local size=$1 variant=$2; shift 2
  timeout 560 python3 benchmarks/copy_probe.py --kind presence --model-config "$PM/$size" --device cuda \
    --steps "$STEPS" --batch 32 --eval-every 500 --json "$OUT/presence_${size}_${variant}.json" "$@" \
    > /dev/null 2> "$OUT/presence_${size}_${variant}.log" &
}
run mini fresh_s0 --seed 0
run mini fresh_s1 --seed 1
run mini pool300_s0 --seed 0 --pool 300
run small fresh_s0 --seed 0
run medium fresh_s0 --seed 0 --lr 3e-4
wait
for f in "$OUT"/presence_*.log; do echo "== $f"; tail -n 2 "$f"; done
