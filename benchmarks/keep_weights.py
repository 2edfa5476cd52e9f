"""Pack part of a model's weights for the trip back from the GPU box: xz'd, cut into parts of at most 15 MiB (the size
of a file that comes back from a device call).

    python benchmarks/keep_weights.py MODEL/model.safetensors /tmp/keep/control-0.lm [--part lm] [--bf16] [--preset 1]
    python benchmarks/keep_weights.py /tmp/m_small/model.safetensors /tmp/keep/visual --part visual

writes PREFIX.xz.0, PREFIX.xz.1, ... `lm` keeps every tensor but the vision tower's (SFT and mid-training keep it
frozen, so the start model holds it), `visual` only the vision tower's. Join the parts in order and xz-decompress them
to get a safetensors file back.
"""

from __future__ import annotations

import argparse
import lzma
import tempfile
from pathlib import Path

PART_BYTES = 15 << 20


def pack(src: str, prefix: str, part: str = "lm", bf16: bool = False, preset: int = 1) -> int:
    """Write the parts; returns the compressed size."""
    from safetensors.torch import load_file, save_file

    sd = {k: v for k, v in load_file(src).items() if ("visual" in k) == (part == "visual")}
    if bf16:
        sd = {k: v.bfloat16() for k, v in sd.items()}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "part.safetensors"
        save_file(sd, str(path))
        blob = lzma.compress(path.read_bytes(), preset=preset)
    for i in range(0, len(blob), PART_BYTES):
        Path(f"{prefix}.xz.{i // PART_BYTES}").write_bytes(blob[i : i + PART_BYTES])
    return len(blob)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("prefix")
    ap.add_argument("--part", choices=("lm", "visual"), default="lm")
    ap.add_argument("--bf16", action="store_true", help="cast to bfloat16 first (weights trained in fp32)")
    ap.add_argument("--preset", type=int, default=1, help="xz preset (6: ~10%% smaller, several times slower)")
    a = ap.parse_args()
    print("kept", a.prefix, pack(a.src, a.prefix, a.part, a.bf16, a.preset))


if __name__ == "__main__":
    main()
