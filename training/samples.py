"""The SFT samples of a run, encoded once and kept (`EncodedSamples`), and the next step's encoding done by a pool of
threads while the current step runs on the GPU (`Prefetch`)."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class EncodedSamples:
    """Samples encoded once (chat template + image processor) and kept, so later epochs only pad and stack.

    Bounded by `max_bytes`: past it, samples are encoded on every use (same tensors, just slower). With
    `pixel_dtype` (the vision tower's dtype) pixel_values are kept in it: the tower casts them to its dtype first
    thing, so a bf16 model sees the same values from half the bytes (two 1280x704 screenshots: 21.6 MB, not 43)."""

    def __init__(self, rows: list[dict[str, Any]], collator, max_bytes: int = 4 << 30, positions=None,
                 pixel_dtype=None):
        self.rows, self.collator, self.max_bytes, self.positions = rows, collator, max_bytes, positions
        self.pixel_dtype = pixel_dtype
        self.cache: dict[int, dict[str, Any]] = {}
        self.n_targets: dict[int, int] = {}
        self.bytes, self.vision = 0, None  # vision: training.vision_cache.VisionFeatures (set by _train)
        self.lengths: dict[int, int] = {}
        self._lock = threading.Lock()

    def batch(self, idx: list[int], pin: bool = False, encs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return self.collator.pad(encs or [self.get(i) for i in idx], pin=pin)

    def packed(self, idx: list[int], pin: bool = False, encs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The samples as one packed row (training.packing.pack); needs `positions` (rope_positions_fn)."""
        from training.packing import pack

        if self.positions is None:
            raise ValueError("packed batches need EncodedSamples(..., positions=rope_positions_fn(model)) "
                             "(training.packing)")
        return pack(encs or [self.get(i) for i in idx], pin=pin)

    def length(self, i: int) -> int:
        """Tokens of sample i, counted without encoding it (SFTCollator.length): a DDP step splits its samples by
        tokens before each rank encodes only its own."""
        if i not in self.lengths:  # always counted the same way, so every DDP rank computes the same split
            self.lengths[i] = self.collator.length(self.rows[i])
        return self.lengths[i]

    def targets(self, i: int) -> int:
        """Target tokens sample i adds to a step's normaliser, padded or packed (labels[:, 1:] != -100: its first
        token is never a target)."""
        if i not in self.n_targets:
            self.n_targets[i] = int((self.get(i)["labels"][:, 1:] != -100).sum())
        return self.n_targets[i]

    def get(self, i: int, collator=None) -> dict[str, Any]:
        """Sample i's encoding, kept from an earlier use or encoded now with `collator` (default this object's; a
        Prefetch thread passes its own copy, since the fast tokenizer is not to be used from two threads)."""
        got = self.cache.get(i)
        if got is not None:
            return got
        got = (collator or self.collator).encode(self.rows[i])
        if self.pixel_dtype is not None and "pixel_values" in got:
            got["pixel_values"] = got["pixel_values"].to(self.pixel_dtype)
        if self.positions is not None:  # packing: the sample's own multimodal RoPE positions
            got["position_ids"] = self.positions(got)
        size = sum(t.numel() * t.element_size() for t in got.values())
        with self._lock:  # Prefetch threads keep samples too
            kept = self.cache.get(i)
            if kept is not None:
                return kept
            if self.bytes + size <= self.max_bytes:
                self.cache[i], self.bytes = got, self.bytes + size
        return got


class Prefetch:
    """Encodes the samples of the next step on a pool of threads, so the step that needs them finds them kept
    (EncodedSamples.get) instead of running the chat template and the image processor between its GPU work. Each
    thread encodes with its own copy of the processor; the image processing releases the GIL, so the threads run
    in parallel (one thread could not keep up with an H100: docs/LOG.md, session 10).

        ahead = Prefetch(samples, threads=8)
        ahead.ready()                   # the samples queued for this step are encoded (or failed: raised here)
        ahead.start([7, 3, 9])          # this rank's samples of the next step
        ahead.close()

    Samples past the cache bound are encoded again when used (the prefetch then only warmed the cache)."""

    def __init__(self, samples: EncodedSamples, threads: int = 1):
        self.samples = samples
        self._local = threading.local()
        self.pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="sft-prefetch", initializer=self._init)
        self.pending: list[Future] = []

    def _init(self) -> None:
        import copy
        col = self.samples.collator
        self._local.collator = type(col)(copy.deepcopy(col.processor))

    def _encode(self, i: int) -> None:
        self.samples.get(i, self._local.collator)

    def start(self, idx: list[int]) -> None:
        self.ready()
        self.pending = [self.pool.submit(self._encode, i) for i in idx]

    def ready(self) -> None:
        pending, self.pending = self.pending, []
        for fut in pending:
            fut.result()

    def close(self) -> None:
        self.pending = []
        self.pool.shutdown(wait=True, cancel_futures=True)
