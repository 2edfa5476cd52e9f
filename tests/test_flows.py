"""Prefect orchestration: the flywheel as flows on the tiny config, with real stages and real Prefect.

One module-scoped `prefect_test_harness` (heartbeats off: each flow run would otherwise wait up to
a second for the heartbeat thread). Module scope, not session: the harness and its services stop
when this module ends instead of running under every later module. Suspected cause of an
intermittent test_parsing_fuzz failure (hypothesis saw the global `random` state change during a
draw; Prefect's loops draw random jitter), not proven: the failure is rare. The main scenario runs
the real flywheel once into a fresh lake whose student model folder does not exist yet: bootstrap
finishes, rollouts fail; the test then builds the model and retries the same flow run the way
`prefect flow-run retry` does, which must resume at rollouts and finish the iteration. The tests
below assert on that scenario; a `slow` test starts a real server and process workers (`flywheel up`)
and runs stages through `run_deployment`.
"""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from flows.flywheel import DEPLOYMENTS, STAGE_FLOWS, StageFailed, call_stage, flywheel
from flywheel.pipeline import skipped_result, stage_result, trained_result
from flywheel.stages import expected_episodes
from storage.catalog import connect
from tasks.common import ConfigRef, checkpoint_of, stage_cache_key

pytestmark = pytest.mark.flow
ROOT = Path(__file__).resolve().parents[1]
TABLES = ("episodes", "steps", "datasets", "checkpoints", "evals")


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


def tiny_ref(root: Path, **overrides) -> ConfigRef:
    # held-out tasks off: 4 eval episodes instead of ~30 keeps the scenario near a minute
    return ConfigRef(
        path=str(ROOT / "configs" / "tiny.yaml"),
        overrides={
            "lake.root": str(root / "lake"),
            "student.model": str(root / "student"),
            "evaluate.held_out_tasks": False,
            **overrides,
        },
    )


# the real flywheel runs its RL stage too: one round of 2 tasks x 1 instance x group 2 (a random tiny model only
# writes parse errors; replay of the bootstrap demos gives the groups their signal)
RL_ON = {"rl.enabled": True, "rl.rounds": 1, "rl.group_size": 2, "rl.seeds_per_task_per_round": 1, "rl.batch_size": 4}


def lake_rel(lake: Path, path: str) -> str:
    from storage.lake import Lake

    return Lake(lake).rel(path)


def counts(lake: Path) -> dict[str, int]:
    con = connect(lake)
    return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


def mtimes(lake: Path) -> dict[str, tuple[int, ...]]:
    """Each write's rows (their row ids change when a rerun rewrites them)."""
    from lake_parts import written_parts

    return written_parts(lake)


def retry_like_cli(flow_run_id):
    """What `prefect flow-run retry <id> --entrypoint ...` does for a run without a deployment:
    force the run back to Scheduled and run the flow again under the same id and parameters."""
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow
    from prefect.states import Scheduled

    with get_client(sync_client=True) as c:
        c.set_flow_run_state(flow_run_id, Scheduled(message="retry"), force=True)
        fr = c.read_flow_run(flow_run_id)
    return run_flow(flow=flywheel, flow_run=fr, parameters=dict(fr.parameters), return_type="state")


@pytest.fixture(scope="module")
def scenario(prefect_api, tmp_path_factory):
    from training.models import init_model

    root = tmp_path_factory.mktemp("flywheel")
    ref = tiny_ref(root, **RL_ON)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("FLYWHEEL_LAKE", raising=False)  # the lake is the config's, per test
        failed = flywheel(config=ref, return_state=True)
        after_failure = mtimes(root / "lake")
        boot_files = {p: t for p, t in after_failure.items() if "stage=bootstrap" in p}
        init_model("qwen3-vl", "tiny", root / "student", seed=0)  # the fix: the missing student now exists
        retried = retry_like_cli(failed.state_details.flow_run_id)
        yield SimpleNamespace(
            root=root,
            lake=root / "lake",
            ref=ref,
            failed=failed,
            retried=retried,
            boot_files=boot_files,
            after_failure=after_failure,
        )


# ------------------------------------------------------------------------ logic (no Prefect runs)
def test_cache_key_follows_stage_iteration_config_lake_and_inputs(tmp_path, monkeypatch):
    monkeypatch.delenv("FLYWHEEL_LAKE", raising=False)
    ctx = SimpleNamespace(task=SimpleNamespace(name="rollouts"))
    ref = tiny_ref(tmp_path)
    key = stage_cache_key(ctx, {"config": ref, "iteration": 1, "checkpoint": None})
    assert key == stage_cache_key(ctx, {"config": ref.model_dump(), "iteration": 1, "checkpoint": None})
    assert key.startswith("rollouts-it1-")
    others = [
        stage_cache_key(ctx, {"config": ref, "iteration": 2, "checkpoint": None}),
        stage_cache_key(
            ctx, {"config": tiny_ref(tmp_path, **{"rollout.group_size": 3}), "iteration": 1, "checkpoint": None}
        ),
        stage_cache_key(ctx, {"config": tiny_ref(tmp_path / "other"), "iteration": 1, "checkpoint": None}),
        stage_cache_key(ctx, {"config": ref, "iteration": 1, "checkpoint": "ck-1"}),
        stage_cache_key(
            SimpleNamespace(task=SimpleNamespace(name="bootstrap")), {"config": ref, "iteration": 1, "checkpoint": None}
        ),
    ]
    assert len({key, *others}) == 6


def test_checkpoint_of_prefers_the_merged_model():
    assert checkpoint_of(trained_result("sft", 0, {"path": "ck/a", "model_path": "ck/a/merged"})) == "ck/a/merged"
    assert checkpoint_of(skipped_result("rl", 0, "rl.enabled is false", checkpoint="ck/b")) == "ck/b"
    assert checkpoint_of(None) is None and checkpoint_of(stage_result("curate", 0, {"dataset_id": "d"})) is None


def test_a_cached_dict_of_an_older_version_reads_as_a_stage_result():
    from flows.common import legacy_result

    sft = legacy_result("sft", 0, {"checkpoint_id": "c", "path": "ck/a", "model_path": "ck/a/merged", "skipped": True})
    assert sft.checkpoint == "ck/a/merged" and sft.reused and sft.skipped is None and "skipped" not in sft
    rl = legacy_result("rl", 0, {"skipped": True, "checkpoint": "ck/b"})
    assert rl.skipped and rl.checkpoint == "ck/b"
    ro = legacy_result("rollouts", 1, {"run_key": "k", "ran": 2, "skipped": 3})
    assert ro.skipped is None and ro["skipped"] == 3 and ro.checkpoint is None


def test_iteration_report_says_skipped_and_names_the_checkpoint(tmp_path, monkeypatch):
    """`flywheel run`'s table and the iteration report: a skipped rl stage says so, and the sft row names the
    checkpoint it trained (id and model folder), not the dataset it trained on."""
    from rich.console import Console

    from flows.common import stage_row
    from flywheel.cli.commands import iteration_table
    from tasks.artifacts import iteration_markdown

    monkeypatch.delenv("FLYWHEEL_LAKE", raising=False)
    started = 1000.0
    merged = "/l/_checkpoints/sft-it0-ck/merged"
    sft = {
        "checkpoint_id": "sft-it0-ck",
        "path": "/l/_checkpoints/sft-it0-ck",
        "model_path": merged,
        "dataset_id": "curate-it0-ds",
        "skipped": True,  # the trainer found its checkpoint: reused, and the stage still ran
    }
    stages = {
        name: res.timed(1.5, cached=False, finished_at=started + 10)
        for name, res in {
            "curate": stage_result("curate", 0, {"dataset_id": "curate-it0-ds"}),
            "sft": trained_result("sft", 0, sft),
            "rl": skipped_result("rl", 0, "rl.enabled is false", checkpoint=merged),
            "rollouts": stage_result("rollouts", 0, {"run_key": "rollouts-it0-rk", "skipped": 3, "ran": 1}),
        }.items()
    }
    rows = {s: stage_row(s, r, started) for s, r in stages.items()}
    assert rows["rl"]["status"] == "skipped" and rows["rl"]["output"] == merged
    assert rows["sft"]["status"] == "ran" and rows["rollouts"]["status"] == "ran"
    assert "sft-it0-ck" in rows["sft"]["output"] and merged in rows["sft"]["output"]
    assert "curate-it0-ds" not in rows["sft"]["output"] and rows["curate"]["output"] == "curate-it0-ds"
    console = Console(record=True, width=300)
    console.print(iteration_table({"iteration": 0, "stages": stages, "started_at": started}))
    lines = {ln.split("│")[1].strip(): ln for ln in console.export_text().splitlines() if ln.startswith("│")}
    assert "skipped" in lines["rl"] and " ran " not in lines["rl"]
    assert "sft-it0-ck" in lines["sft"] and "curate-it0-ds" not in lines["sft"]
    md = iteration_markdown(tiny_ref(tmp_path).load(), 0, [dict(r, episodes=None) for r in rows.values()], None)
    assert f"| rl | skipped | 1.5 | – | – | {merged} |" in md and "| sft | ran |" in md


def test_deployed_run_must_use_the_lake_of_the_up_workers(tmp_path, monkeypatch):
    import json as js

    import flows.flywheel as fw
    import flows.orchestrate as orch
    from flywheel.errors import UserError

    monkeypatch.setattr(orch, "project_root", lambda: tmp_path)
    (tmp_path / ".prefect").mkdir()
    theirs = tmp_path / "their-lake"
    (tmp_path / ".prefect" / orch.STATE_FILE).write_text(js.dumps({"api_url": "http://x/api", "lake": str(theirs)}))
    monkeypatch.setenv("FLYWHEEL_LAKE", str(tmp_path / "my-lake"))
    with pytest.raises(UserError, match=f"use the lake {theirs} but this run resolves {tmp_path / 'my-lake'}"):
        fw._check_workers_lake(tiny_ref(tmp_path).load(), "http://x/api")
    fw._check_workers_lake(tiny_ref(tmp_path).load(), "http://other/api")  # another server: not those workers
    monkeypatch.setenv("FLYWHEEL_LAKE", str(theirs))
    fw._check_workers_lake(tiny_ref(tmp_path).load(), "http://x/api")


def test_prefect_yaml_deploys_every_stage_on_its_pool():
    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    pools = doc["definitions"]["work_pools"]
    assert pools["gpu"]["concurrency_limit"] == 1 and pools["gpu"]["worker_limit"] == 1
    deps = {}
    for d in doc["deployments"]:
        module, fn = d["entrypoint"].split(":")
        assert module.startswith("flows.") and d["enforce_parameter_schema"] is True
        deps[f"{fn}/{d['name']}"] = d
    assert set(deps) == set(DEPLOYMENTS.values()) | {"flywheel/cpu"}
    for stage, name in DEPLOYMENTS.items():
        d = deps[name]
        assert d["work_pool"]["name"] == ("gpu" if stage in ("sft", "rl") else "cpu"), stage
        assert d["entrypoint"] == f"flows.stages:{stage}"
        # the YAML's default parameters fit the flow's schema (required ones come with each run)
        assert set(d["parameters"]) <= set(STAGE_FLOWS[stage].parameters.properties)
        ConfigRef.model_validate(d["parameters"]["config"]).load()
    for stage in ("sft", "rl"):
        assert deps[DEPLOYMENTS[stage]]["concurrency_limit"] == 1
    parent = deps["flywheel/cpu"]
    assert parent["parameters"]["mode"] == "deployed"
    assert [s["active"] for s in parent["schedules"]] == [False] and parent["schedules"][0]["cron"]
    flywheel.validate_parameters(parent["parameters"])


def test_committed_prefect_yaml_is_the_registrys():
    """prefect.yaml is generated from the stage registry: `python -m flows.deployments --write` after a change."""
    from flows.deployments import PREFECT_YAML, main, render

    assert PREFECT_YAML.read_text() == render()
    assert main(["--check"]) == 0


def test_flow_parameters_carry_descriptions_for_the_ui():
    schema = flywheel.parameters.model_dump()
    props = schema["properties"]
    assert props["mode"]["enum"] == ["local", "deployed"]
    assert all(p.get("description") for p in props.values())
    assert schema["definitions"]["ConfigRef"]["properties"]["overrides"]["description"]
    for f in STAGE_FLOWS.values():
        assert all(p.get("description") for p in f.parameters.model_dump()["properties"].values()), f.name


def test_bootstrap_rule_and_checkpoint_hand_off(prefect_api, tmp_path, monkeypatch):
    """Orchestration logic only, so the stages are stand-ins (the real ones run in `scenario`)."""
    import flows.flywheel as fw

    monkeypatch.delenv("FLYWHEEL_LAKE", raising=False)
    success = {0: 0.9, 1: 0.1, 2: 0.5}  # held-out success per iteration; the threshold is 0.3
    calls = []

    def stage(name, config, iteration, mode, refresh, **inputs):
        calls.append((iteration, name, inputs))
        if name == "sft":
            return trained_result(
                name, iteration, {"checkpoint_id": f"ck-{iteration}", "model_path": f"/ck/{iteration}"}
            )
        if name == "rl":
            return skipped_result(name, iteration, "rl.enabled is false", checkpoint=inputs.get("checkpoint"))
        out = {
            "curate": {"dataset_id": f"ds-{iteration}"},
            "evaluate": {
                "success_rate": success[iteration],
                "ci_low": 0.0,
                "ci_high": 1.0,
                "checkpoint": inputs.get("checkpoint"),
            },
        }.get(name, {"stage": name})
        return stage_result(name, iteration, out)

    monkeypatch.setattr(fw, "call_stage", stage)
    monkeypatch.setattr(fw, "last_eval_success", lambda cfg, before: success.get(before - 1))
    state = fw.flywheel(config=tiny_ref(tmp_path), iterations=3, return_state=True)
    out = state.result()
    assert [it for it, name, _ in calls if name == "bootstrap"] == [0, 2]  # 0.9 >= 0.3 skips, 0.1 < 0.3 re-bootstraps
    inputs = {(it, name): kw for it, name, kw in calls}
    assert inputs[(0, "rollouts")] == {"checkpoint": None}
    assert inputs[(1, "rollouts")] == {"checkpoint": "/ck/0"} and inputs[(1, "sft")] == {
        "dataset_id": "ds-1",
        "base": "/ck/0",
    }
    assert inputs[(1, "rl")] == {"checkpoint": "/ck/1"} and inputs[(1, "evaluate")] == {"checkpoint": "/ck/1"}
    assert [o["checkpoint"] for o in out] == ["/ck/0", "/ck/1", "/ck/2"]
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as c:
        assert c.read_flow_run(state.state_details.flow_run_id).name == "flywheel-it0-2"


def test_flywheel_continues_after_the_newest_evaluated_iteration(tmp_path, monkeypatch):
    from flows.flywheel import next_iteration
    from storage.lake import Lake

    monkeypatch.delenv("FLYWHEEL_LAKE", raising=False)
    cfg = tiny_ref(tmp_path).load()
    assert next_iteration(cfg) == 0  # a fresh lake
    lake = Lake(tmp_path / "lake")
    row = dict(
        eval_id="e",
        checkpoint_id="ck",
        task_id="__all__",
        split="eval-seed",
        n_episodes=4,
        successes=1,
        success_rate=0.25,
        run_key="ev",
    )
    lake.write("evals", [row], iteration=0, stage="evaluate", run_key="ev0")
    assert next_iteration(cfg) == 1
    lake.write("evals", [row], iteration=3, stage="evaluate", run_key="ev3")
    lake.write("evals", [row], iteration=7, stage="manual", run_key="ev7")  # only the flywheel's evaluate stage counts
    assert next_iteration(cfg) == 4


def test_a_second_parent_on_the_same_lake_gets_one_clear_error(prefect_api, tmp_path, monkeypatch):
    from flows.flywheel import RunFailed, run_flywheel
    from flywheel.errors import USER_ERRORS
    from storage.lake import Lake
    from storage.lock import LakeBusy, parent_lock

    monkeypatch.delenv("FLYWHEEL_LAKE", raising=False)
    ref = tiny_ref(tmp_path)
    assert LakeBusy.__mro__[1] in USER_ERRORS
    with parent_lock(Lake(tmp_path / "lake"), "flywheel run (flywheel-it0)"):
        with pytest.raises(
            RunFailed,
            match=r"another flywheel run \(flywheel-it0\) is running on the lake .*"
            r"\(pid \d+ on .*since .*\); wait for it to end, or give this run its own --lake",
        ) as e:
            run_flywheel(ref.path, overrides=ref.overrides)
        assert e.value.user_error
    # released when its holder lets go (or dies: the kernel drops a flock with its process)
    with parent_lock(Lake(tmp_path / "lake")):
        pass


# ------------------------------------------------------------------------ the real flywheel
def test_failed_stage_names_its_cause_in_one_line(scenario):
    st = scenario.failed
    assert st.is_failed()
    assert "stage rollouts" in st.message and "no model folder" in st.message and "\n" not in st.message
    assert not [p for p in scenario.after_failure if p.startswith("datasets/")]  # no stage after the failed one ran
    assert scenario.boot_files  # bootstrap had finished before the failure


def test_retry_resumes_at_the_failed_stage(scenario):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    assert scenario.retried.is_completed(), scenario.retried.message
    with get_client(sync_client=True) as c:
        fr = c.read_flow_run(scenario.failed.state_details.flow_run_id)
        subs = c.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[fr.id])), limit=50
        )
    assert fr.run_count == 2 and fr.name == "flywheel-it0"  # the same flow run, retried
    runs = sorted((r.name, r.state.name, r.run_count) for r in subs)
    print(runs)
    # bootstrap's finished subflow run was reused as is; rollouts failed once and ran again
    assert [r for r in runs if r[0] == "bootstrap-it0"] == [("bootstrap-it0", "Completed", 1)], runs
    assert sorted(r[1] for r in runs if r[0] == "rollouts-it0") in (["Completed", "Failed"], ["Completed"]), runs
    stages = scenario.retried.result()[0]["stages"]
    assert not any(stages[s].cached for s in ("rollouts", "curate", "sft", "rl", "evaluate"))
    now = mtimes(scenario.lake)
    assert all(now[p] == t for p, t in scenario.boot_files.items())  # bootstrap's rows were not rewritten


def test_full_iteration_fills_the_lake_and_publishes_artifacts(scenario):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterParentFlowRunId,
    )

    st = scenario.retried.result()[0]["stages"]
    con = connect(scenario.lake)
    cfg = scenario.ref.load()
    assert dict(con.execute("SELECT stage, count(*) FROM episodes GROUP BY 1").fetchall()) == {
        **{s: expected_episodes(cfg, s) for s in ("bootstrap", "rollouts", "evaluate")},
        "rl": 2 * 1 * 2,
    }
    c = counts(scenario.lake)
    assert c["datasets"] == 1 and c["checkpoints"] >= 2 and c["evals"] >= 3
    assert con.execute("SELECT count(*) FROM rl_metrics").fetchone()[0] >= 1
    # sft -> rl -> evaluate: RL starts from SFT's checkpoint and evaluation scores RL's
    sft_ck, trained = checkpoint_of(st["sft"]), checkpoint_of(st["rl"])
    assert st["rl"].skipped is None and Path(trained).name == "round-0" and Path(trained).is_dir()
    assert con.execute("SELECT parent_checkpoint FROM checkpoints WHERE stage = 'rl'").fetchone()[0] == lake_rel(
        scenario.lake, sft_ck
    )
    assert st["evaluate"]["checkpoint"] == trained
    assert st["rollouts"]["checkpoint"] == str(scenario.root / "student")
    with get_client(sync_client=True) as client:
        parent = scenario.failed.state_details.flow_run_id
        subs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent])), limit=50
        )
        done = {r.name: r for r in subs if r.state.is_completed()}
        assert set(done) == {f"{s}-it0" for s in STAGE_FLOWS if s != "midtrain"}  # tiny.yaml: midtrain off
        assert {"stage:rollouts", "iteration:0"} <= set(done["rollouts-it0"].tags)
        arts = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[parent, done["rollouts-it0"].id, done["evaluate-it0"].id])
            ),
            limit=50,
        )
    by_key = {a.key: a for a in arts if a.key}
    report = by_key["tiny-iteration-report"].data
    assert "Held-out success" in report and "| sft | ran |" in report and "| bootstrap | reused |" in report
    assert "| rl | ran |" in report
    view = scenario.lake / "_reports" / "view"  # the viewer, refreshed at the iteration's end and linked
    assert (view / "report.html").resolve().as_uri() in report and (view / "index.html").exists()
    assert "rl-it0" in (view / "report.html").read_text()  # RL's checkpoint in the lineage
    rows = yaml.safe_load(by_key["tiny-rollouts-stats"].data)  # JSON rows
    assert next(r for r in rows if r["task_id"] == "all")["episodes"] == expected_episodes(cfg, "rollouts")
    assert "data:image/png;base64," in by_key["tiny-success-rate-plot"].data
    assert any(a.type == "progress" and float(a.data) == 100.0 for a in arts)
    assert any(a.type == "markdown" and "file://" in str(a.data) for a in arts)  # link artifacts render as markdown


def test_rerun_leaves_row_counts_unchanged(scenario):
    before, files = counts(scenario.lake), None
    again = flywheel(config=scenario.ref, refresh=True, start_iteration=0)  # every stage runs again
    assert not any(r.cached for r in again[0]["stages"].values())
    assert counts(scenario.lake) == before
    files = mtimes(scenario.lake)
    cached = flywheel(config=scenario.ref, start_iteration=0)  # a plain rerun finds every stage finished
    assert all(r.cached for r in cached[0]["stages"].values())
    assert mtimes(scenario.lake) == files and counts(scenario.lake) == before


def test_next_iteration_continues_from_the_lake_and_follows_the_curriculum(scenario):
    """`flywheel run` again on the scenario's lake: iteration 1, from iteration 0's checkpoint, planned by the
    curriculum. The random tiny student solved nothing in iteration 0, so each task gets teacher demos up to its
    budget (5 - the 3 it has = 2, on the seeds after its demos), no RL (no group with a signal), and SFT."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    ref = ConfigRef(
        path=scenario.ref.path,
        overrides={**scenario.ref.overrides, "curriculum.enabled": True, "bootstrap.max_demos_per_task": 5},
    )
    out = flywheel(config=ref)
    assert [o["iteration"] for o in out] == [1]
    st = out[0]["stages"]
    con = connect(scenario.lake)
    plan = con.execute(
        "SELECT task_id, decision, teacher_demos, rl FROM curriculum WHERE iteration = 1 ORDER BY task_id"
    ).fetchall()
    assert plan == [
        ("__sft__", "sft", 0, False),
        ("click-test", "teacher", 2, False),
        ("focus-text", "teacher", 2, False),
    ]
    boot = con.execute(
        "SELECT task_id, list_sort(list(seed)) FROM episodes WHERE stage = 'bootstrap' AND iteration = 1 "
        "GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert boot == [("click-test", [3, 4]), ("focus-text", [3, 4])]
    assert "curriculum" in st["rl"].skipped
    # lineage: iteration 1's SFT starts from iteration 0's final checkpoint (RL's round-0), evaluate scores it
    parent = con.execute("SELECT parent_checkpoint FROM checkpoints WHERE stage = 'sft' AND iteration = 1").fetchone()[
        0
    ]
    rl0 = con.execute("SELECT checkpoint_id, path FROM checkpoints WHERE stage = 'rl' AND iteration = 0").fetchone()
    assert parent == rl0[0] and Path(scenario.retried.result()[0]["checkpoint"]).parent.name == rl0[0]
    assert st["evaluate"]["checkpoint"] == checkpoint_of(st["sft"])
    # curate of iteration 1 draws on both iterations' successes
    counts_by = yaml.safe_load(con.execute("SELECT source_counts FROM datasets WHERE iteration = 1").fetchone()[0])
    assert {"scripted/it0", "scripted/it1"} <= set(counts_by["by_policy_iteration"])
    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["tiny-iteration-report"])), limit=10
        )
    assert any("**Curriculum**" in str(a.data) and "| click-test | teacher |" in str(a.data) for a in arts)


# ------------------------------------------------------------------------ deployed mode
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_deployed_mode_runs_stages_on_process_workers(prefect_api, tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.orchestrate import _start_time, down, read_state, up

    monkeypatch.delenv("FLYWHEEL_LAKE", raising=False)
    monkeypatch.setenv("FLYWHEEL_RESULTS", str(tmp_path / "results"))
    ref = tiny_ref(tmp_path, **{"bootstrap.selection.seeds_per_task": 1})
    state_dir, st = tmp_path / "state", None
    try:
        # workers poll every second instead of 10 (the test waits on them three times)
        st = up(port=free_port(), state_dir=state_dir, extra_env={"PREFECT_WORKER_QUERY_SECONDS": "1"})
        with temporary_settings({PREFECT_API_URL: st["api_url"]}):
            boot = call_stage("bootstrap", ref, 0, "deployed", False)
            cur = call_stage("curate", ref, 0, "deployed", False)
            with pytest.raises(StageFailed, match=r"^iteration 0, stage sft: flow run sft-it0 ended Failed"):
                call_stage("sft", ref, 0, "deployed", False, dataset_id="no-such-dataset")
            with get_client(sync_client=True) as c:
                runs = c.read_flow_runs(
                    flow_run_filter=FlowRunFilter(
                        name=FlowRunFilterName(any_=["bootstrap-it0", "curate-it0", "sft-it0"])
                    ),
                    limit=10,
                )
    finally:
        procs = (st or read_state(state_dir) or {}).get("processes", [])
        stopped = down(state_dir=state_dir)
    n = expected_episodes(ref.load(), "bootstrap")  # 2 tasks x 1 seed; the scripted teacher solves both
    assert boot["ran"] == n and boot["successes"] == n and cur["dataset_id"]
    assert {r.name: r.work_pool_name for r in runs} == {"bootstrap-it0": "cpu", "curate-it0": "cpu", "sft-it0": "gpu"}
    assert counts(tmp_path / "lake")["datasets"] == 1
    assert sorted(stopped) == ["server", "worker-cpu", "worker-gpu"]
    assert all(_start_time(p["pid"]) is None for p in procs) and not read_state(state_dir)


def test_flywheel_with_midtrain_starts_the_first_sft_from_the_base(prefect_api, tmp_path):
    """midtrain on: the parent runs the midtrain sub-flow first, the iteration's SFT starts from its base, the base's
    row stays out of the flywheel's checkpoint chain, and a second parent run finds the base cached."""
    from training.models import init_model

    init_model("qwen3-vl", "tiny", tmp_path / "student", seed=0)
    ref = tiny_ref(
        tmp_path,
        **{
            "midtrain.enabled": True,
            "midtrain.tasks": ["synth/click"],
            "midtrain.episodes_per_task": 2,
            "midtrain.eval_seeds_per_task": 1,
            "midtrain.sft.max_steps": 2,
            "midtrain.sft.batch_size": 2,
            "sft.max_steps": 2,
            "sft.batch_size": 2,
            "sft.method": "full",
            "bootstrap.selection.seeds_per_task": 1,
            "evaluate.selection.seeds_per_task": 1,
        },
    )
    out = flywheel(config=ref)
    st = out[0]["stages"]
    con = connect(tmp_path / "lake")
    base_id, base_path = con.execute("SELECT checkpoint_id, path FROM checkpoints WHERE method = 'midtrain'").fetchone()
    sft_parent = con.execute("SELECT parent_checkpoint FROM checkpoints WHERE stage = 'sft'").fetchone()[0]
    assert sft_parent == base_id and st["sft"]["parent_checkpoint"] == base_id
    assert st["rollouts"]["checkpoint"].startswith(str(tmp_path / "lake" / base_path))  # iteration 0 rolls out the base
    assert con.execute("SELECT count(*) FROM evals WHERE stage = 'midtrain'").fetchone()[0] == 2  # kind + overall
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        names = {r.name for r in client.read_flow_runs(limit=200) if r.state.is_completed()}
    assert "midtrain" in names
    n_ck = con.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
    flywheel(config=ref, start_iteration=0)  # a rerun: every stage cached, the base not trained again
    assert connect(tmp_path / "lake").execute("SELECT count(*) FROM checkpoints").fetchone()[0] == n_ck
