"""On a GPU box without the lake: mid-train the student on a synthetic-page corpus export for N steps, then the main
job's SFT from it, in fp32 (the 2-core CPU's arithmetic), and pack each final model's LM tensors to bring back.

    python benchmarks/base_sweep_gpu.py PLAN.json      # $OUT: <name>.lm.xz.N parts + report.json

PLAN.json: {"init": random-init model folder, "corpus": midtrain export (benchmarks/midtrain_corpus.py),
"sft_data": the main job's curated export, "base_settings" / "sft_settings": TrainSettings fields
(configs/local.yaml's midtrain.sft and sft), "variants": [{"name", "base_steps" (0 = no base), "base_over",
"sft_over", and optionally "corpus" / "sft_data" (other exports), "base_of" (start the SFT from an earlier variant's
base instead of training one), "base_only": true (bring back the base itself, no SFT: a flywheel experiment's
start; benchmarks/base_mini_gpu.sh), "autocast": "bf16" (both trainings' forward under torch.autocast,
benchmarks/_bf16.py; set "fused_kernels": false in both overrides, the CUDA kernels take one dtype)}]}.
Rebuild each model here with benchmarks/assemble_weights.py (--size of the init, --visual from the init: the vision
tower stays frozen) and evaluate it with `flywheel stage evaluate --checkpoint`. Sweeps:
docs/bench_mainjob_base_s32.json, docs/bench_mainjob_s33.json, docs/bench_mainjob_s34.json.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bf16 import patch_loss_autocast  # noqa: E402

KEEP = ("steps", "final_loss", "first_loss", "wall_s", "device", "dtype")


def main() -> None:
    import training.models as tm

    resolve = tm._resolve

    def fp32(dtype, device):  # CUDA's "auto" is bf16; the CPU trains in fp32
        return resolve("float32" if dtype == "auto" else dtype, device)

    tm._resolve = fp32
    import torch

    from training.sft import TrainSettings, train

    set_autocast = patch_loss_autocast()

    plan = json.loads(Path(sys.argv[1]).read_text())
    out, work = Path(os.environ.get("OUT", "sweep-out")), Path("/tmp/base_sweep")
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(exist_ok=True)
    report = {}
    for v in plan["variants"]:
        name, t0, start, rec = v["name"], time.time(), plan["init"], {}
        set_autocast({"bf16": torch.bfloat16, None: None}[v.get("autocast")])
        if v.get("base_of"):
            start = str(work / f"{v['base_of']}-base")
        elif v["base_steps"]:
            s = TrainSettings(**{**plan["base_settings"], "max_steps": v["base_steps"], **v.get("base_over", {})})
            m = train(start, v.get("corpus", plan["corpus"]), work / f"{name}-base", s, progress=False)
            rec["base"], start = {k: m[k] for k in KEEP}, str(work / f"{name}-base")
        if v.get("base_only"):
            weights = Path(start) / "model.safetensors"
        else:
            s = TrainSettings(**{**plan["sft_settings"], **v.get("sft_over", {})})
            m = train(start, v.get("sft_data", plan["sft_data"]), work / f"{name}-sft", s, progress=False)
            rec["sft"] = {k: m[k] for k in KEEP}
            weights = work / f"{name}-sft" / "model.safetensors"
        keep = Path(__file__).with_name("keep_weights.py")
        subprocess.run([sys.executable, str(keep), str(weights), str(out / f"{name}.lm")], check=True)
        rec["total_s"] = round(time.time() - t0, 1)
        report[name] = rec
        print(name, json.dumps(rec), flush=True)
        (out / "report.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":  # the CUDA encode workers are spawned: they re-import this module
    main()
