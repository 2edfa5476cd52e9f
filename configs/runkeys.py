"""Run keys: the one rule that turns a run's inputs into its id, and the marker for the config fields that must not
change one.

    run_key("curate-it1", {"curate": keyed(cfg.curate), "arch": ...})      # -> "curate-it1-1d85b16819"
    packing: bool = Field(False, description=..., json_schema_extra=RUNTIME)  # configs/models.py: not in any key

The same inputs give the same key, so a rerun finds its finished run (or resumes it, or replaces its rows) instead
of adding another. A RUNTIME field changes how a run executes, not what it produces: processes, packing, caches and
worker counts, a test's delay. `keyed` leaves those fields out, so changing one resumes the run. A KEYED_IF_SET field
(an option added after lakes exist) is keyed only when set to other than its default, so adding it renames no
existing run. The wall-clock caps
(sft.max_minutes, rl.max_minutes) are keyed: a capped run trains a different (shorter) schedule.

The ids and what each hashes (tests/test_runkeys.py pins them for configs/tiny.yaml and configs/flywheel8.yaml):
- `curate-it<N>-…` (training.curation.dataset_id_for): keyed(cfg.curate) and the student's arch, history_images and
  use_ui_text (the prompt the export builds).
- `midtrain-…` (flywheel.midtrain.dataset_id_for): the corpus run key, the student's prompt fields and
  midtrain.episodes_per_task.
- `sft-it<N>-…` / `base-…` (training.sft_stage.checkpoint_id_for): the dataset id, its sorted episode ids and step
  count, the base (lake-relative) and keyed(TrainSettings). RUNTIME there: SFTConfig's distributed, nproc, packing,
  pack_tokens, encode_cache_gib, encode_workers, vision_cache and micro_batch, and TrainSettings' own keep_state,
  step_sleep_s and record_step_times. sft.output_root is the stage's (where the checkpoint goes), never a setting.
- `rl-it<N>-<algo>-…` (flywheel.rl_stage.rl_run_id): the base, the algorithm, keyed(cfg.rl) (RUNTIME: distributed,
  nproc), the tasks RL samples and the whole student section.
- `<stage>-it<N>-…`, a rollout run (flywheel.stages.run_key_for, from rollout_spec): the policy spec (the student
  section whole), tasks, seeds, group size, split and the env's identity. The env part is chosen by env kind, not
  by a field marker: miniwob keys name, screenshot_scale and the browser binaries; remote only name and
  screenshot_scale (which servers run the episodes and how long a reset waits for one are not in it); env.max_steps
  is in no key.
Every one of them is `run_key(prefix, payload)`: sha1 of the payload as sorted-key JSON, 10 hex characters.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

RUNTIME: dict[str, Any] = {"runtime": True}  # pydantic Field(json_schema_extra=RUNTIME), dataclass field(metadata=)
# An option added to a keyed section after lakes exist: at its default it stays out of the key (the runs it does not
# change keep their ids, so an existing lake resumes instead of redoing them); set otherwise, it is keyed.
KEYED_IF_SET: dict[str, Any] = {"keyed_if_set": True}
KEY_HEX = 10  # hex characters of the hash in a key


def run_key(prefix: str, payload: Any) -> str:
    """`<prefix>-<hash>`: sha1 of `payload` as JSON with sorted keys (values JSON does not know as str)."""
    blob = json.dumps(payload, sort_keys=True, default=str)
    return f"{prefix}-{hashlib.sha1(blob.encode()).hexdigest()[:KEY_HEX]}"


def _marked(extra: Any, marker: str = "runtime") -> bool:
    return isinstance(extra, dict) and extra.get(marker) is True


def runtime_fields(obj: Any) -> frozenset[str]:
    """The RUNTIME field names of a pydantic model (class or instance) or a settings dataclass; a dataclass also
    takes those of the config model it is read from (its CONFIG_MODEL), so each field is marked in one place."""
    cls = obj if isinstance(obj, type) else type(obj)
    if hasattr(cls, "model_fields"):
        return frozenset(k for k, f in cls.model_fields.items() if _marked(f.json_schema_extra))
    if dataclasses.is_dataclass(cls):
        own = {f.name for f in dataclasses.fields(cls) if _marked(dict(f.metadata))}
        source = getattr(cls, "CONFIG_MODEL", None)
        return frozenset(own | (runtime_fields(source) if source is not None else set()))
    raise TypeError(f"runtime_fields takes a pydantic model or a dataclass, got {cls.__name__}")


def at_default_if_set_only(obj: Any) -> set[str]:
    """The KEYED_IF_SET fields of a pydantic model instance that hold their default."""
    fields = getattr(type(obj), "model_fields", {})
    return {
        k for k, f in fields.items() if _marked(f.json_schema_extra, "keyed_if_set") and getattr(obj, k) == f.default
    }


def keyed(obj: Any) -> dict[str, Any]:
    """What of a config section or settings dataclass goes into a run key: every field but the RUNTIME ones and the
    KEYED_IF_SET ones at their default (a pydantic model dumped as JSON values, a dataclass as dataclasses.asdict)."""
    skip = runtime_fields(obj)
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json", exclude=set(skip) | at_default_if_set_only(obj))
    return {k: v for k, v in dataclasses.asdict(obj).items() if k not in skip}
