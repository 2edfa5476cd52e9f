#!/bin/bash
# Session 27 (docs/LOG.md): bases trained twice as long (5,600 steps; session 26's recipe stops at 2,800) on the
# selected-flag corpus with prose search pages, one base per trainer seed, then M1's recipe on each. Build here:
# benchmarks/midtrain_corpus.py lakes A (6 kinds x 600 pages), B (synth/click + synth/search x 2,000, --seed-offset
# 600; only its click pages are used), SP (synth/search x 2,000, --seed-offset 600: half of them prose), HS and HSP
# (held out, --seed-offset 9850: click/tabs/search and search), and the teacher's curate exports teach/held
# (configs/flywheel8.yaml's bootstrap; 15 more seeds a task at selection.seed_offset 100). Tar them as
# A/B/SP/HS/HSP/teach/held.parquet, cut the tar into carry-sized data.tar.NN parts, copy the parts to /tmp/data on the
# warm box over several calls (the last part may ride with the first call of this script, in .dev_gpu/p/), then call
# this script until it prints "all": the training resumes from its newest saved step (every 400) when a call's
# TLIM ends it. With M1=1, once every base is done: the held-out synth proxy (skills_*.json), M1's recipe
# (mix_ablation control_task, 360 steps, seeds 0-2: m1_*.json) and the LM weights of each base's seed-0 M1 model
# xz'd into /tmp/keep, the bases' as L<seed>.lm (KEEP names those copied to $OUT). Env: STEPS (5600), SEEDS ("0 2"),
# TLIM (540 s a call), CORPUS (the exports the bases train on, FILE or FILE:TASK: "A B:synth/click SP"), HELD (the
# held-out synth sets: "HS HSP"), SIZE (the student preset: small). The corpus and the proxy are benchmarks/gpu_corpus.py.
exec > >(tee -a $OUT/log) 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OMP_NUM_THREADS=4
SEEDS=${SEEDS:-0 2}
SIZE=${SIZE:-small}
M0=/tmp/m_$SIZE
if ls .dev_gpu/p/* >/dev/null 2>&1; then for f in .dev_gpu/p/*; do cp "$f" /tmp/data/; done; fi
if [ ! -d $M0 ]; then
  python3 -c "from training.models import init_model; from pathlib import Path; init_model('qwen3-vl', '$SIZE', Path('$M0'), seed=0)" || exit 1
fi
if [ ! -f /tmp/ABP.parquet ]; then
  cd /tmp/data && cat data.tar.* | tar xf - && rm -f data.tar.* && cd - >/dev/null || exit 1
  src=(); for c in ${CORPUS:-A B:synth/click SP}; do f=/tmp/data/${c%%:*}.parquet; [[ $c == *:* ]] && f=$f:${c#*:}; src+=($f); done
  python3 benchmarks/gpu_corpus.py concat /tmp/ABP.parquet "${src[@]}" || exit 1
fi
train() {  # name seed
  [ -f /tmp/$1/sft_result.json ] && return 0
  timeout ${TLIM:-540} python3 -m training.sft --base $M0 --data /tmp/ABP.parquet --out /tmp/$1 --no-progress \
    --settings "{\"method\": \"full\", \"lr\": 0.001, \"batch_size\": 16, \"max_steps\": ${STEPS:-5600}, \"epochs\": 100, \"targets\": \"action\", \"save_every\": 400, \"seed\": $2}" >> /tmp/$1.log 2>&1
  echo "$1 rc=$? $(tail -1 /tmp/$1.log | cut -c1-200)"
}
t0=$(date +%s)
for s in $SEEDS; do train L$s $s & done
wait $(jobs -p)
echo "train phase $(( $(date +%s) - t0 )) s"
for s in $SEEDS; do [ -f /tmp/L$s/sft_result.json ] || exit 0; done
for s in $SEEDS; do python3 -c "import json; d=json.load(open('/tmp/L$s/sft_result.json')); print('L$s', d['final_loss'], d['resumed_from_step'], d['loss_curve'][::10])"; done
[ "$M1" = 1 ] || exit 0
for s in $SEEDS; do
  b=L$s
  ( python3 benchmarks/gpu_corpus.py skills /tmp/$b $OUT/skills_$b.json $(for h in ${HELD:-HS HSP}; do echo $h=/tmp/data/$h.parquet; done)
  python3 benchmarks/mix_ablation.py --train /tmp/data/teach.parquet --held /tmp/data/held.parquet --base /tmp/$b \
    --variants control_task --seeds 0,1,2 --parallel 3 --steps 360 --work /tmp/mix_$b --out $OUT/m1_$b.json > /dev/null 2>/tmp/$b.mix.log
  python3 -c "import json; d=json.load(open('$OUT/m1_$b.json')); print('$b m1', [r['macro_episode'] for r in d['runs']], d['summary']['control_task']['episode'])" ) &
done
wait $(jobs -p)
mkdir -p /tmp/keep
[ -f /tmp/keep/visual.xz.0 ] || python3 benchmarks/keep_weights.py $M0/model.safetensors /tmp/keep/visual --part visual
for s in $SEEDS; do
  python3 benchmarks/keep_weights.py /tmp/mix_L$s/control_task-0/model/model.safetensors /tmp/keep/m1L$s-0.lm --bf16 &
  python3 benchmarks/keep_weights.py /tmp/L$s/model.safetensors /tmp/keep/L$s.lm --bf16 &
done
wait $(jobs -p)
for k in ${KEEP:-}; do cp /tmp/keep/$k.lm.xz.* $OUT/; done
echo "all $(( $(date +%s) - t0 )) s"
