"""Student models: real Qwen3-VL / Qwen2.5-VL classes at named sizes, random-init builder, loader, LoRA.

    path = init_model("qwen3-vl", "small", Path("models/small-qwen3vl"), seed=0)   # random init, saved folder
    model, proc = load_model(path)                       # or a Hub id: load_model("Qwen/Qwen3-VL-2B-Instruct")
    model, proc = load_model(path, lora=LoraSpec(r=8))   # PEFT LoRA on the language model, vision frozen
    cfg = build_config("qwen3-vl", "8b")                 # config only: nothing allocated
    param_counts("qwen3-vl", "8b")                       # counted on the meta device

Sizes: `tiny` (~0.5M, tests), `mini` (~6M, the CPU learning-bar run), `small` (~20M, the CPU default) and the
released shapes for GPU benchmarks (`2b`/`4b`/`8b` for Qwen3-VL, `3b`/`7b` for Qwen2.5-VL). A built folder holds
model.safetensors, config.json, generation_config.json (eos = <|im_end|>), the locally trained tokenizer
(training/tokenizer.py), the image processor, processor_config.json and video_preprocessor_config.json, so stock
`AutoProcessor` loads it where torchvision works and `load_processor` loads it everywhere. Pure torch/transformers:
no Prefect here.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from training.tokenizer import (
    SPECIAL_TOKENS,
    build_processor,
    build_tokenizer,
    image_processor_settings,
    load_processor,
    special_ids,
)

ARCHS = ("qwen3-vl", "qwen2.5-vl")
_MODEL_TYPES = {"qwen3_vl": "qwen3-vl", "qwen2_5_vl": "qwen2.5-vl"}
# The released vocabulary's special-token ids, for config-only shapes (a built folder uses its own tokenizer's ids).
_RELEASED_IDS = {t: 151643 + i for i, t in enumerate(SPECIAL_TOKENS)}
_LM_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


class ModelError(ValueError):
    """A model cannot be built or loaded (bad arch/size/path, Hub unreachable): one clear line."""


# --------------------------------------------------------------------------------------------- shapes
def _q3(h, layers, heads, kv, ffn, tie, vision, deepstack, head_dim=128, mrope=(24, 20, 20), vocab=151936):
    text = dict(
        vocab_size=vocab,
        hidden_size=h,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        max_position_embeddings=262144,
        rms_norm_eps=1e-6,
        rope_parameters=dict(rope_type="default", rope_theta=5e6, mrope_section=list(mrope), mrope_interleaved=True),
    )
    depth, vh, vffn, vheads, npos = vision
    vis = dict(
        depth=depth,
        hidden_size=vh,
        intermediate_size=vffn,
        num_heads=vheads,
        patch_size=16,
        spatial_merge_size=2,
        temporal_patch_size=2,
        out_hidden_size=h,
        num_position_embeddings=npos,
        deepstack_visual_indexes=list(deepstack),
        hidden_act="gelu_pytorch_tanh",
    )
    return dict(text=text, vision=vis, tie=tie)


def _q25(h, layers, heads, kv, ffn, tie, vision, mrope=(16, 24, 24), vocab=151936):
    text = dict(
        vocab_size=vocab,
        hidden_size=h,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=128000,
        rms_norm_eps=1e-6,
        rope_parameters=dict(rope_type="default", rope_theta=1e6, mrope_section=list(mrope)),
    )
    depth, vh, vffn, vheads, fullatt = vision
    vis = dict(
        depth=depth,
        hidden_size=vh,
        intermediate_size=vffn,
        num_heads=vheads,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        out_hidden_size=h,
        window_size=112,
        fullatt_block_indexes=list(fullatt),
        tokens_per_second=2,
        hidden_act="silu",
    )
    return dict(text=text, vision=vis, tie=tie)


# tiny/small: head_dim 16 -> mrope [4,2,2], 64 -> [12,10,10] (the sections sum to head_dim/2).
SIZES: dict[str, dict[str, dict]] = {
    "qwen3-vl": {
        "tiny": _q3(64, 2, 4, 2, 128, True, (2, 64, 128, 4, 256), [0], head_dim=16, mrope=(4, 2, 2)),
        # ~6M: the shape of the CPU learnability probe (shared/research/learnability.md)
        "mini": _q3(192, 4, 6, 2, 768, True, (4, 192, 768, 3, 256), [2], head_dim=32, mrope=(6, 5, 5)),
        "small": _q3(384, 8, 6, 2, 1536, True, (4, 192, 768, 3, 256), [1, 2], head_dim=64, mrope=(12, 10, 10)),
        # ~3x small's text layers, the same vision tower: does the reading check need capacity? (docs/LOG.md s29)
        "medium": _q3(512, 12, 8, 2, 2048, True, (4, 192, 768, 3, 256), [1, 2], head_dim=64, mrope=(12, 10, 10)),
        "2b": _q3(2048, 28, 16, 8, 6144, True, (24, 1024, 4096, 16, 2304), [5, 11, 17]),
        "4b": _q3(2560, 36, 32, 8, 9728, True, (24, 1024, 4096, 16, 2304), [5, 11, 17]),
        "8b": _q3(4096, 36, 32, 8, 12288, False, (27, 1152, 4304, 16, 2304), [8, 16, 24]),
    },
    "qwen2.5-vl": {
        "tiny": _q25(64, 2, 4, 2, 128, True, (2, 64, 128, 4, [1]), mrope=(4, 2, 2)),
        "mini": _q25(192, 4, 6, 2, 768, True, (4, 192, 768, 3, [3]), mrope=(6, 5, 5)),
        "small": _q25(384, 8, 6, 2, 1536, True, (4, 192, 768, 3, [3]), mrope=(12, 10, 10)),
        "medium": _q25(512, 12, 8, 2, 2048, True, (4, 192, 768, 3, [3]), mrope=(12, 10, 10)),
        "3b": _q25(2048, 36, 16, 2, 11008, True, (32, 1280, 3420, 16, [7, 15, 23, 31])),
        "7b": _q25(3584, 28, 28, 4, 18944, False, (32, 1280, 3420, 16, [7, 15, 23, 31]), vocab=152064),
    },
}
# local vocabulary and a low image-pixel floor; the others are released shapes
CPU_SIZES = ("tiny", "mini", "small", "medium")


def _check(arch: str, size: str) -> dict:
    if arch not in SIZES:
        raise ModelError(f"unknown arch {arch!r}: use one of {', '.join(ARCHS)}")
    if size not in SIZES[arch]:
        raise ModelError(f"unknown size {size!r} for {arch}: use one of {', '.join(SIZES[arch])}")
    return SIZES[arch][size]


def build_config(arch: str, size: str, token_ids: dict[str, int] | None = None, vocab_size: int | None = None):
    """The transformers config of a named shape (nothing allocated).

    Token ids and vocabulary default to the local tokenizer's for the CPU sizes, to the released ones otherwise."""
    from transformers import Qwen2_5_VLConfig, Qwen3VLConfig

    shape = _check(arch, size)
    local_vocab, local_ids = _local_vocab() if size in CPU_SIZES else (None, None)
    ids = token_ids or local_ids or _RELEASED_IDS
    text = dict(shape["text"], pad_token_id=ids["<|endoftext|>"])
    if vocab_size or local_vocab:
        text["vocab_size"] = vocab_size or local_vocab
    if arch == "qwen2.5-vl":  # its text config otherwise defaults bos/eos to the released ids
        text.update(bos_token_id=None, eos_token_id=ids["<|im_end|>"])
    cls = Qwen3VLConfig if arch == "qwen3-vl" else Qwen2_5_VLConfig
    return cls(
        text_config=text,
        vision_config=dict(shape["vision"]),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=shape["tie"],
    )


def _model_class(arch: str):
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen3VLForConditionalGeneration

    return Qwen3VLForConditionalGeneration if arch == "qwen3-vl" else Qwen2_5_VLForConditionalGeneration


def param_counts(arch: str, size: str) -> dict[str, int]:
    """Parameter counts of a named shape, built on the meta device (no memory): total, vision, language."""
    import torch

    with torch.device("meta"):
        model = _model_class(arch)(build_config(arch, size))
    return count_parameters(model)


@lru_cache(maxsize=1)
def _local_vocab() -> tuple[int, dict[str, int]]:
    """The local tokenizer's size rounded up to a multiple of 64 (the CPU sizes' vocabulary rows), and its ids."""
    tok = build_tokenizer()
    return -(-len(tok) // 64) * 64, special_ids(tok)


def count_parameters(model) -> dict[str, int]:
    """total / trainable / vision / vision_trainable parameter counts (shared tensors counted once)."""
    out = {"total": 0, "trainable": 0, "vision": 0, "vision_trainable": 0}
    for name, p in model.named_parameters():  # named_parameters() already skips tied duplicates
        n = p.numel()
        out["total"] += n
        out["trainable"] += n if p.requires_grad else 0
        if _is_vision(name):
            out["vision"] += n
            out["vision_trainable"] += n if p.requires_grad else 0
    return out


def _is_vision(name: str) -> bool:
    return ".visual." in f".{name}"


# --------------------------------------------------------------------------------------------- build
def _resolve(dtype: str, device: str):
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dtype = "bfloat16" if str(device).startswith("cuda") else "float32"
    try:
        return getattr(torch, dtype) if isinstance(dtype, str) else dtype, torch.device(device)
    except (AttributeError, RuntimeError) as e:
        raise ModelError(f"bad dtype/device {dtype!r}/{device!r}: {e}") from None


def set_generation_ids(model, tok) -> None:
    """eos = <|im_end|> (Qwen3-VL's default generation config has none), pad = <|endoftext|>, no bos."""
    gc = model.generation_config
    gc.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    gc.pad_token_id = tok.convert_tokens_to_ids("<|endoftext|>")
    gc.bos_token_id = None


def build_model(arch: str, size: str, seed: int = 0, dtype: str = "auto", device: str = "auto"):
    """A randomly initialised model (seeded) and its processor, with the local tokenizer."""
    import torch

    shape = _check(arch, size)
    tok = build_tokenizer()
    ids = special_ids(tok)
    # CPU sizes get a vocabulary fitted to the tokenizer (rounded to 64); released shapes keep theirs.
    vocab = _local_vocab()[0] if size in CPU_SIZES else max(shape["text"]["vocab_size"], len(tok))
    cfg = build_config(arch, size, token_ids=ids, vocab_size=vocab)
    torch_dtype, dev = _resolve(dtype, device)
    torch.manual_seed(seed)
    with dev:  # allocate where it will run: an 8B model never materialises in CPU RAM on a GPU box
        model = _model_class(arch)(cfg).to(torch_dtype)
    set_generation_ids(model, tok)
    proc = build_processor(arch, tok, image_processor_settings(arch, small=size in CPU_SIZES))
    return model.eval(), proc


def init_model(arch: str, size: str, out: Path, seed: int = 0, dtype: str = "auto", device: str = "auto") -> Path:
    """Build a seeded random-init model and save the full folder (model, tokenizer, processor) to `out`."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ModelError(f"{out} exists and is not empty; pick a new folder")
    model, proc = build_model(arch, size, seed=seed, dtype=dtype, device=device)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    proc.save_pretrained(out)
    return out


# --------------------------------------------------------------------------------------------- load
@dataclass(frozen=True)
class LoraSpec:
    """PEFT LoRA on the language model's attention and MLP projections (the vision tower stays frozen)."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: str = _LM_TARGETS
    fp32_adapters: bool = True  # False: adapters in the model's dtype (bf16 on GPU), see apply_lora


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")  # "name" or "owner/name"


def _looks_local(name: str) -> bool:
    return Path(name).expanduser().exists() or _HUB_ID.match(name) is None


def _hub_error(name: str, why: str) -> ModelError:
    return ModelError(
        f"cannot reach the Hugging Face Hub to download {name!r} ({why}); pass a local folder "
        f"(flywheel model init ...) or set HF_HUB_OFFLINE=0 on a machine with access"
    )


def _hub_preflight(name: str) -> bool:
    """Fail in seconds when the Hub is off or unreachable and `name` is not cached; returns True if cached."""
    from huggingface_hub import constants, try_to_load_from_cache

    cached = isinstance(try_to_load_from_cache(name, "config.json"), str)
    env = os.environ.get("HF_HUB_OFFLINE")  # read now: huggingface_hub read it once, at import
    offline = env.upper() in {"1", "ON", "YES", "TRUE"} if env is not None else constants.HF_HUB_OFFLINE
    if cached:
        return True
    if offline:
        raise _hub_error(name, "HF_HUB_OFFLINE is set")
    import httpx

    endpoint = os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")
    try:  # one short request instead of the library's retries with backoff
        httpx.head(f"{endpoint}/api/models/{name}", timeout=5.0, follow_redirects=True)
    except httpx.HTTPError as e:
        raise _hub_error(name, f"{endpoint}: {type(e).__name__}") from None
    return False


def _thread_only_tqdm_lock() -> None:
    """Give tqdm a thread lock before transformers draws its first progress bar ("Loading weights").

    Left alone, tqdm's first bar creates a multiprocessing RLock: a named POSIX semaphore that, in a process started
    with `spawn` (the rollout workers, which load the student through here), the resource tracker records. A worker
    ended with its process group (a hung episode, or shutdown after the grace period) never unlinks it, and the
    tracker then closed `flywheel run` with "There appear to be N leaked semaphore objects". The lock only matters
    for bars shared with forked children, which nothing here draws; the tqdm docs' `tqdm.set_lock` is the hook."""
    import threading

    from tqdm import tqdm

    if "_lock" not in vars(tqdm):  # a bar drawn earlier keeps its lock
        tqdm.set_lock(threading.RLock())


def load_model(name_or_path: str | Path, dtype: str = "auto", device: str = "auto", lora: LoraSpec | None = None):
    """(model, processor) from a local folder (built or saved, or a LoRA adapter folder) or a Hub id.

    dtype "auto": bf16 on CUDA, fp32 on CPU; device "auto": CUDA when available. `lora` wraps the result with a
    fresh trainable adapter (vision frozen)."""
    _thread_only_tqdm_lock()
    name = str(name_or_path)
    path = Path(name).expanduser()
    if path.is_dir():
        if (path / "adapter_config.json").exists():
            return _load_adapter(path, dtype, device, lora)
        if not (path / "config.json").exists():
            raise ModelError(f"{path}: no config.json; build one with `flywheel model init` or pass a Hub id")
        src, local_only = str(path), True
    elif _looks_local(name):
        raise ModelError(f"no model folder at {name}; build one with `flywheel model init --out {name}`")
    else:
        local_only = _hub_preflight(name)
        src = name
    torch_dtype, dev = _resolve(dtype, device)
    try:
        model, proc = _from_pretrained(src, torch_dtype, dev, local_only)
    except OSError as e:
        raise ModelError(f"cannot load model {name!r}: {str(e).splitlines()[0]}") from None
    if lora is not None:
        model = apply_lora(
            model, lora.r, lora.alpha, lora.dropout, lora.target_modules, fp32_adapters=lora.fp32_adapters
        )
    return model, proc


def _from_pretrained(src: str, torch_dtype, dev, local_only: bool):
    from transformers import AutoConfig, AutoModelForImageTextToText

    cfg = AutoConfig.from_pretrained(src, local_files_only=local_only)
    if cfg.model_type not in _MODEL_TYPES:
        raise ModelError(f"{src}: model type {cfg.model_type!r} is not Qwen3-VL or Qwen2.5-VL")
    model = AutoModelForImageTextToText.from_pretrained(
        src, dtype=torch_dtype, device_map=str(dev), local_files_only=local_only
    )
    proc = load_processor(src)
    if model.generation_config.eos_token_id is None:  # released Qwen3-VL configs: stop at <|im_end|>
        set_generation_ids(model, proc.tokenizer)
    return model.eval(), proc


def _load_adapter(path: Path, dtype: str, device: str, lora: LoraSpec | None):
    from peft import PeftModel

    base_name = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base_name:
        raise ModelError(f"{path}/adapter_config.json names no base_model_name_or_path")
    base, proc = load_model(base_name, dtype=dtype, device=device)
    if (path / "tokenizer_config.json").exists():
        proc = load_processor(str(path))
    with _quiet_peft():
        model = PeftModel.from_pretrained(base, str(path), is_trainable=lora is not None)
    if lora is not None:
        freeze_vision(model)
    return model, proc


def model_arch(model) -> str:
    """qwen3-vl or qwen2.5-vl, from a (PEFT-wrapped or plain) model's config."""
    return arch_for_model_type(getattr(model.config, "model_type", ""))


def arch_for_model_type(model_type: str) -> str:
    """qwen3-vl or qwen2.5-vl for a transformers `model_type` (qwen3_vl, qwen2_5_vl)."""
    if model_type not in _MODEL_TYPES:
        raise ModelError(f"model type {model_type!r} is not Qwen3-VL or Qwen2.5-VL")
    return _MODEL_TYPES[model_type]


# --------------------------------------------------------------------------------------------- LoRA
@contextmanager
def _quiet_peft():
    """peft 0.21 probes `is_gradient_checkpointing`, deprecated in transformers 5 (a FutureWarning per wrap)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def freeze_vision(model) -> int:
    """Freeze the vision tower (patch embed, blocks, mergers); returns how many parameters were frozen."""
    n = 0
    for name, p in model.named_parameters():
        if _is_vision(name):
            p.requires_grad_(False)
            n += p.numel()
    if n == 0:
        raise ModelError("found no vision parameters to freeze (is this a Qwen-VL model?)")
    return n


def apply_lora(
    model,
    r: int = 16,
    alpha: int = 32,
    dropout: float = 0.05,
    target_modules: str = _LM_TARGETS,
    *,
    fp32_adapters: bool = True,
):
    """Wrap `model` with PEFT LoRA on the language model only (regex, because the Qwen2.5-VL vision MLP also has
    gate/up/down_proj); every base weight, the vision tower included, is frozen.

    `fp32_adapters` (PEFT's default) keeps the adapter weights in fp32 on a bf16 model, so every adapted
    projection casts its input to fp32 and keeps that copy for the backward pass; False keeps them in the
    model's dtype (faster and smaller on GPU; the optimizer then updates bf16 weights)."""
    from peft import LoraConfig, get_peft_model

    if r < 1 or alpha <= 0 or not 0 <= dropout < 1:
        raise ModelError(f"bad LoRA settings r={r} alpha={alpha} dropout={dropout}")
    with _quiet_peft():
        peft_model = get_peft_model(
            model,
            LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules),
            autocast_adapter_dtype=fp32_adapters,
        )
    freeze_vision(peft_model)
    return peft_model


# --------------------------------------------------------------------------------------------- info
def image_token_count(proc, width: int = 160, height: int = 210) -> int:
    """How many <|image_pad|> tokens a width x height screenshot becomes with this processor."""
    from PIL import Image

    grid = proc.image_processor(images=[Image.new("RGB", (width, height))], return_tensors="pt")["image_grid_thw"]
    return int(grid.prod(-1).sum()) // proc.image_processor.merge_size**2


def describe(name_or_path: str | Path, lora: LoraSpec = LoraSpec()) -> dict[str, Any]:
    """Arch, parameter counts (total, vision, trainable under `lora`), vocabulary and image tokens of a 160x210
    screenshot, for a model folder or Hub id, without loading weights (the model is built on the meta device)."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    name = str(name_or_path)
    path = Path(name).expanduser()
    if path.is_dir() and not (path / "config.json").exists():
        raise ModelError(f"{path}: no config.json (a LoRA adapter folder? describe its base model instead)")
    if not path.is_dir():
        if _looks_local(name):
            raise ModelError(f"no model folder at {name}")
        _hub_preflight(name)
    src = str(path) if path.is_dir() else name
    cfg = AutoConfig.from_pretrained(src)
    if cfg.model_type not in _MODEL_TYPES:
        raise ModelError(f"{src}: model type {cfg.model_type!r} is not Qwen3-VL or Qwen2.5-VL")
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(cfg)
        counts = count_parameters(model)
        lora_trainable = count_parameters(apply_lora(model, lora.r, lora.alpha, lora.dropout))["trainable"]
    proc = load_processor(src)
    text_cfg = cfg.text_config
    return {
        "arch": _MODEL_TYPES[cfg.model_type],
        "class": (cfg.architectures or ["?"])[0],
        **counts,
        "lora_r": lora.r,
        "lora_trainable": lora_trainable,
        "vocab_size": text_cfg.vocab_size,
        "tokenizer_size": len(proc.tokenizer),
        "hidden_size": text_cfg.hidden_size,
        "layers": text_cfg.num_hidden_layers,
        "image_tokens_160x210": image_token_count(proc, 160, 210),
        "dtype": str(getattr(cfg, "dtype", None) or "float32").replace("torch.", ""),
    }


def is_lora_param(name: str) -> bool:
    """True for parameters PEFT LoRA added (for checks that a step touched only adapters)."""
    return re.search(r"\.lora_(A|B)\.", name) is not None
