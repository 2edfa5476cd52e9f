"""benchmarks/keep_weights.py packs a model's LM and vision-tower weights into xz parts; assemble_weights.py rebuilds
the model folder here from them, tensor for tensor."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import assemble_weights  # noqa: E402
import keep_weights  # noqa: E402


def test_kept_parts_rebuild_the_trained_weights(tmp_path, monkeypatch):
    from safetensors.torch import load_file, save_file

    from training.models import init_model

    trained = tmp_path / "trained"
    init_model("qwen3-vl", "tiny", trained, seed=3)  # another seed than the local init's: every tensor must move
    sd = load_file(str(trained / "model.safetensors"))
    sd = {k: v + 0.5 if "visual" not in k else v for k, v in sd.items()}  # "trained" LM
    save_file(sd, str(trained / "model.safetensors"))
    monkeypatch.setattr(keep_weights, "PART_BYTES", 50_000)  # several parts
    keep_weights.pack(str(trained / "model.safetensors"), str(tmp_path / "m.lm"), "lm")
    keep_weights.pack(str(trained / "model.safetensors"), str(tmp_path / "visual"), "visual")
    assert len(list(tmp_path.glob("m.lm.xz.*"))) > 2
    out = tmp_path / "out"
    n = assemble_weights.assemble(out, str(tmp_path / "m.lm"), str(tmp_path / "visual"), size="tiny")
    got = load_file(str(out / "model.safetensors"))
    assert n == len(sd) == len(got)
    assert all(torch.equal(got[k], sd[k]) for k in sd)
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    last = max(tmp_path.glob("m.lm.xz.*"), key=lambda q: int(q.suffix[1:]))
    last.unlink()  # a lost last part: the join fails loudly instead of loading half a model
    with pytest.raises(SystemExit, match="last part missing"):
        assemble_weights.assemble(tmp_path / "out2", str(tmp_path / "m.lm"), str(tmp_path / "visual"), size="tiny")
    (tmp_path / "m.lm.xz.0").unlink()  # a gap in the numbering
    with pytest.raises(SystemExit, match="none missing"):
        assemble_weights.unpack(str(tmp_path / "m.lm"))
