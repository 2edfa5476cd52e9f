"""A frozen vision tower's outputs, computed once per sample and reused (`sft.vision_cache`, off by default).

    samples.vision = VisionFeatures(model, samples)        # training.sft does this when the tower is frozen
    batch = samples.vision.attach(group, encs, batch, device)   # in train_step, after the batch is on the device

SFT freezes the vision tower (LoRA and full fine-tune alike), so what it returns for a sample's screenshots is the
same at every step. The first time a sample is trained on, its images go through the tower under no_grad (none of
it is trained, so autograd has nothing to keep) and the two things the language model reads from it, the merged
image embeddings and the DeepStack features, are kept in host memory beside the sample's tokens, in place of its
pixel_values. Every later use passes them to the model as `mm_encoder_outputs` (Qwen3-VL's forward takes
precomputed encoder outputs) and the tower does not run. On a 1280x704 screenshot of the 2B shape that is
880 x 2048 bf16 x (1 + 3 DeepStack layers) = 14.4 MB kept instead of 10.8 MB of bf16 pixel_values (one third more
host memory), and the tower's forward was a third of a packed full fine-tune step (docs/LOG.md, session 9).

The features are the tower's own outputs for the same pixels and weights, so the loss is the same as running the
tower every step (up to the rounding of matrix products over a different set of images in a batch).
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any


class VisionFeatures:
    """Per-sample vision outputs of a frozen Qwen3-VL tower, kept in (page-locked, on CUDA) host memory.

    A sample's features are kept only if its encoding is in `samples.cache` and the swap keeps the cache within its
    bound (EncodedSamples.max_bytes, sft.encode_cache_gib); the entry then drops its pixel_values. A sample whose
    features are not kept goes through the tower each time, as without the cache."""

    def __init__(self, model, samples):
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.inner, self.samples = base.model, samples
        self.merge = int(self.inner.visual.spatial_merge_size)
        self.stored: dict[int, tuple[Any, list[Any]]] = {}
        self.tower_calls = 0
        self._slabs = None  # training.data.PinnedSlabs: page-locked host memory the kept features are carved from

    @staticmethod
    def supported(model) -> bool:
        """A Qwen3-VL-style model whose forward takes mm_encoder_outputs, with every vision parameter frozen."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        inner = getattr(base, "model", None)
        visual = getattr(inner, "visual", None)
        if visual is None or not hasattr(inner, "get_image_features") or not hasattr(visual, "spatial_merge_size"):
            return False
        if "mm_encoder_outputs" not in inspect.signature(inner.forward).parameters:
            return False
        return not any(p.requires_grad for p in visual.parameters())

    def attach(self, group: list[int], encs: list[dict[str, Any]], batch: dict[str, Any], device) -> dict[str, Any]:
        """`batch` (built from `encs`, the encodings of `group`, already on `device`) with the images' features as
        `mm_encoder_outputs` instead of pixel_values. Samples without kept features (their encodings still hold
        pixel_values, in `batch` in the same order) go through the tower now; their features are kept."""
        import torch

        if "image_grid_thw" not in batch:
            return batch
        fresh: dict[int, tuple[Any, list[Any]]] = {}
        miss = [(i, e) for i, e in zip(group, encs) if "pixel_values" in e]
        if miss:
            grid = torch.cat([e["image_grid_thw"] for _, e in miss]).to(device)
            with torch.no_grad():
                out = self.inner.get_image_features(batch.pop("pixel_values"), grid, return_dict=True)
            self.tower_calls += 1
            pooled = torch.cat(list(out.pooler_output))
            sizes = [int(e["image_grid_thw"].prod(-1).sum()) // self.merge**2 for _, e in miss]
            deep = [torch.cat(list(f)).split(sizes) for f in out.deepstack_features]
            for k, ((i, _), p) in enumerate(zip(miss, pooled.split(sizes))):
                fresh[i] = (p, [d[k] for d in deep])
                self._keep(i, *fresh[i])
        batch.pop("pixel_values", None)
        parts = []
        for i, e in zip(group, encs):
            if "image_grid_thw" not in e:
                continue
            if i in fresh:
                parts.append(fresh[i])
            else:
                p, ds = self.stored[i]
                parts.append((p.to(device, non_blocking=True), [d.to(device, non_blocking=True) for d in ds]))
        n_deep = len(parts[0][1])
        image = SimpleNamespace(
            pooler_output=(torch.cat([p for p, _ in parts]),),
            deepstack_features=[(torch.cat([ds[j] for _, ds in parts]),) for j in range(n_deep)],
        )
        batch["mm_encoder_outputs"] = {"image": image}
        return batch

    def _keep(self, i: int, pooled, deep: list[Any]) -> None:
        """Copy one sample's features to host memory (asynchronously into pinned buffers on CUDA: the stream orders
        this copy before any later copy back) and drop the sample's pixel_values from its cached encoding."""

        entry = self.samples.cache.get(i)
        if entry is None or "pixel_values" not in entry:
            return
        pixels = entry["pixel_values"]
        grow = sum(t.numel() * t.element_size() for t in [pooled, *deep]) - pixels.numel() * pixels.element_size()
        if self.samples.bytes + grow > self.samples.max_bytes:
            return

        def host(t):
            if not t.is_cuda:
                return t.detach().clone()
            return self._pinned(t.shape, t.dtype).copy_(t.detach(), non_blocking=True)

        self.stored[i] = (host(pooled), [host(d) for d in deep])
        del entry["pixel_values"]
        self.samples.bytes += grow

    def _pinned(self, shape, dtype):
        """An empty page-locked tensor (kept features are never freed, so slabs: training.data.PinnedSlabs)."""
        if self._slabs is None:
            from training.data import PinnedSlabs

            self._slabs = PinnedSlabs()
        return self._slabs.empty(shape, dtype)
