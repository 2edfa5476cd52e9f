"""The SFT samples of a run, encoded once and kept (`EncodedSamples`), and the next step's encoding done in worker
processes while the current step runs on the GPU (`Prefetch`)."""

from __future__ import annotations

from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any


class EncodedSamples:
    """Samples encoded once (chat template + image processor) and kept, so later epochs only pad and stack.

    Bounded by `max_bytes`: past it, samples are encoded on every use (same tensors, just slower). With
    `pixel_dtype` (the vision tower's dtype) pixel_values are kept in it: the tower casts them to its dtype first
    thing, so a bf16 model sees the same values from half the bytes (two 1280x704 screenshots: 21.6 MB, not 43).
    With `pin` (training on CUDA) kept pixel_values live in page-locked memory, so a batch's images go to the GPU
    as asynchronous copies straight from the kept tensors (training.data.PinnedRows), with no host-side concat."""

    def __init__(
        self,
        rows: list[dict[str, Any]],
        collator,
        max_bytes: int = 4 << 30,
        positions=None,
        pixel_dtype=None,
        pin: bool = False,
    ):
        self.rows, self.collator, self.max_bytes, self.positions = rows, collator, max_bytes, positions
        self.pixel_dtype = pixel_dtype
        self.slabs = None
        if pin:
            import torch

            if torch.cuda.is_available():
                from training.data import PinnedSlabs

                self.slabs = PinnedSlabs()
        self.cache: dict[int, dict[str, Any]] = {}
        self.n_targets: dict[int, int] = {}
        self.bytes, self.vision = 0, None  # vision: training.vision_cache.VisionFeatures (set by _train)
        self.lengths: dict[int, int] = {}
        self.spill: dict[int, dict[str, Any]] = {}  # a Prefetch's encodings past the bound, each used once

    def batch(self, idx: list[int], pin: bool = False, encs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return self.collator.pad(encs or [self.get(i) for i in idx], pin=pin)

    def packed(self, idx: list[int], pin: bool = False, encs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The samples as one packed row (training.packing.pack); needs `positions` (rope_positions_fn)."""
        from training.packing import pack

        if self.positions is None:
            raise ValueError(
                "packed batches need EncodedSamples(..., positions=rope_positions_fn(model)) (training.packing)"
            )
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

    def get(self, i: int) -> dict[str, Any]:
        """Sample i's encoding: kept from an earlier use or a Prefetch (one past the bound serves its step once),
        else encoded now."""
        got = self.cache.get(i)
        if got is None:
            got = self.spill.pop(i, None)
        if got is not None:
            return got
        got = self.collator.encode(self.rows[i])
        if self.pixel_dtype is not None and "pixel_values" in got:
            got["pixel_values"] = got["pixel_values"].to(self.pixel_dtype)
        return self.keep(i, got)

    def keep(self, i: int, got: dict[str, Any]) -> dict[str, Any]:
        """Add the sample's mRoPE positions (packing) and keep the encoding if the cache bound allows."""
        if self.positions is not None:  # packing: the sample's own multimodal RoPE positions
            got["position_ids"] = self.positions(got)
        size = sum(t.numel() * t.element_size() for t in got.values())
        if i not in self.cache and self.bytes + size <= self.max_bytes:
            self.cache[i], self.bytes = self.pinned(got), self.bytes + size
        return got

    def pinned(self, got: dict[str, Any]) -> dict[str, Any]:
        """`got` with its pixel_values moved to page-locked memory (with `pin`; kept encodings only)."""
        pv = got.get("pixel_values")
        if self.slabs is not None and pv is not None and not pv.is_pinned():
            got["pixel_values"] = self.slabs.copy(pv.contiguous())
        return got


class Prefetch:
    """Encodes the samples of the next step in worker processes, so the step that needs them finds them kept
    (EncodedSamples.keep) instead of running the chat template and the image processor between its GPU work.
    Processes, not threads: the image processor holds the GIL long enough that 8 threads made the first epoch
    2.5x slower than one (they starved the thread that launches the GPU work; docs/LOG.md, session 10).

        ahead = Prefetch(samples, workers=8)
        ahead.ready()                   # the samples queued for this step are kept (an encoding error is raised here)
        ahead.start([7, 3, 9])          # this rank's samples of the next step
        ahead.close()

    Each task carries its one row; a worker returns the tensors as raw bytes (not shared memory, which would hold
    a file descriptor per kept tensor). An encoding past the cache bound is held for its step's one use
    (EncodedSamples.spill) and then dropped, so the bound still holds and no sample is encoded twice for a step."""

    def __init__(self, samples: EncodedSamples, workers: int = 1):
        import multiprocessing
        import tempfile

        self.samples = samples
        self.folder = tempfile.TemporaryDirectory(prefix="sft-prefetch-")  # the processor, as the workers load it
        samples.collator.processor.save_pretrained(self.folder.name)
        self.pool = ProcessPoolExecutor(
            max(1, workers),
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_worker_init,
            initargs=(self.folder.name, samples.pixel_dtype),
        )
        self.pending: list[Future] = []

    def start(self, idx: list[int]) -> None:
        self.ready()
        todo = [i for i in dict.fromkeys(idx) if i not in self.samples.cache]
        self.pending = [self.pool.submit(_encode_one, i, self.samples.rows[i]) for i in todo]

    def ready(self) -> None:
        pending, self.pending = self.pending, []
        spill = {}
        for fut in pending:
            i, wire = fut.result()
            got = self.samples.keep(i, {k: _from_wire(*v) for k, v in wire.items()})
            if i not in self.samples.cache:
                spill[i] = got
        if pending:  # the previous step's spill was used by now
            self.samples.spill = spill

    def close(self) -> None:
        self.pending = []
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.folder.cleanup()


_WORKER: dict[str, Any] = {}


def _worker_init(folder: str, pixel_dtype) -> None:
    import torch

    from training.data import SFTCollator
    from training.tokenizer import load_processor

    torch.set_num_threads(1)  # one core each: the workers share the machine with the training process
    _WORKER.update(collator=SFTCollator(load_processor(folder)), dtype=pixel_dtype)


def _encode_one(i: int, row: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    got = _WORKER["collator"].encode(row)
    if _WORKER["dtype"] is not None and "pixel_values" in got:
        got["pixel_values"] = got["pixel_values"].to(_WORKER["dtype"])
    return i, {k: _to_wire(v) for k, v in got.items()}


def _to_wire(t) -> tuple[str, tuple[int, ...], Any]:
    import torch

    return str(t.dtype).removeprefix("torch."), tuple(t.shape), t.contiguous().view(-1).view(torch.uint8).numpy()


def _from_wire(dtype: str, shape: tuple[int, ...], raw) -> Any:
    import torch

    return torch.from_numpy(raw).view(getattr(torch, dtype)).view(shape)
