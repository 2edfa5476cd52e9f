"""`hf` backend: transformers `generate` on a local Qwen-VL folder (or a Hub id), batched.

    be = HFBackend("models/small-qwen3vl")
    gens = be.generate([prompt_a, prompt_b], Sampling(temperature=0.0, max_new_tokens=64, seed=0))

- Batched: several prompts (e.g. the current step of parallel episodes) go through one
  left-padded `generate` call.
- Each Generation carries the response token ids and their log-probabilities under the
  model's own distribution (log-softmax of the raw logits, temperature 1): what GRPO/SDPO
  need as the sampling policy's logprobs, matching vLLM's default `logprobs` semantics.
- Deterministic under a seed: `Sampling.seed` seeds torch before sampling.
- Stops at `</tool_call>` (kept in the text) or `<|im_end|>`.
"""

from __future__ import annotations

import io
import time
from typing import TYPE_CHECKING, Any

from agents.backends.base import Backend, BackendError, Generation, Sampling

if TYPE_CHECKING:
    from agents.prompts import Prompt


def _pil(png: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(png)).convert("RGB")


class HFBackend(Backend):
    name = "hf"

    def __init__(
        self,
        model_path: str | None = None,
        *,
        dtype: str = "auto",
        device: str = "auto",
        model: Any = None,
        processor: Any = None,
        threads: int | None = None,
        lean: bool = True,
    ):
        import torch

        from training.models import load_model, model_arch

        if threads:
            torch.set_num_threads(threads)
        if model is None:
            if model_path is None:
                raise BackendError("HFBackend needs a model path or a loaded model")
            model, processor = load_model(model_path, dtype=dtype, device=device)
        self.model, self.processor = model.eval(), processor
        self.tok = processor.tokenizer
        self.tok.padding_side = "left"
        self.arch = model_arch(model)
        self.model_id = str(model_path or getattr(model.config, "_name_or_path", "model"))
        self.device = next(model.parameters()).device
        self.timings: dict[str, float] = {"encode": 0.0, "generate": 0.0, "decode": 0.0}
        # the lean KV-cached decode loop (agents/backends/kv_decode.py) where it reproduces this model exactly
        from agents.backends import kv_decode

        self._lean = kv_decode.LeanDecoder(self.model) if lean and kv_decode.supports(self.model) else None

    def encode(self, prompts: list["Prompt"]):
        """Processor inputs for a batch of prompts (the same call the SFT collator makes)."""
        texts = [
            self.processor.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=False) for p in prompts
        ]
        images = [_pil(png) for p in prompts for png in p.images]
        kw: dict[str, Any] = {"text": texts, "return_tensors": "pt", "padding": True}
        if images:
            kw["images"] = images
        return self.processor(**kw).to(self.device)

    def _stop_ids(self, sampling: Sampling) -> list[int]:
        ids = {self.tok.convert_tokens_to_ids("<|im_end|>")}
        for s in sampling.stop:
            tid = self.tok.convert_tokens_to_ids(s)
            if isinstance(tid, int) and tid != self.tok.unk_token_id and tid is not None:
                ids.add(tid)
        return sorted(i for i in ids if isinstance(i, int) and i >= 0)

    def _hf_generate(self, inputs, sampling: Sampling, stop: list[int]):
        """transformers `generate` (the fallback: text-only prompts, other model classes)."""
        import torch

        gen_kw: dict[str, Any] = dict(
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=stop,
            pad_token_id=self.tok.pad_token_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        if sampling.temperature > 0:
            gen_kw.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        else:
            gen_kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        out = self.model.generate(**inputs, **gen_kw)
        seqs = out.sequences[:, inputs["input_ids"].shape[1] :]
        logits = torch.stack(out.logits, dim=1).float()  # [batch, new_tokens, vocab], raw (unwarped)
        return seqs, torch.log_softmax(logits, dim=-1).gather(-1, seqs.unsqueeze(-1)).squeeze(-1)

    def reload(self, model_path: str) -> None:
        """Load new weights (an RL round's checkpoint) into the live model, in place."""
        from training.models import load_model

        # through from_pretrained, which maps saved key names to the live ones (they differ for Qwen2.5-VL)
        fresh, _ = load_model(
            model_path, dtype=str(next(self.model.parameters()).dtype).removeprefix("torch."), device=str(self.device)
        )
        try:
            self.model.load_state_dict(fresh.state_dict(), strict=True)
        except RuntimeError as e:
            raise BackendError(
                f"{model_path}: weights do not match the loaded model ({str(e).splitlines()[0][:200]})"
            ) from None
        del fresh
        if self._lean is not None:
            self._lean.refresh()
        self.model_id = str(model_path)

    def generate(self, prompts: list["Prompt"], sampling: Sampling) -> list[Generation]:
        import torch

        if not prompts:
            return []
        t0 = time.perf_counter()
        inputs = self.encode(prompts)
        t_enc = time.perf_counter()
        self.timings["encode"] += t_enc - t0
        stop = self._stop_ids(sampling)
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        with torch.inference_mode():
            if self._lean is not None and inputs.get("pixel_values") is not None:
                out = self._lean.generate(
                    inputs,
                    max_new_tokens=sampling.max_new_tokens,
                    stop_ids=stop,
                    pad_id=self.tok.pad_token_id,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                )
                seqs, logp = out.tokens, out.logprobs
            else:
                seqs, logp = self._hf_generate(inputs, sampling, stop)
        t_gen = time.perf_counter()
        self.timings["generate"] += t_gen - t_enc
        n_prompt = inputs["attention_mask"].sum(dim=1).tolist()
        elapsed = (time.perf_counter() - t0) * 1000
        gens = []
        for i in range(len(prompts)):
            ids = seqs[i].tolist()
            n = len(ids)
            finish = "length"
            for j, t in enumerate(ids):
                if t in stop:
                    n, finish = j + 1, "stop"
                    break
            keep = ids[:n]
            text = self.tok.decode(keep, skip_special_tokens=True)
            gens.append(
                Generation(
                    text=text,
                    token_ids=keep,
                    logprobs=[float(x) for x in logp[i, :n].tolist()],
                    prompt_tokens=int(n_prompt[i]),
                    completion_tokens=n,
                    latency_ms=elapsed / len(prompts),
                    finish_reason=finish,
                )
            )
        self.timings["decode"] += time.perf_counter() - t_gen
        return gens
