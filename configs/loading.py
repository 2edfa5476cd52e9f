"""Reading a YAML config into a validated FlywheelConfig (configs.models holds the models themselves).

    cfg = load_config("configs/local.yaml", {"lake.root": "/tmp/lake"})   # ConfigError names file, key and expectation
    data = read_config_data("configs/flywheel8m.yaml")                     # its `extends:` chain resolved, unvalidated

A config may name another with `extends: <file>` (relative to its own folder) and state only what differs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from configs.models import ConfigError, FlywheelConfig


def _loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "<root>"


def format_validation_error(path: Path | str, e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        key = _loc(err["loc"])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; `flywheel config show` lists the valid keys)"
        elif "input" in err and err["type"] not in ("missing",) and not isinstance(err["input"], dict):
            msg = f"{msg} (got {err['input']!r})"
        lines.append(f"{path}: {key}: {msg}")
    return "\n".join(lines)


def parse_config(data: Any, source: str = "<config>") -> FlywheelConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys, got {type(data).__name__}")
    try:
        return FlywheelConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(source, e)) from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> FlywheelConfig:
    """Load and validate a YAML config; `overrides` are dotted keys, e.g. {"rollout.envs": 1}."""
    p = Path(path)
    chain: list[Path] = []
    data = _read_extending(p, chain)
    source = str(p) if len(chain) < 2 else f"{p} (extends {' -> '.join(str(f) for f in chain[1:])})"
    if isinstance(data, dict):
        apply_overrides(data, overrides, source)
    return parse_config(data, source)


def read_config_data(path: str | Path) -> Any:
    """A config file's YAML as data, with its `extends: <file>` resolved.

    The named file (relative to this one's folder) is read the same way first, and this file's keys are laid over
    it: a mapping merges key by key, anything else (a list, a scalar, null) replaces the parent's value. So a config
    that differs from another in a few keys states only those."""
    return _read_extending(Path(path), [])


def _read_extending(p: Path, chain: list[Path]) -> Any:
    """`read_config_data` of `p`, which the files in `chain` extend, each the one before it; appends `p` to `chain`."""
    via = f" (extended by {' <- '.join(str(c) for c in reversed(chain))})" if chain else ""
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found{via}")
    if p.resolve() in {c.resolve() for c in chain}:
        loop = " -> ".join(str(c) for c in (*chain, p))
        raise ConfigError(f"{p}: its extends chain loops back to it ({loop})")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"{p}: invalid YAML{where}: {getattr(e, 'problem', e)}{via}") from None
    if chain and not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of keys, got {type(data).__name__}{via}")
    chain.append(p)
    if not isinstance(data, dict) or "extends" not in data:
        return data
    parent = data.pop("extends")
    if not isinstance(parent, str) or not parent.strip():
        raise ConfigError(f"{p}: extends: expected the path of another config file, got {parent!r}")
    return merge_config_data(_read_extending(p.parent / parent, chain), data)


def merge_config_data(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` laid on `base` (neither is changed): mappings merge key by key, any other value replaces."""
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merge_config_data(out[key], value) if both else value
    return out


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any] | None, source: str = "config") -> dict[str, Any]:
    """Set dotted keys (e.g. {"rollout.envs": 1}) in a raw config mapping, in place; returns it."""
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for k in parents:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{source}: cannot override {dotted}: {k} is not a mapping")
        node[leaf] = value
    return data


def default_config_path() -> Path:
    return Path(__file__).with_name("local.yaml")
