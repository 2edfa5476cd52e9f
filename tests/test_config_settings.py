"""The trainers read their config sections: every field of RLConfig / SFTConfig has a reader (a settings field or
the stage's, listed once in RL_STAGE_FIELDS / SFT_STAGE_FIELDS), and a field without one is an error."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from pydantic import Field

from configs.algorithms import ALGORITHMS
from configs.loading import load_config
from configs.models import SFT_STAGE_FIELDS, ConfigError, SFTConfig, choices, settings_from
from configs.rl import RL_STAGE_FIELDS, RLConfig
from training.rl_settings import RLSettings
from training.sft import TrainSettings

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
# settings fields from_config resolves from other sections (their dataclass default is a stand-in), and rounds:
# a bare RLSettings is one round's update (the clone steps' cosine spans 1 round), the config's default is 4
RL_DEFAULTS_DIFFER = {"temperature", "clone_tasks", "rounds"}


class RLConfigPlus(RLConfig):
    new_knob: int = Field(1, description="a knob added to the config without a reader")


class SFTConfigPlus(SFTConfig):
    new_knob: int = Field(1, description="a knob added to the config without a reader")


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_todays_configs_load_and_convert(path):
    cfg = load_config(path)
    for algo in ALGORITHMS:
        s = RLSettings.from_config(cfg, algo)
        assert s.algorithm == algo and s.lr == cfg.rl.lr and s.focus_tasks
    for section in (cfg.sft, cfg.midtrain.sft):
        s = TrainSettings.from_config(section)
        assert (s.method, s.lr, s.max_steps) == (section.method, section.lr, section.max_steps)


def test_a_config_field_without_a_reader_is_an_error(monkeypatch):
    cfg = load_config(ROOT / "configs" / "tiny.yaml")
    plus = cfg.model_copy(update={"rl": RLConfigPlus(**cfg.rl.model_dump())})
    with pytest.raises(ConfigError, match=r"^RLConfigPlus field\(s\) new_knob: nothing reads them") as e:
        RLSettings.from_config(plus)
    assert "\n" not in str(e.value)  # one line
    with pytest.raises(ConfigError, match=r"^SFTConfigPlus field\(s\) new_knob: nothing reads them"):
        TrainSettings.from_config(SFTConfigPlus())
    # a field the stage reads itself is fine once it is listed with the stage's fields
    want_rl, want_sft = RLSettings.from_config(cfg), TrainSettings.from_config(SFTConfig())
    monkeypatch.setattr("training.rl_settings.RL_STAGE_FIELDS", RL_STAGE_FIELDS | {"new_knob"})
    monkeypatch.setattr("training.sft.SFT_STAGE_FIELDS", SFT_STAGE_FIELDS | {"new_knob"})
    got = RLSettings.from_config(plus)
    assert dataclasses.replace(got, config_hash=want_rl.config_hash) == want_rl  # the hash covers the new field
    assert TrainSettings.from_config(SFTConfigPlus()) == want_sft


def test_a_stage_field_the_config_lacks_is_an_error():
    with pytest.raises(ConfigError, match="has no field.* gone"):
        settings_from(RLConfig(), RLSettings, RL_STAGE_FIELDS | {"gone"})


@pytest.mark.parametrize(
    "model, settings, stage, differ",
    [(RLConfig, RLSettings, RL_STAGE_FIELDS, RL_DEFAULTS_DIFFER), (SFTConfig, TrainSettings, SFT_STAGE_FIELDS, set())],
)
def test_settings_mirror_the_config(model, settings, stage, differ):
    """Each config field is read once (the trainer's settings or the stage, not both), and a settings field's default
    is the config's, so a bare settings object trains what the default config trains."""
    fields = {f.name: f for f in dataclasses.fields(settings)}
    assert not stage & set(fields), "a field read by both the stage and the trainer: list it in one place"
    assert set(model.model_fields) <= set(fields) | stage
    for name, info in model.model_fields.items():
        if name in fields and name not in differ:
            f = fields[name]
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            assert default == info.get_default(call_default_factory=True), name


@pytest.mark.parametrize("section, fields", [("rl", RL_STAGE_FIELDS), ("sft", SFT_STAGE_FIELDS)])
def test_stage_fields_are_read_by_a_stage(section, fields):
    """RL_STAGE_FIELDS / SFT_STAGE_FIELDS name what the stage code reads itself (as `<section>.<field>`)."""
    code = "\n".join(
        p.read_text() for d in ("flywheel", "flows", "tasks", "training") for p in (ROOT / d).rglob("*.py")
    )
    unread = [f for f in sorted(fields) if not re.search(rf"\b{section}\.{f}\b", code)]
    assert not unread, f"{section} stage fields nobody reads: {unread}"


def test_algorithms_are_named_once():
    assert choices(RLConfig, "algorithm") == tuple(ALGORITHMS)
    for name, text in ALGORITHMS.items():
        assert f"{name} ({text})" in RLConfig.model_fields["algorithm"].description
    with pytest.raises(ValueError, match="rl algorithm must be one of grpo, dr_grpo, gspo, sdpo"):
        RLSettings(algorithm="ppo")
    with pytest.raises(ValueError, match="rl adv_mode must be one of None, zscore, mean"):
        RLSettings(adv_mode="median")


def test_a_config_extends_another_and_states_only_its_changes(tmp_path):
    (tmp_path / "parent").mkdir()
    (tmp_path / "parent" / "base.yaml").write_text(
        (ROOT / "configs" / "tiny.yaml").read_text() + "\nsft:\n  lr: 0.002\n  max_steps: 7\n"
    )
    child = tmp_path / "child.yaml"  # the parent's path is relative to the child's folder, not the cwd
    child.write_text(
        "extends: parent/base.yaml\nname: child\nsft:\n  max_steps: 9\n"
        "rollouts:\n  selection:\n    tasks: [click-test]\n"
    )
    base, cfg = load_config(tmp_path / "parent" / "base.yaml"), load_config(child)
    assert cfg.name == "child" and base.name != "child"
    assert (cfg.sft.max_steps, cfg.sft.lr) == (9, 0.002)  # a mapping merges key by key
    assert cfg.rollouts.selection.tasks == ["click-test"] != base.rollouts.selection.tasks  # a list replaces
    assert cfg.rollouts.selection.seeds_per_task == base.rollouts.selection.seeds_per_task
    assert cfg.model_dump(exclude={"name", "sft", "rollouts"}) == base.model_dump(exclude={"name", "sft", "rollouts"})
    grandchild = tmp_path / "grandchild.yaml"  # a chain, with an override on top
    grandchild.write_text("extends: child.yaml\nsft:\n  lr: 0.003\n")
    g = load_config(grandchild, {"sft.max_steps": 11})
    assert (g.name, g.sft.lr, g.sft.max_steps, g.rollouts.selection.tasks) == ("child", 0.003, 11, ["click-test"])


def test_flywheel8m_is_flywheel4_with_eight_tasks_and_its_own_base():
    m, four = load_config(ROOT / "configs" / "flywheel8m.yaml"), load_config(ROOT / "configs" / "flywheel4.yaml")
    assert len(m.evaluate.selection.tasks) == len(m.bootstrap.selection.tasks) == 8
    assert (m.student, m.sft, m.curate, m.rl) == (four.student, four.sft, four.curate, four.rl)
    assert m.midtrain.sft.max_steps == 3000 and m.midtrain.sft.lr == four.midtrain.sft.lr


@pytest.mark.parametrize(
    "files, error",
    [
        ({"a.yaml": "extends: missing.yaml\n"}, "missing.yaml: config file not found (extended by {d}/a.yaml)"),
        ({"a.yaml": "extends: b.yaml\n", "b.yaml": "extends: a.yaml\n"}, "its extends chain loops back to it"),
        ({"a.yaml": "extends: 3\n"}, "a.yaml: extends: expected the path of another config file, got 3"),
        (
            {"a.yaml": "extends: b.yaml\n", "b.yaml": "- 1\n"},
            "b.yaml: the top level must be a mapping of keys, got list",
        ),
        ({"a.yaml": "extends: b.yaml\n", "b.yaml": "sft: [\n"}, "b.yaml: invalid YAML (line 2"),
        (
            {"a.yaml": "extends: b.yaml\n", "b.yaml": "sft:\n  lr: fast\n"},
            "a.yaml (extends {d}/b.yaml): sft.lr: Input should be a valid",
        ),
    ],
    ids=["missing", "loop", "not-a-path", "not-a-mapping", "bad-yaml", "bad-value"],
)
def test_a_bad_extends_is_one_error_naming_the_files(tmp_path, files, error):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "a.yaml")
    assert error.format(d=tmp_path) in str(e.value)
