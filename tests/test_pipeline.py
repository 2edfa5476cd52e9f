"""The stage registry (flywheel/pipeline.py) and everything derived from it.

A toy stage registered in one line inside a test gets a Prefect task, a flow (`flows.stages:toy`), a
`flywheel stage toy` command, its stats artifact and lake link, a prefect.yaml deployment and a place in the
parent's iteration: nothing else is edited. The `registry` fixture puts the registry and the derived flows and
tasks back afterwards. StageResult is checked as a Mapping, for pickling (how Prefect persists results) and JSON.
"""

from __future__ import annotations

import inspect
import json
import pickle
import re
from pathlib import Path

import cloudpickle
import pytest
import yaml

from flywheel import pipeline
from flywheel.pipeline import (
    StageResult,
    episodes_result,
    get_stage,
    register,
    skipped_result,
    stage_names,
    stage_result,
    trained_result,
)
from tasks.common import ConfigRef

ROOT = Path(__file__).resolve().parents[1]


def toy(cfg, iteration: int, checkpoint: str | None = None, *, progress: bool = True) -> StageResult:
    """A stage that writes nothing: its outputs say what it was given."""
    return stage_result("toy", iteration, {"run_key": f"toy-it{iteration}", "given": checkpoint, "progress": progress})


@pytest.fixture
def registry():
    """Registers nothing itself; afterwards the registry and the flows/tasks built from it are as before."""
    import flows.stages
    import tasks.stages

    saved = list(pipeline.STAGES)
    yield pipeline
    pipeline.STAGES[:] = saved
    flows.stages._FLOWS.clear()
    tasks.stages._TASKS.clear()
    assert "toy" not in stage_names()


def tiny_ref(tmp_path: Path) -> ConfigRef:
    return ConfigRef(path=str(ROOT / "configs" / "tiny.yaml"), overrides={"lake.root": str(tmp_path / "lake")})


# ------------------------------------------------------------------------------------------------ the result
def test_stage_result_is_a_read_only_mapping_with_typed_fields():
    res = trained_result("sft", 2, {"checkpoint_id": "ck", "path": "/c/ck", "model_path": "/c/ck/merged", "skipped": 1})
    assert res["checkpoint_id"] == "ck" and res.get("nope") is None and dict(res)["path"] == "/c/ck"
    assert (res.stage, res.iteration, res.checkpoint, res.rows, res.reused, res.skipped) == (
        "sft",
        2,
        "/c/ck/merged",
        1,
        True,
        None,
    )
    assert "skipped" not in res  # the trainer's reuse flag is `reused` now
    with pytest.raises(TypeError):
        res["x"] = 1  # type: ignore[index]
    with pytest.raises(AttributeError):
        res.checkpoint = "other"  # type: ignore[misc]


def test_constructors_say_what_each_kind_of_stage_did():
    from flywheel.runtime.spec import RolloutSummary

    summary = RolloutSummary("rk", total=4, skipped=1, ran=3, successes=2, steps=9, errors=0, duration_s=1.0)
    ep = episodes_result("rollouts", 1, "rk", summary, checkpoint="student")
    assert ep.rows == 3 and ep["skipped"] == 1 and ep.skipped is None and ep["checkpoint"] == "student"
    assert ep.checkpoint is None  # rollouts use a model, they do not hand one on
    assert "ran 3 episodes (1 already in the lake), 2 successes" in ep.summary()
    sk = skipped_result("rl", 1, "rl.enabled is false", checkpoint="/c/sft")
    assert sk.skipped == "rl.enabled is false" and sk.checkpoint == "/c/sft" and sk.summary().startswith("skipped")


@pytest.mark.parametrize("dumps,loads", [(pickle.dumps, pickle.loads), (cloudpickle.dumps, pickle.loads)])
def test_stage_result_pickles_and_prints_as_json(dumps, loads):
    res = stage_result("curate", 0, {"dataset_id": "d", "source_counts": {"by_task": {"a": 1}}}, rows=1).timed(2.0)
    back = loads(dumps(res))
    assert back == res and back["source_counts"]["by_task"] == {"a": 1} and back.wall_s == 2.0
    data = json.loads(json.dumps(res.to_dict()))
    assert data["outputs"]["dataset_id"] == "d" and data["rows"] == 1 and data["stage"] == "curate"


# ------------------------------------------------------------------------------------------------ the registry
def test_the_registry_lists_the_stages_in_pipeline_order():
    assert stage_names() == ["midtrain", "bootstrap", "rollouts", "curate", "sft", "rl", "evaluate"]
    assert {s.name: s.pool for s in pipeline.STAGES if s.pool == "gpu"} == {"sft": "gpu", "rl": "gpu"}
    assert [p.name for p in get_stage("sft").parameters()] == ["dataset_id", "base"]
    assert get_stage("sft").parameters()[0].required and not get_stage("sft").parameters()[1].required
    assert [p.name for p in get_stage("midtrain").parameters()] == [] and not get_stage("midtrain").takes_iteration
    for s in pipeline.STAGES:  # every function resolves and documents its inputs
        assert callable(s.fn()) and s.description and all(p.description for p in s.parameters()), s.name
    with pytest.raises(KeyError, match="no stage 'nope'; the registered stages: midtrain, bootstrap"):
        get_stage("nope")


def test_a_stage_must_return_a_stage_result(registry, tmp_path):
    register("toy", lambda cfg, iteration: {"run_key": "x"})
    with pytest.raises(TypeError, match="returned dict, not a StageResult"):
        get_stage("toy")(tiny_ref(tmp_path).load(), 0)
    with pytest.raises(TypeError, match="has no input"):
        register("toy", toy)(tiny_ref(tmp_path).load(), 0, dataset_id="d")


# ------------------------------------------------------------------------------------------------ a new stage
def test_every_stage_gets_a_task_and_a_flow():
    """Each registered stage's task and flow build (required inputs such as sft's dataset_id come first)."""
    from flows.flywheel import STAGE_FLOWS
    from tasks.stages import stage_task

    for name in stage_names():
        assert stage_task(name).name == name and STAGE_FLOWS[name].name == name
    assert list(STAGE_FLOWS["sft"].parameters.model_dump()["properties"])[:3] == ["dataset_id", "config", "iteration"]
    assert STAGE_FLOWS["sft"].parameters.model_dump()["required"] == ["dataset_id"]
    assert list(inspect.signature(stage_task("sft").fn).parameters) == ["config", "iteration", "dataset_id", "base"]


def test_a_new_stage_gets_task_flow_cli_artifact_and_deployment(registry, tmp_path, monkeypatch):
    monkeypatch.delenv("FLYWHEEL_LAKE", raising=False)
    register("toy", toy, description="A toy stage.", inputs={"checkpoint": "Model folder."}, table="episodes")

    # the Prefect task: named after the stage, the stage's inputs as its parameters
    from tasks.stages import stage_task

    task = stage_task("toy")
    assert task.name == "toy" and list(inspect.signature(task.fn).parameters) == ["config", "iteration", "checkpoint"]
    res = task.fn(tiny_ref(tmp_path), 3, checkpoint="ck")
    assert isinstance(res, StageResult) and res["given"] == "ck" and res["progress"] is False and res.wall_s >= 0

    # the flow: importable as prefect.yaml's entrypoint names it, with the UI's parameter descriptions
    import flows.stages
    from flows.flywheel import DEPLOYMENTS, STAGE_FLOWS

    fl = flows.stages.toy
    assert fl is STAGE_FLOWS["toy"] and fl.name == "toy" and fl.description.startswith("A toy stage.")
    props = fl.parameters.model_dump()["properties"]
    assert list(props) == ["config", "iteration", "checkpoint", "refresh"]
    assert props["checkpoint"]["description"] == "Model folder." and all(p.get("description") for p in props.values())

    # the deployment: `toy/cpu`, in the prefect.yaml the registry gives (in memory: the committed file is unchanged)
    from flows.deployments import PREFECT_YAML, render

    assert DEPLOYMENTS["toy"] == "toy/cpu" and "toy" in list(DEPLOYMENTS)
    dep = next(d for d in yaml.safe_load(render())["deployments"] if d["entrypoint"] == "flows.stages:toy")
    assert dep["name"] == "cpu" and dep["work_pool"]["name"] == "cpu" and "stage:toy" in dep["tags"]
    assert "flows.stages:toy" not in PREFECT_YAML.read_text()

    # the CLI: `flywheel stage toy`, options from the stage's parameters
    from typer.testing import CliRunner

    from flywheel.cli.stage import stage_app

    cli = CliRunner().invoke(
        stage_app(), ["toy", "-i", "2", "--checkpoint", "ck", "-c", str(ROOT / "configs/tiny.yaml")]
    )
    assert cli.exit_code == 0, cli.output
    assert cli.output.startswith("toy: ") and "toy-it2" in cli.output
    assert "--checkpoint" in CliRunner().invoke(stage_app(), ["toy", "--help"]).output

    # the artifact's rows and links: any registered stage, no per-stage code
    from tasks.artifacts import lake_links, stage_stats

    cfg = tiny_ref(tmp_path).load()
    assert stage_stats(cfg, "toy", res) == [{"run_key": "toy-it3", "given": "ck", "progress": False}]
    (link,) = [t for t, _ in lake_links(cfg, "toy", 3, res)]
    assert re.fullmatch(r"lake: episodes, iteration 3, stage toy \(snapshot \d+\)", link), link


def test_a_new_stage_runs_in_the_flywheel_after_the_stage_it_names(registry, prefect_api, tmp_path, monkeypatch):
    """`run_after="curate"`: each iteration runs it after curate, handing it the iteration's checkpoint by name."""
    import flows.flywheel as fw

    monkeypatch.delenv("FLYWHEEL_LAKE", raising=False)
    register("toy", toy, description="A toy stage.", run_after="curate")
    calls = []

    def call_stage(name, config, iteration, mode, refresh, **inputs):
        calls.append((name, inputs))
        out = {"curate": {"dataset_id": "ds"}, "evaluate": {"success_rate": 0.5, "ci_low": 0.1, "ci_high": 0.9}}
        if name == "sft":
            return trained_result(name, iteration, {"checkpoint_id": "ck", "model_path": "/ck/merged"})
        return stage_result(name, iteration, out.get(name, {"run_key": f"{name}-k"}))

    monkeypatch.setattr(fw, "call_stage", call_stage)
    out = fw.flywheel(config=tiny_ref(tmp_path), iterations=1, checkpoint="/start")
    names = [n for n, _ in calls]
    assert names[names.index("curate") + 1] == "toy" and dict(calls)["toy"] == {"checkpoint": "/start"}
    assert out[0]["stages"]["toy"]["run_key"] == "toy-k"


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    from prefect.settings import (
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        PREFECT_RESULTS_LOCAL_STORAGE_PATH,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    results = tmp_path_factory.mktemp("prefect-results")
    with prefect_test_harness(server_startup_timeout=120):
        with temporary_settings(
            {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None, PREFECT_RESULTS_LOCAL_STORAGE_PATH: str(results)}
        ):
            yield


@pytest.mark.flow
def test_the_toy_flow_runs_and_publishes_its_artifacts(registry, prefect_api, tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    import flows.stages

    monkeypatch.delenv("FLYWHEEL_LAKE", raising=False)
    register("toy", toy, description="A toy stage.", table="episodes")
    state = flows.stages.toy(config=tiny_ref(tmp_path), iteration=1, checkpoint="ck", return_state=True)
    res = state.result()
    assert isinstance(res, StageResult) and res["given"] == "ck" and not res.cached
    assert flows.stages.toy(config=tiny_ref(tmp_path), iteration=1, checkpoint="ck").cached  # Prefect's cache
    with get_client(sync_client=True) as c:
        run = c.read_flow_run(state.state_details.flow_run_id)
        arts = c.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])))
    assert run.name == "toy-it1"
    assert any(a.key == "tiny-toy-stats" and "toy-it1" in str(a.data) for a in arts)
    assert any(a.type == "markdown" and "stage toy" in str(a.data) for a in arts)  # the lake link


def test_python_m_flows_stages_gives_one_line_for_a_user_error(capsys):
    from flows.stages import cli

    with pytest.raises(SystemExit) as e:
        cli(["nope"])
    assert e.value.code == 2 and "no stage 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli(["curate", "--config", str(ROOT / "configs" / "tiny.yaml"), "--set", "curate.nope=1"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.flow
def test_python_m_flows_stages_ends_a_failed_stage_with_one_line_not_a_traceback(tmp_path):
    """A user error inside the stage (a missing model folder): Prefect logs the failure, the command ends with one
    `error:` line and exit code 2, and no traceback anywhere."""
    import subprocess
    import sys

    env = {k: v for k, v in __import__("os").environ.items() if k != "FLYWHEEL_LAKE"}
    r = subprocess.run(
        [sys.executable, "-m", "flows.stages", "rollouts", "--config", str(ROOT / "configs" / "tiny.yaml")]
        + ["--set", f"student.model={tmp_path / 'no-model'}", "--lake", str(tmp_path / "lake")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stdout + r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: no model folder at"), r.stderr[-2000:]
