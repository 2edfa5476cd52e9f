#!/bin/bash
# Session 26 (docs/LOG.md): does 4x the synth/search pages in the base teach the reading check? One GPU call after
# the data is on the box. Build here: benchmarks/midtrain_corpus.py lakes A (6 kinds x 600 pages), B (synth/click +
# synth/search x 2,000, --seed-offset 600), C (synth/search x 7,250, --seed-offset 2600), HS (click/tabs/search x 150,
# --seed-offset 9850: held out), and the teacher's curate exports (configs/flywheel8.yaml's bootstrap, 20 seeds a task;
# 15 more at selection.seed_offset 100 for the held-out proxy). Tar the exports as A/B/C/HS/teach/held.parquet, cut the
# tar into carry-sized data.tar.NN parts and copy them to /tmp/data on the warm box over several calls, then run this.
# Per base (b3r = A+B, b4 = A+B+C; 2,800 steps each, in parallel; S3=<steps> adds b4l): the held-out synth proxy
# (skills_*.json), then M1's recipe (mix_ablation control_task, 360 steps, seeds 0-2: m1_*.json), and the LM weights
# of each M1 model and the init's vision tower xz'd into /tmp/keep (benchmarks/keep_weights.py) for later calls to
# bring back.
exec > >(tee -a $OUT/log) 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
cd /tmp/data && cat data.tar.* | tar xf - && ls -la /tmp/data && cd - >/dev/null || exit 1
mkdir -p /tmp/keep; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[ -d /tmp/m_small ] || python3 -c "from training.models import init_model; from pathlib import Path; init_model('qwen3-vl', 'small', Path('/tmp/m_small'), seed=0)" || exit 1
python3 benchmarks/gpu_corpus.py concat /tmp/AB.parquet /tmp/data/A.parquet /tmp/data/B.parquet || exit 1
python3 benchmarks/gpu_corpus.py concat /tmp/ABC.parquet /tmp/data/A.parquet /tmp/data/B.parquet /tmp/data/C.parquet || exit 1
chain() {  # name data steps
  local t0=$(date +%s)
  timeout ${TLIM:-430} python3 -m training.sft --base /tmp/m_small --data $2 --out /tmp/$1 --no-progress \
    --settings "{\"method\": \"full\", \"lr\": 0.001, \"batch_size\": 16, \"max_steps\": $3, \"epochs\": 100, \"targets\": \"action\", \"save_every\": 100000}" > /tmp/$1.log 2>&1
  echo "$1 trained rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/$1.log | cut -c1-300)"
  [ -f /tmp/$1/sft_result.json ] || return 1
  cp /tmp/$1/sft_result.json $OUT/sft_$1.json
  timeout 200 python3 benchmarks/gpu_corpus.py skills /tmp/$1 $OUT/skills_$1.json HS=/tmp/data/HS.parquet --max-rows ${SKMAX:-5000} \
    > /tmp/$1.sk.log 2>&1; echo "$1 skills rc=$? $(cat $OUT/skills_$1.json | tr -d ' \n' | cut -c1-400)"
  timeout 200 python3 benchmarks/mix_ablation.py --train /tmp/data/teach.parquet --held /tmp/data/held.parquet --base /tmp/$1 \
    --variants control_task --seeds 0,1,2 --parallel 3 --steps ${MSTEPS:-360} ${HELDMAX:+--held-max $HELDMAX} --work /tmp/mix_$1 --out $OUT/m1_$1.json > /dev/null 2>/tmp/$1.mix.log
  echo "$1 m1 rc=$? at $(( $(date +%s) - t0 )) s"
  for seed in 0 1 2; do
    m=/tmp/mix_$1/control_task-$seed/model/model.safetensors
    [ -f $m ] && python3 benchmarks/keep_weights.py $m /tmp/keep/$1-$seed.lm --bf16
  done
}
chain b3r /tmp/AB.parquet ${S1:-2800} &
P1=$!
chain b4 /tmp/ABC.parquet ${S2:-2800} &
P2=$!
if [ -n "$S3" ]; then chain b4l /tmp/ABC.parquet $S3 & P3=$!; fi
wait $P1 $P2 ${P3:-}
python3 benchmarks/keep_weights.py /tmp/m_small/model.safetensors /tmp/keep/visual --part visual
cp /tmp/keep/visual.xz.* /tmp/keep/b4-0.lm.xz.* $OUT/ 2>/dev/null
ls -la /tmp/keep $OUT
