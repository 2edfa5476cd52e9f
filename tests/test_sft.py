"""SFT on a tiny real Qwen3-VL over a dataset curated from real scripted-teacher rollouts: assistant-only labels,
learning, LoRA/full parameter scopes, the accumulation invariant, SIGKILL + resume, and the stage's idempotence."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agents.parsing import parse_response
from configs.loading import load_config
from flywheel.runtime.rollout import PolicySpec, RolloutSpec, make_jobs, run_rollouts
from storage.catalog import connect
from training.data import IGNORE_INDEX, SFTCollator, prompt_options, retarget_sample, with_images
from training.losses import token_loss_sum
from training.models import LoraSpec, freeze_vision, is_lora_param, load_model
from training.sft import (
    EncodedSamples,
    TrainSettings,
    TrainState,
    fit_budget,
    lr_factor,
    read_samples,
    train,
    train_step,
)

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[1]
# small, fast settings: tiny model, no warmup to wait through, a few steps
FAST = dict(
    lr=1e-2,
    batch_size=2,
    grad_accum=1,
    lora_r=8,
    lora_alpha=16,
    lora_dropout=0.0,
    warmup_ratio=0.0,
    save_every=2,
    epochs=1.0,
)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    from flywheel.stages import curate
    from training.models import init_model

    base = tmp_path_factory.mktemp("sft")
    tiny = init_model("qwen3-vl", "tiny", base / "tiny", seed=0)
    lake = base / "lake"
    # enter-text gives 3-step episodes (history in the prompt); the others one step each
    jobs = make_jobs("boot", ["click-test", "focus-text", "enter-text"], [0, 1, 2], policy_tag="scripted:0")
    run_rollouts(
        RolloutSpec(
            run_key="boot",
            iteration=0,
            stage="bootstrap",
            lake_root=str(lake),
            jobs=jobs,
            policy=PolicySpec("scripted"),
            max_steps=6,
            episode_timeout_s=60,
            n_envs=2,
        ),
        progress=False,
    )
    cfg = load_config(
        ROOT / "configs" / "tiny.yaml",
        {
            "lake.root": str(lake),
            "student.model": str(tiny),
            "sft.output_root": str(base / "ckpt"),
            **{f"sft.{k}": v for k, v in FAST.items()},
            "sft.max_steps": 3,
        },
    )
    res = curate(cfg, 0)
    assert res["n_steps"] == 15  # 3 seeds x (1 + 1 + 3) steps
    return {"tiny": tiny, "cfg": cfg, "data": res["data_files"], "dataset_id": res["dataset_id"], "tmp": base}


def test_labels_are_exactly_the_assistant_tokens(env):
    _, proc = load_model(env["tiny"])
    rows = read_samples(env["data"])
    rows = [r for r in rows if len(r["messages"][1]["content"]) > 3][:1] + rows[:2]  # one with history, mixed lengths
    batch = SFTCollator(proc)(rows)
    tok = proc.tokenizer
    pad_img = tok.convert_tokens_to_ids("<|image_pad|>")
    for i, r in enumerate(rows):
        labelled = batch["labels"][i][batch["labels"][i] != IGNORE_INDEX].tolist()
        target = r["messages"][-1]["content"][0]["text"]
        assert labelled == tok(target + "<|im_end|>")["input_ids"]  # the reply and its stop token, nothing else
        assert pad_img not in labelled
        assert (batch["labels"][i][batch["attention_mask"][i] == 0] == IGNORE_INDEX).all()
    assert batch["pixel_values"].shape[0] > 0 and batch["image_grid_thw"].shape[0] == len(rows)
    assert "mm_token_type_ids" in batch


def test_per_sample_encoding_pads_to_the_processors_batch(env):
    """The cached per-sample path (encode once, pad per batch) gives the tensors of one batched processor call."""
    _, proc = load_model(env["tiny"])
    rows = read_samples(env["data"])
    rows = [r for r in rows if len(r["messages"][1]["content"]) > 3][:1] + rows[:3]  # mixed lengths
    convs = [with_images(r["messages"], r["images"]) for r in rows]
    ref = proc.apply_chat_template(
        convs,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        processor_kwargs={"padding": True, "padding_side": "right"},
    )
    cached = EncodedSamples(rows, SFTCollator(proc))
    first = cached.batch([0, 1, 2, 3])
    again = cached.batch([0, 1, 2, 3])
    assert len(cached.cache) == 4 and cached.bytes > 0
    for key in ref:
        assert torch.equal(first[key], ref[key]), key
        assert torch.equal(again[key], first[key]), key
    assert set(first) == set(ref) | {"labels"}
    none_kept = EncodedSamples(rows, SFTCollator(proc), max_bytes=0)  # over budget: encoded on every use
    assert torch.equal(none_kept.batch([2, 0])["labels"], cached.batch([2, 0])["labels"]) and not none_kept.cache


def test_lengths_without_encoding_and_the_prefetch_thread(env):
    """SFTCollator.length counts the tokens encode() gives without the image processor (screenshots of two sizes,
    samples with 1-2 images); Prefetch fills the cache from its worker processes with the same tensors, and an
    encoding error reaches the caller."""
    import io

    from PIL import Image

    from training.samples import Prefetch

    _, proc = load_model(env["tiny"])
    rows = read_samples(env["data"])
    big = dict(rows[1], images=[])
    for im in rows[1]["images"]:
        buf = io.BytesIO()
        Image.open(io.BytesIO(im["bytes"])).resize((320, 180)).save(buf, format="PNG")
        big["images"].append({**im, "bytes": buf.getvalue()})
    rows = rows[:6] + [big]
    col = SFTCollator(proc)
    assert {len(r["images"]) for r in rows} >= {1}
    for r in rows:
        assert col.length(r) == col.encode(r)["input_ids"].shape[1]
    samples = EncodedSamples(rows, col)
    assert [samples.length(i) for i in range(len(rows))] and not samples.cache  # lengths encode nothing
    ahead = Prefetch(samples, workers=2)  # spawned processes
    ahead.start([0, 3, 6, 2, 5])
    ahead.ready()
    assert sorted(samples.cache) == [0, 2, 3, 5, 6]
    for i in (0, 6):  # the workers' encodings equal the main collator's
        assert all(torch.equal(samples.cache[i][k], v) for k, v in col.encode(rows[i]).items())
    # past the cache bound an encoding serves its step once from the spill, then is dropped
    small = EncodedSamples(rows, col, max_bytes=1)
    ahead.samples = small
    ahead.start([1, 4])
    ahead.ready()
    assert not small.cache and sorted(small.spill) == [1, 4]
    spilled = small.spill[4]
    assert small.get(4) is spilled and 4 not in small.spill and small.get(4) is not spilled
    ahead.start([1])
    ahead.ready()
    assert sorted(small.spill) == [1]  # a new step's spill replaces the last
    broken = EncodedSamples([dict(rows[0], images=[])], col)
    ahead.samples = broken
    ahead.start([0])
    with pytest.raises(ValueError, match="image items"):
        ahead.ready()
    ahead.close()


def test_shorter_targets_label_only_what_is_kept(env):
    _, proc = load_model(env["tiny"])
    row = read_samples(env["data"])[0]
    for r in read_samples(env["data"]):  # sft.hint_fraction numbers a hint by step_idx: it is the prompt's step
        prompt = "".join(c.get("text") or "" for m in r["messages"] if m["role"] == "user" for c in m["content"])
        assert r["step_idx"] == prompt.count("\nStep "), prompt
    full = row["messages"][-1]["content"][0]["text"]
    assert full.startswith("<thinking>") and "Action:" in full
    tok = proc.tokenizer
    for fmt, expect in (("action", full[full.index("Action:") :]), ("tool_call", full[full.index("<tool_call>") :])):
        sample = retarget_sample(row, fmt)
        assert sample["messages"][:-1] == row["messages"][:-1]  # the prompt is untouched
        labels = SFTCollator(proc)([sample])["labels"][0]
        assert labels[labels != IGNORE_INDEX].tolist() == tok(expect + "<|im_end|>")["input_ids"]
        assert parse_response(expect).action is not None  # what the student learns to write still parses
    assert retarget_sample(row, "full") is row
    with pytest.raises(ValueError, match="targets must be one of"):
        TrainSettings(targets="short")


def test_lora_learns_and_changes_only_adapters(env, tmp_path):
    # merge off: merge_and_unload would fold the adapters into this model object (the stage test covers merging)
    s = TrainSettings(**{**FAST, "epochs": 4.0, "batch_size": 5, "lr": 5e-2, "merge": False})  # 12 steps
    model, proc = load_model(env["tiny"], lora=LoraSpec(r=s.lora_r, alpha=s.lora_alpha, dropout=0.0))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    m = train(env["tiny"], env["data"], tmp_path / "out", s, progress=False, model_and_processor=(model, proc))
    # a random-init model's frozen final norm and tiny tied embeddings cap how peaked LoRA can make the
    # output (measured: 6.38 -> 6.12), so the bar is a clear drop, not a large one; full FT below drops far more
    assert m["steps"] == 12 and m["final_loss"] < m["first_loss"] - 0.15, m["loss_curve"]
    changed = {n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())}
    assert changed and all(is_lora_param(n) and ".visual." not in n for n in changed)
    assert m["tokens_per_s"] > 0 and m["target_tokens"] > 0 and m["adapter"] is True and m["merged_path"] is None
    # the adapter folder (processor beside it) loads back with the trained weights
    out = tmp_path / "out"
    assert (out / "adapter_config.json").exists() and (out / "tokenizer_config.json").exists()
    ad, proc2 = load_model(out)
    batch = SFTCollator(proc2)(read_samples(env["data"])[:2])
    batch.pop("labels")
    model.eval()
    with torch.no_grad():
        assert torch.allclose(ad(**batch).logits, model(**batch).logits, atol=1e-5)
    assert not (out / "state").exists()  # resumable state is dropped once the run is complete


def test_full_finetune_learns_and_keeps_vision_frozen(env, tmp_path):
    s = TrainSettings(**{**FAST, "method": "full", "epochs": 4.0, "batch_size": 5})  # 12 steps
    model, proc = load_model(env["tiny"])
    freeze_vision(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    m = train(env["tiny"], env["data"], tmp_path / "full", s, progress=False, model_and_processor=(model, proc))
    assert m["final_loss"] < 0.75 * m["first_loss"], m["loss_curve"]  # measured 6.38 -> 4.0
    changed = {n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())}
    assert changed and not any(".visual." in n for n in changed) and any("embed_tokens" in n for n in changed)
    assert m["adapter"] is False and m["merged_path"] is None
    reloaded, _ = load_model(tmp_path / "full")
    assert torch.equal(
        dict(reloaded.named_parameters())["model.language_model.norm.weight"],
        dict(model.named_parameters())["model.language_model.norm.weight"],
    )


def test_grad_accum_invariant(env):
    """batch 1 x accum 4 gives the same gradient (so the same update) as batch 4 x accum 1."""
    rows = read_samples(env["data"])
    idx = [0, 5, 9, 14]  # different lengths and target sizes
    grads, losses = [], []
    for bs, acc in ((1, 4), (4, 1)):
        model, proc = load_model(env["tiny"])
        model.train()
        loss, n_target, _ = train_step(
            model,
            EncodedSamples(rows, SFTCollator(proc)),
            idx,
            TrainSettings(batch_size=bs, grad_accum=acc),
            torch.device("cpu"),
        )
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        losses.append(loss)
    assert abs(losses[0] - losses[1]) < 1e-5
    for n, g in grads[1].items():
        assert torch.allclose(grads[0][n], g, atol=1e-6, rtol=1e-4), n
    # HF-style normalisation (mean per micro-batch, then averaged) gives a different gradient on these rows,
    # so the comparison above can tell the two apart
    model, proc = load_model(env["tiny"])
    model.train()
    for i in idx:
        b = SFTCollator(proc)([rows[i]])
        labels = b.pop("labels")
        loss_sum, n = token_loss_sum(model(**b).logits, labels)
        (loss_sum / n / len(idx)).backward()
    naive = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert not all(torch.allclose(naive[n], g, atol=1e-6, rtol=1e-4) for n, g in grads[1].items())


def test_micro_batch_sorts_the_step_by_length_and_keeps_its_gradient(env):
    """sft.micro_batch: the step's samples run length-sorted, micro_batch rows a forward (neighbours in length share
    the padding), and the update is the one batch_size rows in one forward give."""
    rows = read_samples(env["data"])
    idx = [0, 5, 9, 14]

    class Recorded(EncodedSamples):
        def batch(self, ids, *a, **k):
            calls.append(list(ids))
            return super().batch(ids, *a, **k)

    grads, losses = [], []
    for micro in (None, 2):
        calls: list[list[int]] = []
        model, proc = load_model(env["tiny"])
        model.train()
        samples = Recorded(rows, SFTCollator(proc))
        s = TrainSettings(batch_size=4, micro_batch=micro)
        loss, _, _ = train_step(model, samples, idx, s, torch.device("cpu"))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        losses.append(loss)
    ordered = sorted(idx, key=samples.length)
    assert len({samples.length(i) for i in idx}) > 2 and ordered != idx  # the order has to change for the check
    assert calls == [ordered[:2], ordered[2:]]
    assert abs(losses[0] - losses[1]) < 1e-5
    for n, g in grads[0].items():
        assert torch.allclose(grads[1][n], g, atol=1e-6, rtol=1e-4), n


def _packed_per_sample_losses(model, batch: dict, labels) -> list[float]:
    """Each sample's summed target loss, read off one forward of the packed row (segments from cu_seq_lens_q)."""
    from training.losses import _backbone_and_head
    from training.packing import VARLEN_KEYS

    backbone, head = _backbone_and_head(model)
    bounds = batch["cu_seq_lens_q"].tolist()
    fwd = {k: v for k, v in batch.items() if k not in VARLEN_KEYS}
    hidden = backbone(**fwd).last_hidden_state[0]
    out = []
    for a, b in zip(bounds, bounds[1:]):
        lab = labels[0, a + 1 : b]
        sel = lab != IGNORE_INDEX
        logits = head(hidden[a : b - 1][sel]).float()
        out.append(float(torch.nn.functional.cross_entropy(logits, lab[sel], reduction="sum")))
    return out


def test_packed_loss_equals_each_sample_alone(env):
    """sft.packing: samples packed into one row (SDPA, the block-diagonal mask transformers builds from the position
    restarts) score exactly as each sample alone, unpadded, sample by sample. Two broken packings fail the same check:
    text positions that do not restart (no isolation: later samples attend to earlier ones) and plain 1-D positions
    in place of each sample's multimodal RoPE (what a text-only packing collator gives). A constant shift of a
    sample's positions would not show (RoPE is relative), so the sample's own positions are what is checked."""
    from training.losses import labelled_token_loss
    from training.packing import rope_positions_fn

    model, proc = load_model(env["tiny"])
    model.eval()
    rows = read_samples(env["data"])
    rows = [r for r in rows if len(r["messages"][1]["content"]) > 3][:2] + rows[:2]  # with history, mixed lengths
    samples = EncodedSamples(rows, SFTCollator(proc), positions=rope_positions_fn(model))
    with torch.no_grad():
        alone = []
        for i in range(len(rows)):
            b = samples.batch([i])
            labels = b.pop("labels")
            assert b["attention_mask"].all()  # one sample: no padding
            alone.append(float(labelled_token_loss(model, b, labels)[0]))
        packed = samples.packed(list(range(len(rows))))
        labels = packed.pop("labels")
        assert "attention_mask" not in packed and packed["position_ids"].shape[0] == 4
        got = _packed_per_sample_losses(model, packed, labels)
        assert got == pytest.approx(alone, rel=2e-6)
        total, n = labelled_token_loss(
            model, {k: v for k, v in packed.items() if not k.startswith(("cu_", "max_"))}, labels
        )
        assert n == sum(int((samples.batch([i])["labels"][:, 1:] != IGNORE_INDEX).sum()) for i in range(len(rows)))
        assert float(total) == pytest.approx(sum(alone), rel=2e-6)

        leaky = dict(packed, position_ids=packed["position_ids"].clone())
        leaky["position_ids"][0] = torch.arange(leaky["position_ids"].shape[-1])  # no restarts
        bad = _packed_per_sample_losses(model, leaky, labels)
        assert bad[0] == pytest.approx(alone[0], rel=2e-6)  # the first sample sees nothing before it either way
        assert any(abs(b - a) > 1e-5 * abs(a) for a, b in zip(alone[1:], bad[1:]))

        flat = dict(packed, position_ids=packed["position_ids"][:1].expand(4, -1, -1).clone())  # 1-D positions only
        bad = _packed_per_sample_losses(model, flat, labels)
        assert all(abs(b - a) > 1e-5 * abs(a) for a, b in zip(alone, bad))  # every sample has a screenshot


def test_packed_step_matches_padded_step(env):
    """A training step with sft.packing (one packed row) gives the padded step's loss, target count and gradients."""
    rows = read_samples(env["data"])
    idx = [0, 5, 9, 14]  # different lengths and target sizes
    grads, losses, targets = [], [], []
    for packing in (False, True):
        model, proc = load_model(env["tiny"])
        model.train()
        s = TrainSettings(batch_size=2, grad_accum=2, lora_dropout=0.0, packing=packing, pack_tokens=100_000)
        from training.packing import rope_positions_fn

        samples = EncodedSamples(rows, SFTCollator(proc), positions=rope_positions_fn(model) if packing else None)
        loss, n_target, _ = train_step(model, samples, idx, s, torch.device("cpu"))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        losses.append(loss)
        targets.append(n_target)
    assert targets[0] == targets[1]
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    for n, g in grads[0].items():
        assert torch.allclose(grads[1][n], g, atol=1e-6, rtol=1e-3), n


@pytest.mark.parametrize("packing", [False, True])
def test_vision_cache_reuses_the_frozen_towers_outputs(env, packing):
    """sft.vision_cache: the first step runs the frozen vision tower and keeps each sample's image features in place
    of its pixel_values; the second step on the same samples runs no tower at all and gives the loss and gradients
    of a model that runs the tower every step."""
    from training.packing import rope_positions_fn
    from training.vision_cache import VisionFeatures

    rows = read_samples(env["data"])
    idx = [0, 5, 9, 14]  # different lengths and target sizes
    s = TrainSettings(batch_size=2, grad_accum=2, lora_dropout=0.0, packing=packing, pack_tokens=100_000)
    runs = []
    for cache in (False, True):
        model, proc = load_model(env["tiny"])
        freeze_vision(model)
        model.train()
        samples = EncodedSamples(rows, SFTCollator(proc), positions=rope_positions_fn(model) if packing else None)
        assert VisionFeatures.supported(model)
        samples.vision = VisionFeatures(model, samples) if cache else None
        calls = []
        model.model.visual.register_forward_hook(lambda *_: calls.append(1))
        losses, tower = [], []
        for _ in range(2):
            losses.append(train_step(model, samples, idx, s, torch.device("cpu"))[0])
            tower.append(len(calls))
        runs.append(
            (losses, tower, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, samples)
        )
    (plain, plain_tower, plain_grads, _), (cached, tower, grads, samples) = runs
    assert plain_tower[1] == 2 * plain_tower[0] > 0  # without the cache the tower runs every step
    assert tower[1] == tower[0] > 0  # with it, not at all on the second step
    assert set(samples.vision.stored) == set(idx) and not any("pixel_values" in samples.cache[i] for i in idx)
    assert cached == pytest.approx(plain, rel=1e-5)
    for n, g in plain_grads.items():
        assert torch.allclose(grads[n], g, atol=1e-6, rtol=1e-3), n
    trainable = load_model(env["tiny"])[0]  # a trainable tower: its outputs change with training, no cache
    assert not VisionFeatures.supported(trainable)
    freeze_vision(trainable)  # past the cache's bound nothing is kept: the tower runs each time, as without it
    unkept = EncodedSamples(
        rows, SFTCollator(proc), max_bytes=0, positions=rope_positions_fn(trainable) if packing else None
    )
    unkept.vision = VisionFeatures(trainable, unkept)
    train_step(trainable, unkept, idx, s, torch.device("cpu"))
    assert unkept.vision.tower_calls > 0 and not unkept.vision.stored


def test_pixel_dtype_cache_bound_and_linear_patch_embed(env):
    """pixel_values kept in the vision tower's dtype (bf16 on CUDA: half the bytes of fp32, the values the tower
    casts to anyway); sft.encode_cache_gib is checked; the patch embedding as one matrix product equals the Conv3d."""
    from training.kernels import linear_patch_embed

    model, proc = load_model(env["tiny"])
    rows = read_samples(env["data"])[:2]
    fp32 = EncodedSamples(rows, SFTCollator(proc))
    half = EncodedSamples(rows, SFTCollator(proc), pixel_dtype=torch.bfloat16)
    a, b = fp32.batch([0, 1]), half.batch([0, 1])
    assert b["pixel_values"].dtype == torch.bfloat16 and torch.equal(b["pixel_values"], a["pixel_values"].bfloat16())
    assert torch.equal(a["input_ids"], b["input_ids"]) and half.bytes < fp32.bytes
    with pytest.raises(ValueError, match="encode_cache_gib"):
        TrainSettings(encode_cache_gib=-1)
    visual = model.model.visual
    x = a["pixel_values"]
    with torch.no_grad():
        conv = visual.patch_embed(x)
        assert linear_patch_embed(model)
        lin = visual.patch_embed(x)
    assert "forward" in visual.patch_embed.__dict__
    assert torch.allclose(lin, conv, rtol=1e-5, atol=1e-5)


def test_pack_plan_and_bad_settings():
    from training.packing import plan_packs

    packs = plan_packs([900, 300, 700, 1200, 100], max_tokens=1000)
    assert sorted(i for p in packs for i in p) == [0, 1, 2, 3, 4]  # every sample once
    assert [3] in packs  # longer than a pack: alone
    assert all(sum([900, 300, 700, 1200, 100][i] for i in p) <= 1000 for p in packs if p != [3])
    assert len(packs) == 3
    with pytest.raises(ValueError, match="pack_tokens"):
        TrainSettings(packing=True, pack_tokens=0)


def _sft_cmd(env, out: Path, settings: dict) -> list[str]:
    return [
        sys.executable,
        "-m",
        "training.sft",
        "--base",
        str(env["tiny"]),
        "--data",
        env["data"],
        "--out",
        str(out),
        "--settings",
        json.dumps(settings),
        "--no-progress",
        "--threads",
        "1",
    ]


@pytest.mark.parametrize("ddp", [False, True], ids=["one-process", "ddp-2-processes"])
def test_sigkill_then_resume_matches_uninterrupted(env, tmp_path, ddp):
    # 2 epochs (15 steps) capped at 10; dropout on, so the RNG state must resume too. With ddp, the kill takes
    # torchrun and both ranks down, and the rerun's ranks resume from the state rank 0 saved
    settings = {
        **FAST,
        "epochs": 2.0,
        "lora_dropout": 0.1,
        "max_steps": 10,
        "keep_state": True,
        **({"distributed": "ddp", "nproc": 2} if ddp else {}),
    }
    killed = tmp_path / "killed"
    p = subprocess.Popen(
        _sft_cmd(env, killed, {**settings, "step_sleep_s": 0.4}),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (killed / "state" / "step-0000004").exists():
            assert p.poll() is None and time.monotonic() < deadline, (
                p.stderr.read().decode()[-2000:] if p.poll() else "slow"
            )
            time.sleep(0.05)
        os.killpg(p.pid, signal.SIGKILL)
    finally:
        p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL and not (killed / "sft_result.json").exists()
    r = subprocess.run(_sft_cmd(env, killed, settings), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-6000:]
    straight = tmp_path / "straight"
    r2 = subprocess.run(_sft_cmd(env, straight, settings), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r2.returncode == 0, r2.stderr[-6000:]  # long: under DDP the workers' error is inside the launcher's
    a, b = (json.loads((d / "sft_result.json").read_text()) for d in (killed, straight))
    # < 10: the kill stopped the training (torchrun's ranks, in sessions of their own, die with their agent)
    assert 4 <= a["resumed_from_step"] < 10 and b["resumed_from_step"] == 0 and a["steps"] == b["steps"] == 10
    assert a["loss_curve"] == pytest.approx(b["loss_curve"], abs=1e-5)
    wa, wb = (load_file(str(d / "adapter_model.safetensors")) for d in (killed, straight))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-5), k


def test_ddp_two_processes_match_one(env, tmp_path):
    """sft.distributed: ddp under torchrun (2 gloo processes on CPU): each rank takes half of every step's samples,
    yet the loss curve and the trained adapters equal a single process's (the same objective, sample order, steps)."""
    settings = {**FAST, "epochs": 2.0, "max_steps": 6, "batch_size": 4}
    one = tmp_path / "one"
    r = subprocess.run(_sft_cmd(env, one, settings), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    from training.sft import train

    two = train(
        env["tiny"],
        env["data"],
        tmp_path / "two",
        TrainSettings(**settings, distributed="ddp", nproc=2),
        progress=False,
    )
    a = json.loads((one / "sft_result.json").read_text())
    assert two["world_size"] == 2 and a.get("world_size", 1) == 1 and two["steps"] == a["steps"] == 6
    assert two["loss_curve"] == pytest.approx(a["loss_curve"], abs=2e-5)
    assert two["target_tokens"] == a["target_tokens"] and two["samples_seen"] == a["samples_seen"]
    wa, wb = (load_file(str(d / "adapter_model.safetensors")) for d in (one, tmp_path / "two"))
    # gloo's all-reduce sums in another order, and Adam turns that float noise in near-zero gradient coordinates into
    # single-element differences up to ~1e-4 (measured on the cited-Action-line demos); per tensor the difference stays
    # under 1e-4 of the weights' norm. A rank on the wrong samples or a missing average changes the lora_B tensors
    # (zero at the start) by the order of the tensors themselves.
    for k in wa:
        assert torch.linalg.norm(wa[k] - wb[k]) <= 1e-3 * torch.linalg.norm(wa[k]), k


def test_stage_sft_records_checkpoint_and_is_idempotent(env):
    from agents.student import build_student_policy
    from flywheel.stages import sft

    cfg = env["cfg"]
    res = sft(cfg, 0, env["dataset_id"], progress=False)
    assert not res.reused and res["steps"] == 3 and res["parent_checkpoint"] is None
    again = sft(cfg, 0, env["dataset_id"], progress=False)
    assert again.reused and again["checkpoint_id"] == res["checkpoint_id"]
    con = connect(cfg.lake.root)
    rows = con.sql("SELECT * FROM checkpoints").to_arrow_table().to_pylist()
    assert len(rows) == 1  # the rerun replaced its row
    row = rows[0]
    assert (row["method"], row["dataset_id"], row["adapter"], row["iteration"], row["stage"]) == (
        "sft",
        env["dataset_id"],
        True,
        0,
        "sft",
    )
    assert row["base_model"] == str(Path(env["tiny"]).resolve())
    assert json.loads(row["metrics"])["steps"] == 3 and Path(row["path"]).parent == Path(cfg.sft.output_root)
    # the next iteration continues from it (its merged model), and records the lineage
    nxt = sft(cfg, 1, env["dataset_id"], progress=False)
    assert nxt["parent_checkpoint"] == res["checkpoint_id"] and nxt["base_model"] == res["merged_path"]
    # a model folder as base (what the flows pass) keeps the lineage too
    by_path = sft(cfg, 2, env["dataset_id"], base=nxt["model_path"], progress=False)
    assert by_path["parent_checkpoint"] == nxt["checkpoint_id"]
    # the adapter folder and its merged model load and agree
    ad, proc = load_model(res["path"])
    merged, _ = load_model(res["merged_path"])
    batch = SFTCollator(proc)(read_samples(env["data"])[:2])
    batch.pop("labels")
    with torch.no_grad():
        assert torch.allclose(ad(**batch).logits, merged(**batch).logits, atol=1e-4)
    # the student policy loads the result with the same prompt options the SFT samples used
    policy = build_student_policy(nxt["model_path"], {**cfg.student.model_dump(), "model": nxt["model_path"]})
    assert policy.opts.prompt == prompt_options(cfg.student)
    # the CLI sees the finished checkpoint and does not retrain
    cfg_file = env["tmp"] / "cli.yaml"
    cfg_file.write_text(json.dumps(cfg.model_dump(mode="json")))
    r = subprocess.run(
        [sys.executable, "-m", "flywheel", "stage", "sft", "-i", "0", "-c", str(cfg_file)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert r.returncode == 0, r.stderr
    assert f"reused checkpoint {res['checkpoint_id']}" in r.stdout


def test_wall_clock_budget_stops_cleanly_and_saves(env, tmp_path):
    # 20 epochs would be 150 steps; a 4 s budget at >= 0.3 s per step stops it long before (how long depends on
    # the box's load, so the bounds are loose; test_schedule_fits_the_budget checks the arithmetic exactly)
    s = TrainSettings(**{**FAST, "method": "full", "epochs": 20.0, "max_minutes": 4 / 60, "step_sleep_s": 0.3})
    m = train(env["tiny"], env["data"], tmp_path / "budget", s, progress=False)
    assert m["total_steps"] == 150 and 1 <= m["steps"] < 20
    assert m["stopped"] == "budget" or m["planned_steps"] < 20  # stopped by the clock, or the schedule was fitted
    model, _ = load_model(tmp_path / "budget")  # the stopped run's model is saved and loads
    assert (tmp_path / "budget" / "sft_result.json").exists() and model is not None


def test_schedule_fits_the_budget():
    assert [lr_factor(k, 10, 2) for k in (1, 2)] == [0.5, 1.0] and lr_factor(10, 10, 2) == pytest.approx(0.0)
    assert lr_factor(6, 10, 2) == pytest.approx(0.5)  # half-way through the cosine part
    st = TrainState(step=4, planned_steps=150, total_steps=150, warmup_steps=8, elapsed_s=2.0)
    s = TrainSettings(max_minutes=0.1, warmup_ratio=0.05)  # 6 s budget, 4 s left
    fit_budget(st, s, step_s=0.5)
    assert (st.planned_steps, st.warmup_steps) == (12, 1)  # 4 + 4 s / 0.5 s; warmup 5% of 12, rounded up
    fit_budget(st, s, step_s=0.001)  # a faster box later: the schedule grows back, but never past epochs' worth
    assert st.planned_steps == 150


def test_bf16_lora_keeps_fp32_master_weights(tmp_path):
    """bf16 adapters (fast on GPU) with fp32 masters: updates too small for bf16 still accumulate, and the
    resumable state holds the fp32 values."""
    from training.models import apply_lora, build_model
    from training.sft import TrainableWeights, _optimizer, latest_state, load_state, save_state

    model, _ = build_model("qwen3-vl", "tiny", seed=0, dtype="bfloat16", device="cpu")
    model = apply_lora(model, r=4, alpha=8, dropout=0.0, fp32_adapters=False)
    w = TrainableWeights(model, master=True)
    assert w.master and all(p.dtype == torch.bfloat16 for p in w.params.values())
    assert all(p.dtype == torch.float32 for p in w.opt_params)
    name = next(n for n in w.params if "lora_A" in n)
    opt = torch.optim.SGD(w.opt_params, lr=1.0)
    start = w.params[name].detach().clone()
    for _ in range(50):  # 50 updates of 1e-5: each far below bf16's resolution at these magnitudes
        w.params[name].grad = torch.full_like(w.params[name], -1e-5)
        w.grads_ready()
        opt.step()
        opt.zero_grad(set_to_none=True)
        w.stepped()
    assert torch.allclose(w.master[name], start.float() + 5e-4, atol=1e-6)  # nothing lost in the masters
    assert not torch.equal(w.params[name], start)  # and the model got the accumulated change
    st = TrainState(step=50, planned_steps=60, total_steps=60)
    save_state(tmp_path, w, opt, st)
    model2, _ = build_model("qwen3-vl", "tiny", seed=1, dtype="bfloat16", device="cpu")
    w2 = TrainableWeights(apply_lora(model2, r=4, alpha=8, dropout=0.0, fp32_adapters=False), master=True)
    load_state(latest_state(tmp_path), w2, _optimizer(w2, TrainSettings()))
    assert torch.equal(w2.master[name], w.master[name]) and torch.equal(w2.params[name], w.params[name])


def data_only_lake(env, dst: Path) -> Path:
    """A copy of the module's lake with its curated data only: no checkpoint folder or row comes along."""
    import shutil

    from storage.lake import Lake

    shutil.copytree(env["cfg"].lake.root, dst, ignore=shutil.ignore_patterns("checkpoints", "_checkpoints"))
    copy = Lake(dst)
    drop = f"DELETE FROM {copy.ref('checkpoints')}"
    copy.transaction(lambda cur: cur.execute(drop), "dropping checkpoints")
    return dst


def test_each_lake_keeps_its_own_checkpoints(env, tmp_path):
    """Two lakes in one folder, same data and settings (so the same checkpoint id): each trains into its own
    `<lake>/_checkpoints`, rows store lake-relative paths, and a moved lake still reuses its own checkpoint."""
    from flywheel.errors import UserError
    from flywheel.stages import sft
    from storage.inspect import lake_stats, verify_lake
    from storage.lake import Lake

    for name in ("a", "b", "c", "d"):
        data_only_lake(env, tmp_path / name)

    def cfg(name: str, output_root: str | None = None):
        return load_config(
            ROOT / "configs" / "tiny.yaml",
            {
                "lake.root": str(tmp_path / name),
                "student.model": str(env["tiny"]),
                "sft.output_root": output_root,
                **{f"sft.{k}": v for k, v in FAST.items()},
                "sft.max_steps": 2,
            },
        )

    a = sft(cfg("a"), 0, env["dataset_id"], progress=False)
    b = sft(cfg("b"), 0, env["dataset_id"], progress=False)
    assert a["checkpoint_id"] == b["checkpoint_id"] and not a.reused and not b.reused  # b trained its own
    for name, res in (("a", a), ("b", b)):
        lake = Lake(tmp_path / name)
        assert Path(res["path"]) == lake.root / "_checkpoints" / res["checkpoint_id"]
        assert Path(res["model_path"]).is_relative_to(lake.root) and Path(res["model_path"]).is_dir()
        row = connect(lake).sql("SELECT path FROM checkpoints").fetchall()
        assert row == [(f"_checkpoints/{res['checkpoint_id']}",)]
        assert verify_lake(lake).bad == [] and lake_stats(lake)["checkpoints"].rows == 1  # _checkpoints is no table
    # a moved lake: its rows still resolve, and its own finished checkpoint is reused from the new place
    (tmp_path / "a").rename(tmp_path / "a-moved")
    again = sft(cfg("a-moved"), 0, env["dataset_id"], progress=False)
    assert again.reused and again["model_path"] == str(
        tmp_path / "a-moved" / "_checkpoints" / again["checkpoint_id"] / "merged"
    )
    # an output root outside the lakes that another lake already trained into: never silently taken over
    shared = str(tmp_path / "shared")
    assert not sft(cfg("c", shared), 0, env["dataset_id"], progress=False).reused
    with pytest.raises(UserError, match="has no row for"):
        sft(cfg("d", shared), 0, env["dataset_id"], progress=False)


def test_cache_knobs_are_config_keys():
    """sft.vision_cache (automatic unless set: on with CUDA, off on CPU, where the main job was measured) and
    sft.encode_cache_gib
    reach the trainer from YAML; a negative cache size is refused by the config."""
    from configs.loading import parse_config
    from configs.models import ConfigError

    d = TrainSettings.from_config(parse_config({}).sft)
    assert (d.vision_cache, d.encode_cache_gib, d.encode_workers) == (None, 4.0, None)
    s = TrainSettings.from_config(
        parse_config({"sft": {"vision_cache": True, "encode_cache_gib": 0.5, "encode_workers": 3}}).sft
    )
    assert (s.vision_cache, s.encode_cache_gib, s.encode_workers) == (True, 0.5, 3)
    with pytest.raises(ConfigError, match=r"sft\.encode_cache_gib"):
        parse_config({"sft": {"encode_cache_gib": -1}})


def test_vision_cache_is_automatic_on_cuda_only(env):
    """sft.vision_cache null: the tower's outputs are kept on CUDA (epochs > 1), not on CPU; set, it is obeyed."""
    from training.sft import _encoded_samples

    model, proc = load_model(env["tiny"])
    freeze_vision(model)
    rows = read_samples(env["data"])[:2]
    cpu = torch.device("cpu")
    assert _encoded_samples(model, proc, rows, TrainSettings(epochs=2.0), cpu).vision is None
    assert _encoded_samples(model, proc, rows, TrainSettings(epochs=2.0, vision_cache=True), cpu).vision is not None
    assert _encoded_samples(model, proc, rows, TrainSettings(epochs=1.0, vision_cache=True), cpu).vision is None
    if torch.cuda.is_available():
        assert _encoded_samples(model.cuda(), proc, rows, TrainSettings(epochs=2.0), torch.device("cuda")).vision


def test_a_rank_that_aborts_names_its_last_words_in_the_error():
    """A rank killed by SIGABRT (a C++ abort: no Python exception, no error file) under torchrun: the error keeps
    what the rank printed and faulthandler's Python stack, which come before the agent's own long report; the
    error's plain tail used to be the agent's traceback only (why the DDP resume flake showed no cause)."""
    from training.distributed import torchrun

    with pytest.raises(RuntimeError) as e:
        torchrun("abort_rank1", [], 2, progress=False, env={"PYTHONPATH": str(ROOT / "tests" / "fixtures" / "ddp")})
    msg = str(e.value)
    assert "rank 1: terminate called after throwing" in msg, msg
    assert "Fatal Python error: Aborted" in msg and "abort_rank1.py" in msg, msg  # faulthandler's stack
    assert "SIGABRT" in msg and "Root Cause" in msg, msg
    # the agent's own log lines and traceback are cut, whatever the path it prints them from (CI's longer checkout
    # path once pushed the rank's words past the length limit when the cut missed them)
    assert "launch_agent" not in msg and "closing signal" not in msg, msg


def test_a_rank_whose_shutdown_would_abort_ends_cleanly_by_exit_worker(tmp_path):
    """A rank that finished its work ends by `exit_worker` (os._exit after a flush): the interpreter's shutdown, where
    CI once saw rank 1 abort after its barrier (`terminate called without an active exception`), never runs."""
    from training.distributed import torchrun

    env = {"PYTHONPATH": f"{ROOT / 'tests' / 'fixtures' / 'ddp'}:{ROOT}", "RESULT_DIR": str(tmp_path)}
    torchrun("abort_at_shutdown", [], 2, progress=False, env=env)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.txt", "rank1.txt"]
    alone = subprocess.run(  # not a torchrun worker: exit_worker does nothing, and the shutdown aborts
        [sys.executable, "-m", "abort_at_shutdown"],
        env={**os.environ, **env, "RANK": "0", "WORLD_SIZE": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert alone.returncode == -signal.SIGABRT, alone  # so the run above passed because exit_worker skipped it
    assert alone.stdout == "rank 0 finished", alone  # a last line without a newline, flushed by the shutdown here
