#!/bin/bash
# benchmarks/mix_ablation.py on the GPU box in one call (session 23). Carry .dev_wheels/pyd (pydantic + transformers
# >= 5.18 wheels) and .dev_gpu/mix: base/ (a model folder whose model.safetensors travels as model.safetensors.xz,
# xz -9: the 44.6 MB small base is 31.3 MB), train.parquet and held.parquet (curate exports). One seed at a time
# (SEEDS=0,1), its variants in parallel (PAR); each job's result streams to $OUT/runs.jsonl as it ends, so a call cut
# at its limit still returns them. After the first seed, the control's and the best other variant's language-model
# weights come back xz'd in <= 15 MB parts (KEEP=0 skips them; the vision tower is frozen, so the base has it).
# DIR=.dev_gpu/<name> picks another carried folder of the same shape (its base: any model folder, e.g. an SFT'd
# student to continue from); CONTROL names the variant kept as the control (default: control). SEEDS=0+1+2 runs
# those seeds' jobs together (PAR of them at once) instead of one seed after the other.
exec > >(tee -a $OUT/log) 2>&1
D=${DIR:-.dev_gpu/mix}
rm -rf /tmp/site; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev_wheels/pyd/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2
rm -rf /tmp/base && cp -r $D/base /tmp/base && python3 -c "
import lzma, shutil
with lzma.open('/tmp/base/model.safetensors.xz') as src, open('/tmp/base/model.safetensors', 'wb') as dst:
    shutil.copyfileobj(src, dst, 1 << 22)" && rm /tmp/base/model.safetensors.xz || exit 1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
cat > /tmp/keep.py <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from keep_weights import pack
runs = [json.loads(x) for x in open(os.environ["OUT"] + "/runs.jsonl") if x.strip()]
runs = [r for r in runs if "error" not in r and r["seed"] == int(sys.argv[1])]
control = os.environ.get("CONTROL", "control")
best = max((r for r in runs if r["variant"] != control), key=lambda r: r["macro_episode"])
for r in [x for x in runs if x["variant"] == control] + [best]:
    name = f"{r['variant']}-{r['seed']}"
    size = pack(f"/tmp/mix/{name}/model/model.safetensors", f"{os.environ['OUT']}/{name}.lm", preset=6)
    print("kept", name, size)
PY
first=1
SEEDS=${SEEDS:-0,1}
for seed in ${SEEDS//,/ }; do
  t0=$(date +%s)
  python3 benchmarks/mix_ablation.py --train $D/train.parquet --held $D/held.parquet --base /tmp/base \
    --variants ${VARIANTS:-control,control_task,all,task,task_half,answer} --seeds ${seed//+/,} --steps ${STEPS:-360} \
    --parallel ${PAR:-6} --work /tmp/mix --jsonl $OUT/runs.jsonl --out $OUT/mix_ablation_seed${seed//+/_}.json > /dev/null
  echo "seed $seed: rc=$? in $(( $(date +%s) - t0 )) s"
  if [ "$first" = 1 ] && [ "${KEEP:-1}" = 1 ]; then python3 /tmp/keep.py ${seed%%+*}; fi
  first=0
done
ls -la $OUT
