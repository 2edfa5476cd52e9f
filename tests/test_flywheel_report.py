"""benchmarks/flywheel_report.py: a report of seeds measured in different places (--merge)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import flywheel_report as fx  # noqa: E402
from flywheel_experiment import control_config  # noqa: E402


def _run(first: float, last: float, control: float, share: float) -> dict:
    return {
        "success": {"0": first, "1": (first + last) / 2, "2": last},
        "per_task": {"2": {"enter-text": 1.0, "login-user": 0.5}},
        "dataset": {"2": {"student_share": share}},
        "control": {"success": control},
    }


def _report(path: Path, runs: dict[str, dict], wall: dict[str, float]) -> str:
    path.write_text(json.dumps({"runs": runs, "wall_s": wall}))
    return str(path)


def test_merged_seeds_join_the_statistics_and_the_verdict(tmp_path):
    early = _report(tmp_path / "a.json", {"0": _run(0.5, 0.7, 0.55, 0.6)}, {"s0": 100.0, "c0": 50.0, "s9": 1.0})
    later = _report(tmp_path / "b.json", {"1": _run(0.6, 0.9, 0.7, 0.4)}, {"s1": 200.0})
    runs, walls = fx.merged_runs([early, later], tmp_path / "root")
    assert walls == {"s0": 100.0, "c0": 50.0, "s1": 200.0}  # only the merged seeds' arms
    assert runs["0"]["merged_from"] == early and runs["1"]["merged_from"] == later

    out = fx.summarize(tmp_path / "root", [0, 1], 3, True, runs)
    assert out["seeds"] == [0, 1]
    assert out["verdict"]["0"]["gain_points"] == 20.0 and out["verdict"]["0"]["vs_control_points"] == 15.0
    assert out["verdict"]["1"]["gain_points"] == 30.0 and out["verdict"]["1"]["vs_control_points"] == 20.0
    assert out["per_iteration"]["2"]["mean"] == 0.8 and out["per_iteration"]["2"]["n"] == 2
    assert out["control"]["mean"] == 0.625
    assert out["targets"]["iteration_last_vs_first_plus_15"] is True
    assert out["targets"]["iteration_last_vs_control_plus_10"] is True
    assert out["targets"]["student_share_last_at_least_half"] is False  # seed 1's 40%
    assert out["targets"]["enter_text_and_login_user_above_0"] is True
    # the most each margin could be (iteration 3 at 100%): seed 1's control at 70% leaves 30 points
    assert out["verdict"]["1"]["gain_points_max"] == 40.0 and out["verdict"]["1"]["vs_control_points_max"] == 30.0
    assert out["reachable"] == {"iteration_last_vs_first_plus_15": True, "iteration_last_vs_control_plus_10": True}
    # a control at 92.5% leaves 7.5 points: +10 over it cannot be met, whatever the flywheel does
    high = fx.summarize(tmp_path / "root", [0], 3, True, {"0": _run(0.8, 0.9, 0.925, 0.6)})
    assert high["verdict"]["0"]["vs_control_points_max"] == 7.5
    assert high["reachable"] == {"iteration_last_vs_first_plus_15": True, "iteration_last_vs_control_plus_10": False}


def test_a_seed_measured_here_is_not_replaced_and_one_in_two_reports_is_an_error(tmp_path):
    root = tmp_path / "root"
    (root / "s0").mkdir(parents=True)  # seed 0's lake is here: its report entry is not merged
    a = _report(tmp_path / "a.json", {"0": _run(0.5, 0.7, 0.55, 0.6), "1": _run(0.6, 0.9, 0.7, 0.4)}, {})
    runs, _ = fx.merged_runs([a], root)
    assert list(runs) == ["1"]
    b = _report(tmp_path / "b.json", {"1": _run(0.1, 0.2, 0.3, 0.4)}, {})
    with pytest.raises(SystemExit, match="seed 1 is in two reports"):
        fx.merged_runs([a, b], root)
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(SystemExit, match="bad.json: not a report"):
        fx.merged_runs([str(tmp_path / "bad.json")], root)


def test_the_copy_task_target_counts_only_the_copy_tasks_an_experiment_scores(tmp_path):
    """flywheel8's enter-text and login-user must be above 0; an experiment without them (configs/flywheel4.yaml)
    has no such target (None), and a copy task at 0 on any seed fails it."""
    four = _run(0.6, 0.8, 0.7, 0.6)
    four["per_task"] = {"0": {"click-button": 0.2}, "2": {"click-button": 0.4}}
    out = fx.summarize(tmp_path / "root", [0], 3, True, {"0": four})
    assert out["verdict"]["0"]["copy_tasks_last"] == {}
    assert out["targets"]["enter_text_and_login_user_above_0"] is None
    zero = _run(0.6, 0.8, 0.7, 0.6)
    zero["per_task"] = {"0": {"login-user": 0.5}, "2": {"enter-text": 1.0}}  # login-user scored, absent at the end
    out = fx.summarize(tmp_path / "root", [0, 1], 3, True, {"0": _run(0.6, 0.8, 0.7, 0.6), "1": zero})
    assert out["verdict"]["1"]["copy_tasks_last"] == {"enter-text": 1.0, "login-user": None}
    assert out["targets"]["enter_text_and_login_user_above_0"] is False


def test_the_control_trains_exactly_the_flywheels_steps_however_few_its_demos():
    """The equal-compute control: one SFT of as many optimizer steps as the flywheel spent. Its config's epochs
    (50 in configs/flywheel4.yaml) must not stop it early on few demos: 80 demos at batch 16 gave 250 of 360."""
    import yaml

    from configs.models import FlywheelConfig
    from training.sft_run import plan_steps

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "flywheel4.yaml").read_text())
    assert plan_steps(80, FlywheelConfig.model_validate(cfg).sft)[0] == 120  # an iteration: max_steps binds
    control = FlywheelConfig.model_validate(control_config(cfg, 360))
    assert control.iterations == 1 and not control.rl.enabled and not control.curriculum.enabled
    for n in (1, 80, 5000):
        assert plan_steps(n, control.sft)[0] == 360, n
