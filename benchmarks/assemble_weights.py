"""Rebuild a model folder here from the parts benchmarks/keep_weights.py wrote on the GPU box: a local random init of
the same size gives the folder (config, tokenizer, processor), and the kept LM and vision-tower tensors replace its
weights.

    python benchmarks/assemble_weights.py runs/s27/m1_L0 --lm back/m1L0-0.lm --visual back/visual [--size small]

`--lm` / `--visual` are the PREFIX given to keep_weights.py (PREFIX.xz.0, PREFIX.xz.1, ... are joined in order). Every
tensor of the init must be replaced, and nothing else may come: a mismatch names the first few keys and stops.
"""

from __future__ import annotations

import argparse
import glob
import lzma
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def unpack(prefix: str) -> dict:
    """The tensors of PREFIX.xz.0, PREFIX.xz.1, ... (joined in numeric order, xz-decompressed)."""
    from safetensors.torch import load

    numbered = sorted((int(p.rsplit(".", 1)[1]), p) for p in glob.glob(f"{glob.escape(prefix)}.xz.*"))
    if not numbered:
        raise SystemExit(f"no parts {prefix}.xz.N")
    numbers, parts = [n for n, _ in numbered], [p for _, p in numbered]
    if numbers != list(range(len(parts))):
        raise SystemExit(f"{prefix}.xz.N: parts {numbers}, expected 0..{len(parts) - 1} with none missing")
    try:
        return load(lzma.decompress(b"".join(Path(p).read_bytes() for p in parts)))
    except lzma.LZMAError as e:
        raise SystemExit(f"{prefix}.xz.0-{len(parts) - 1} do not decompress ({e}): is the last part missing?") from e


def assemble(out: Path, lm: str, visual: str, arch: str = "qwen3-vl", size: str = "small", seed: int = 0) -> int:
    from safetensors.torch import load_file, save_file

    from training.models import init_model

    with tempfile.TemporaryDirectory() as tmp:
        init = Path(tmp) / "init"
        init_model(arch, size, init, seed=seed)
        ref = load_file(str(init / "model.safetensors"))
        new = {**unpack(lm), **unpack(visual)}
        missing, extra = sorted(set(ref) - set(new)), sorted(set(new) - set(ref))
        if missing or extra:
            raise SystemExit(
                f"kept tensors do not match a {arch} {size} init: missing {missing[:5]}, extra {extra[:5]}"
            )
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(init, out)
    save_file({k: v.to(ref[k].dtype).contiguous() for k, v in new.items()}, str(out / "model.safetensors"))
    return len(new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--lm", required=True, help="keep_weights.py prefix of the LM part")
    ap.add_argument("--visual", required=True, help="keep_weights.py prefix of the vision tower")
    ap.add_argument("--arch", default="qwen3-vl")
    ap.add_argument("--size", default="small")
    ap.add_argument("--seed", type=int, default=0, help="seed of the local init (its weights are all replaced)")
    a = ap.parse_args()
    print("assembled", a.out, assemble(a.out, a.lm, a.visual, a.arch, a.size, a.seed), "tensors")


if __name__ == "__main__":
    main()
