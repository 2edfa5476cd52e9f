"""Training elsewhere, recorded here: fingerprints of what a run trained on, and the adoption of a finished run.

A lake's SFT stage can be trained on another machine (a GPU box without the lake, DuckDB or Prefect):
`flywheel stage sft --plan` prints the export, the base and the settings; `python -m training.sft` trains there;
`flywheel stage sft --adopt <its folder>` brings the run back. Adoption checks the run against the stage it
stands in for, then files it under the checkpoint id the stage would have trained, so every later stage (and a
rerun of this one) treats it as trained here:

- the settings: every keyed field (configs.runkeys.keyed) equal to the stage's;
- the data: the sha256 of the export file the run read equal to this lake's export (`data_sha256`, recorded by
  training.sft);
- the base: the sha256 of its tensors equal to this lake's base (`base_sha256`; for a Hub id, the same id).

The run's own metrics come along (steps, losses, the device it ran on), with `adopted_from`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from configs.runkeys import keyed

CHUNK = 1 << 20


def file_digest(path: str | Path) -> str:
    """sha256 of a file's bytes (of a folder's files, by relative path, in name order)."""
    path = Path(path)
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        if path.is_dir():
            h.update(str(f.relative_to(path)).encode() + b"\0")
        with f.open("rb") as fh:
            while block := fh.read(CHUNK):
                h.update(block)
    return h.hexdigest()


def weights_digest(model: str | Path) -> str | None:
    """sha256 over a model folder's tensors: name, dtype, shape and bytes of each, in name order, from its
    *.safetensors files. Equal weights give equal digests whatever the shard layout or file metadata. None for
    a Hub id or a folder without safetensors."""
    import torch
    from safetensors import safe_open

    folder = Path(model)
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        return None
    h = hashlib.sha256()
    with contextlib.ExitStack() as stack:  # each file opened once (a large model has hundreds of tensors a shard)
        where = {}
        for f in files:
            st = stack.enter_context(safe_open(str(f), framework="pt"))
            where.update((k, st) for k in st.keys())
        for name in sorted(where):
            t = where[name].get_tensor(name)
            h.update(f"{name}\0{str(t.dtype).removeprefix('torch.')}\0{tuple(t.shape)}\0".encode())
            h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class AdoptError(ValueError):
    """A run that cannot stand in for the stage: what differs, in one message."""


def adopt_run(folder: str | Path, out: Path, settings: Any, export_file: Path, base: str, result_file: str) -> dict:
    """Check the finished run in `folder` against the stage's settings, export and base, then copy it (without
    its resumable state/) into `out` (a partial run there is replaced). Returns the run's metrics."""
    folder = Path(folder)
    done = folder / result_file
    if not done.exists():
        raise FileNotFoundError(f"{folder} is not a finished training run: it has no {result_file}")
    metrics = json.loads(done.read_text())
    problems = []
    try:
        theirs = keyed(type(settings)(**metrics.get("settings", {})))  # the stage's settings class
    except TypeError as e:  # a field this version does not know
        raise AdoptError(f"{done}: its settings are not this version's ({e})") from None
    ours = keyed(settings)
    differ = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
    if differ:
        problems.append(
            "its settings differ: " + ", ".join(f"{k}={theirs.get(k)!r} (the stage's: {ours.get(k)!r})" for k in differ)
        )
    if "data_sha256" not in metrics:
        problems.append("it does not record its data (trained by an older version): train it again")
    elif metrics["data_sha256"] != file_digest(export_file):
        problems.append(f"it trained on other data than {export_file} (sha256 differs)")
    here = weights_digest(base)
    if here is None and metrics.get("base_model") != base:
        problems.append(f"it started from {metrics.get('base_model')!r}, the stage from {base!r}")
    elif here is not None and metrics.get("base_sha256") != here:
        problems.append(f"it started from other weights than {base} (sha256 of the tensors differs)")
    if problems:
        raise AdoptError(f"cannot adopt {folder}: " + "; ".join(problems))
    # the row names this lake's base (the run's path was on the other machine); the copy's result file says so
    # too, since a rerun of the stage rebuilds the row from it
    metrics.update(adopted_from=str(folder.resolve()), trained_base_model=metrics.get("base_model"), base_model=base)
    staging = out.with_name(out.name + ".adopting")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(folder, staging, ignore=shutil.ignore_patterns("state", result_file))
    (staging / result_file).write_text(json.dumps(metrics, indent=1, default=str))
    if out.exists():  # a partial (or stale) run of the same checkpoint id: the finished one replaces it
        shutil.rmtree(out)
    staging.rename(out)
    return metrics
