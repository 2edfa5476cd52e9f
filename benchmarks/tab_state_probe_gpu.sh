#!/bin/bash
# Session 26 (docs/LOG.md): the same synth/search pages with and without the `selected` flag on the open tab
# (envs/miniwob_dom.py). Carry .dev_gpu/q with old.parquet / new.parquet (the synth/search rows of one corpus built
# before and after the flag: same seeds, so the same pages) and HSold / HSnew (held-out pages in both formats), with
# the start model at /tmp/start (any model folder; session 26: the M1 model of the b3r base, from
# benchmarks/midtrain_search_scale_gpu.sh). Both arms continue it for STEPS (800) optimizer steps at lr 3e-4, seed
# SEED, then benchmarks/search_probe_eval.py scores them on the held-out pages and on 300 of their train rows.
exec > >(tee -a $OUT/log) 2>&1
[ -d /tmp/site/pydantic ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev_wheels/pyd/*.whl || exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OMP_NUM_THREADS=4
D=${DIR:-.dev_gpu/q}
S=${SEED:-0}
arm() {  # name train held
  local t0=$(date +%s) m=/tmp/q_$1_s$S
  timeout 300 python3 -m training.sft --base /tmp/start --data $D/$2.parquet --out $m --no-progress --settings \
    "{\"method\": \"full\", \"lr\": 0.0003, \"batch_size\": 16, \"max_steps\": ${STEPS:-800}, \"epochs\": 1000, \"targets\": \"action\", \"save_every\": 100000, \"seed\": $S}" > $m.log 2>&1
  echo "$1 trained rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 $m.log | cut -c1-200)"
  python3 -c "import pyarrow.parquet as pq; pq.write_table(pq.read_table('$D/$2.parquet').slice(0, 300), '$m.tr.parquet')"
  python3 benchmarks/search_probe_eval.py $m $D/$3.parquet $1-held 2>/dev/null | tee $OUT/probe_$1_held_s$S.json
  python3 benchmarks/search_probe_eval.py $m $m.tr.parquet $1-train 2>/dev/null | tee $OUT/probe_$1_train_s$S.json
}
arm old old HSold &
A1=$!
arm new new HSnew &
A2=$!
wait $A1 $A2
