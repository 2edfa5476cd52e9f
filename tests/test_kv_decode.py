"""The lean KV-cached decode loop (agents/backends/kv_decode.py) against transformers `generate`.

The loop replaces HF's per-token path for speed, so it must give the same tokens and logprobs:
greedy outputs equal token for token, on both model families, with left padding (prompts of
different lengths in one batch); seeded sampling is reproducible; `reload` swaps weights in place.
"""

from __future__ import annotations

import pytest
import torch
from synthetic import png_pool

from agents.backends.base import Sampling
from agents.backends.hf import HFBackend
from agents.backends.kv_decode import LeanDecoder, sample, supports
from agents.prompts import PromptOptions, build_prompt, transform_for


def _prompts(arch: str, n: int):
    t = transform_for(arch, 160, 210)
    shots = png_pool(n, seed=3)
    # different DOM lengths -> different prompt lengths -> real left padding in the batch
    return [
        build_prompt(
            f"Click button {i}.", shots[i], 'button "OK" @ (80,120) [40x20]\n' * (1 + 3 * i), [], PromptOptions(), t
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module", params=["qwen3-vl", "qwen2.5-vl"])
def built(request, tmp_path_factory):
    from training.models import init_model

    torch.manual_seed(0)
    path = init_model(request.param, "tiny", tmp_path_factory.mktemp("m") / request.param, seed=1)
    return request.param, path, HFBackend(str(path), lean=False)


def test_greedy_tokens_and_logprobs_equal_hf_generate(built):
    arch, _, be = built
    assert supports(be.model)
    inputs = be.encode(_prompts(arch, 3))
    assert (inputs["attention_mask"] == 0).any(), "the batch must be left-padded for this test to mean anything"
    stop = be._stop_ids(Sampling())
    ref_ids, ref_lp = be._hf_generate(inputs, Sampling(temperature=0.0, max_new_tokens=24), stop)
    out = LeanDecoder(be.model).generate(inputs, max_new_tokens=24, stop_ids=stop, pad_id=be.tok.pad_token_id)
    for b in range(3):
        n = int(out.lengths[b])
        assert out.tokens[b, :n].tolist() == ref_ids[b, :n].tolist()
        assert torch.allclose(out.logprobs[b, :n], ref_lp[b, :n], atol=1e-4)


def test_backend_lean_path_seeded_and_matches_teacher_forcing(built):
    arch, path, _ = built
    be = HFBackend(str(path))  # lean on
    assert be._lean is not None
    s = Sampling(temperature=1.0, max_new_tokens=16, seed=7)
    a, b = be.generate(_prompts(arch, 2), s), be.generate(_prompts(arch, 2), s)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    # the stored logprobs are the model's own: a teacher-forced forward over prompt + response agrees
    p = _prompts(arch, 1)
    g = be.generate(p, s)[0]
    inputs = be.encode(p)
    ids = torch.cat([inputs["input_ids"], torch.tensor([g.token_ids])], dim=1)
    extra = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if "mm_token_type_ids" in inputs:  # response tokens are text (type 0)
        extra["mm_token_type_ids"] = torch.cat(
            [inputs["mm_token_type_ids"], torch.zeros(1, len(g.token_ids), dtype=inputs["mm_token_type_ids"].dtype)],
            dim=1,
        )
    with torch.inference_mode():
        logits = be.model(**{**inputs, **extra}).logits.float()
    L = inputs["input_ids"].shape[1]
    lp = torch.log_softmax(logits[0, L - 1 : -1], -1).gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
    assert torch.allclose(lp, torch.tensor(g.logprobs), atol=1e-4)


def test_reload_swaps_weights_in_place(built, tmp_path):
    arch, path, _ = built
    from training.models import init_model

    other = init_model(arch, "tiny", tmp_path / "other", seed=5)
    be = HFBackend(str(path))
    s = Sampling(temperature=0.0, max_new_tokens=12)
    before = be.generate(_prompts(arch, 1), s)[0].logprobs
    be.reload(str(other))
    after = be.generate(_prompts(arch, 1), s)[0].logprobs
    fresh = HFBackend(str(other)).generate(_prompts(arch, 1), s)[0].logprobs
    assert before != after
    assert after == pytest.approx(fresh, abs=1e-5)


def test_top_p_keeps_only_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)
    draws = {int(sample(logits, 1.0, 0.7, g)) for _ in range(200)}
    assert draws == {0, 1}  # 0.5 + 0.3 covers 0.7; the tail is never drawn
    assert int(sample(logits, 0.0, 1.0, None)) == 0
