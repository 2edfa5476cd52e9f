"""Flow `flywheel`: N iterations of bootstrap -> rollouts -> curate -> sft -> rl -> evaluate.

    flywheel run [-c configs/tiny.yaml] [--iterations 2]       # local mode: every stage in this process
    run_flywheel("configs/tiny.yaml", iterations=1)              # the same from Python (what `flywheel run` calls)
    python -m flows.flywheel --config configs/tiny.yaml --iterations 1
    prefect deployment run flywheel/cpu                          # deployed mode: stages on their pools

Two modes, one code path. `local` calls each stage flow as a subflow in this process. `deployed`
starts each stage's deployment with `run_deployment` (cpu or gpu pool, prefect.yaml) and waits for
it; a stage counts as done only when its flow run is Completed. Either way a stage returns its StageResult
(flywheel/pipeline.py): lake ids and paths that the next stage takes as input. The stage flows and their
deployments are the registry's (STAGE_FLOWS, DEPLOYMENTS); a registered stage with `run_after` runs in every
iteration right after that stage.

Bootstrap runs on iteration 0, and again whenever the last evaluation's success rate fell below
`bootstrap.success_threshold` (or no evaluation exists yet). Every stage's result is cached on its
inputs, so a retried or re-triggered run resumes at the stage that failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

from prefect import flow, get_run_logger, runtime, tags
from prefect.deployments import run_deployment

from configs.loading import load_config
from configs.models import FlywheelConfig
from flows import orchestrate
from flows.common import FLOW_OPTS, main, one_line, stage_row
from flows.deployments import deployment_name
from flows.stages import stage_flow
from flywheel.errors import USER_ERRORS, UserError
from flywheel.pipeline import STAGES, Stage, StageResult, get_stage, skipped_result, stage_names
from flywheel.specs import latest_checkpoint
from tasks import stages as t
from tasks.artifacts import publish_iteration, stage_stats
from tasks.common import ConfigRef, checkpoint_of


class ByStage(Mapping[str, Any]):
    """A read-only view of the registry: stage name -> what `make` derives for it (always current)."""

    def __init__(self, make: Callable[[str], Any]):
        self.make = make

    def __getitem__(self, stage: str) -> Any:
        try:
            get_stage(stage)
        except KeyError:
            raise KeyError(stage) from None
        return self.make(stage)

    def __iter__(self) -> Iterator[str]:
        return iter(stage_names())

    def __len__(self) -> int:
        return len(STAGES)


STAGE_FLOWS = ByStage(stage_flow)  # stage -> its flow (flows/stages.py)
DEPLOYMENTS = ByStage(deployment_name)  # stage -> `<stage>/<pool>`, its deployment in prefect.yaml


class StageFailed(RuntimeError):
    """A stage did not complete; the message names the iteration, the stage and the cause."""


def run_name() -> str:
    p = runtime.flow_run.parameters
    start, n = p.get("start_iteration"), p.get("iterations")
    if start is None:
        try:
            ref = p.get("config")
            cfg = (ref if isinstance(ref, ConfigRef) else ConfigRef.model_validate(ref or {})).load()
            start, n = next_iteration(cfg), n or cfg.iterations
        except Exception:  # noqa: BLE001 - a name is cosmetic; the flow itself reports a bad config
            return "flywheel-next"
    return f"flywheel-it{start}" if not n or n == 1 else f"flywheel-it{start}-{start + n - 1}"


def next_iteration(cfg: FlywheelConfig) -> int:
    """Where a flywheel continues: the iteration after the newest one with a finished evaluation
    (0 on a fresh lake). An iteration stopped part-way has no evaluation yet, so it is resumed."""
    from flywheel.specs import lake_for

    return next_iteration_of(lake_for(cfg))


def next_iteration_of(lake) -> int:
    """`next_iteration` for a given Lake: 1 + the newest iteration with a flywheel evaluation (0: none yet)."""
    from storage.catalog import connect

    if not lake.has_data("evals"):
        return 0
    row = connect(lake).execute("SELECT max(iteration) FROM evals WHERE stage = 'evaluate'").fetchone()
    return 0 if row is None or row[0] is None else int(row[0]) + 1


def last_eval_success(cfg: FlywheelConfig, before: int) -> float | None:
    """Overall held-out success of the latest evaluation of an earlier iteration (None: none yet)."""
    from flywheel.evaluate import OVERALL
    from flywheel.specs import lake_for
    from storage.catalog import connect

    lake = lake_for(cfg)
    if not lake.has_data("evals"):
        return None
    row = (
        connect(lake)
        .execute(
            "SELECT success_rate FROM evals WHERE task_id = ? AND iteration < ? AND stage = 'evaluate' "
            "ORDER BY iteration DESC, created_at DESC LIMIT 1",
            [OVERALL, before],
        )
        .fetchone()
    )
    return None if row is None else float(row[0])


def call_stage(stage: str, config: ConfigRef, iteration: int, mode: str, refresh: bool, **inputs: Any) -> StageResult:
    """Run one stage in this process (local) or through its deployment (deployed); its StageResult."""
    params = {"config": config, "iteration": iteration, "refresh": refresh, **inputs}
    try:
        if mode == "local":
            with tags(f"stage:{stage}", f"iteration:{iteration}"):
                return stage_flow(stage)(**params)
        params["config"] = config.model_dump()
        fr = run_deployment(
            deployment_name(stage),
            parameters=params,
            flow_run_name=f"{stage}-it{iteration}",
            tags=[f"stage:{stage}", f"iteration:{iteration}"],
            poll_interval=2,
        )
    except Exception as e:  # noqa: BLE001 - one line naming stage and cause; the original is chained
        raise StageFailed(f"iteration {iteration}, stage {stage}: {one_line(e)}") from e
    if not fr.state or not fr.state.is_completed():  # run_deployment returns on any final state
        state = fr.state.name if fr.state else "no state"
        raise StageFailed(
            f"iteration {iteration}, stage {stage}: flow run {fr.name} ended {state}: "
            f"{(fr.state.message if fr.state else '') or ''}".rstrip(": ")
        )
    return fr.state.result()


def report_row(cfg: FlywheelConfig, stage: str, res: StageResult, attempt_started: float) -> dict[str, Any]:
    row = stage_row(stage, res, attempt_started)
    if res.get("run_key") and "ran" in res and not res.skipped:  # a stage that ran episodes: their count and success
        total = next((r for r in stage_stats(cfg, stage, res) if r.get("task_id") == "all"), {})
        row.update(episodes=total.get("episodes"), success_rate=total.get("success_rate"))
    return row


@flow(name="flywheel", flow_run_name=run_name, **FLOW_OPTS)
def flywheel(
    config: ConfigRef = ConfigRef(),
    iterations: int | None = None,
    start_iteration: int | None = None,
    checkpoint: str | None = None,
    mode: Literal["local", "deployed"] = "local",
    refresh: bool = False,
) -> list[dict[str, Any]]:
    """The data flywheel: teacher demos, student rollouts, curation, SFT, RL and evaluation, N times.

    Args:
        config: Flywheel config file and dotted-key overrides.
        iterations: Iterations to run; empty means the config's `iterations`.
        start_iteration: First iteration number; empty means the one after the lake's newest evaluated iteration
            (a fresh lake starts at 0, an interrupted iteration is resumed, a scheduled run takes the next one).
        checkpoint: Student to start from; empty means the newest checkpoint of an earlier iteration, else the
            config's student.model.
        mode: local runs every stage in this flow's process; deployed sends each stage to its work pool.
        refresh: Run every stage again even where a finished result is cached (the lake keeps no duplicates).
    """
    from flywheel.specs import lake_for
    from storage.lock import parent_lock

    log, started = get_run_logger(), time.time()
    cfg = config.load()
    n = iterations or cfg.iterations
    with parent_lock(lake_for(cfg), f"flywheel run ({runtime.flow_run.name or 'flywheel'})"):
        if start_iteration is None:
            start_iteration = next_iteration(cfg)
        if n < 1 or start_iteration < 0:
            raise ValueError(f"iterations must be >= 1 and start_iteration >= 0, got {n} and {start_iteration}")
        return _iterations(cfg, config, n, start_iteration, checkpoint, mode, refresh, log, started)


def hand_on(stage: Stage, results: Mapping[str, StageResult], checkpoint: str | None) -> dict[str, Any]:
    """The inputs the iteration hands a `run_after` stage, by name: `checkpoint` / `base` = the newest checkpoint a
    stage of this iteration handed on (else the one it started from), `dataset_id` = the newest dataset id."""
    done = list(results.values())[::-1]
    now = next((r.checkpoint for r in done if r.checkpoint), checkpoint)
    have = {
        "checkpoint": now,
        "base": now,
        "dataset_id": next((r["dataset_id"] for r in done if "dataset_id" in r), None),
    }
    return {p.name: have[p.name] for p in stage.parameters() if have.get(p.name) is not None}


def _midtrain(cfg: FlywheelConfig, config: ConfigRef, mode: str, refresh: bool, log: Any) -> StageResult | None:
    """The base skills before the first iteration (midtrain.enabled): cached in the lake after the first run."""
    if not cfg.midtrain.enabled:
        return None
    base = call_stage("midtrain", config, 0, mode, refresh)
    skills = base.get("skills") or {}
    log.info(
        f"midtrain: base {base.get('checkpoint_id')} ({base.get('steps')} steps); held-out synthetic pages "
        f"{skills.get('success_rate', float('nan')):.1%} {skills.get('per_task', {})}"
    )
    return base


def _iterations(
    cfg: FlywheelConfig,
    config: ConfigRef,
    n: int,
    start_iteration: int,
    checkpoint: str | None,
    mode: str,
    refresh: bool,
    log: Any,
    started: float,
) -> list[dict[str, Any]]:
    ck = checkpoint or latest_checkpoint(cfg, start_iteration)
    reg = (t.register_tasks.with_options(refresh_cache=True) if refresh else t.register_tasks)(config)
    log.info(f"{cfg.name}: {n} iteration(s) from {start_iteration} in {mode} mode; {reg['tasks']} tasks registered")
    base = _midtrain(cfg, config, mode, refresh, log)
    ck = ck or checkpoint_of(base)
    out = []
    for it in range(start_iteration, start_iteration + n):
        results: dict[str, StageResult] = {}

        def step(stage: str, **inputs: Any) -> StageResult:
            results[stage] = call_stage(stage, config, it, mode, refresh, **inputs)
            for extra in STAGES:  # registered stages that run after this one (Stage.run_after)
                if extra.run_after == stage:
                    step(extra.name, **hand_on(extra, results, ck))
            return results[stage]

        with tags(f"iteration:{it}"):
            plan = t.plan_curriculum(config, it) if cfg.curriculum.enabled else None
            last = last_eval_success(cfg, it)
            if plan is not None:
                for d in plan["decisions"]:
                    log.info(f"iteration {it} curriculum: {d['task_id']}: {d['decision']} ({d['reason']})")
                if plan["bootstrap_tasks"]:
                    step("bootstrap")
            elif it == 0 or last is None or last < cfg.bootstrap.success_threshold:
                log.info(f"iteration {it}: bootstrap (last eval success: {'none' if last is None else f'{last:.1%}'})")
                step("bootstrap")
            step("rollouts", checkpoint=ck)
            cur = step("curate")
            if plan is None or plan["run_sft"] or ck is None:
                trained = step("sft", dataset_id=cur["dataset_id"], base=ck)
            else:  # entropulse: no SFT this iteration, RL continues from the last checkpoint
                why = next(d["reason"] for d in plan["decisions"] if d["task_id"] == "__sft__")
                trained = results["sft"] = skipped_result("sft", it, why, checkpoint=ck)
            ck = checkpoint_of(step("rl", checkpoint=checkpoint_of(trained))) or checkpoint_of(trained)
            ev = step("evaluate", checkpoint=ck)
        rows = [report_row(cfg, s, r, started) for s, r in results.items()]
        if base is not None and it == start_iteration:
            rows.insert(0, report_row(cfg, "midtrain", base, started))
        publish_iteration(cfg, it, rows, ev, curriculum=plan["decisions"] if plan else None)
        log.info(f"iteration {it} done: held-out success {ev['success_rate']:.1%} for {ck}")
        out.append({"iteration": it, "checkpoint": ck, "stages": results, "started_at": started})
    return out


# ------------------------------------------------------------------------------------ flywheel run
class RunFailed(Exception):
    """A `flywheel run` ended in a failed flow run: one line, the run id, and whether the cause is the user's."""

    def __init__(self, message: str, flow_run_id: str | None, user_error: bool):
        super().__init__(message)
        self.flow_run_id, self.user_error = flow_run_id, user_error


def _check_workers_lake(cfg: Any, api_url: str) -> None:
    """Deployed stages run in the workers `flywheel up` started, on the lake they inherited; this process reads the
    lake too (which stages to run, where to resume), so a run that resolves another lake would split an iteration."""
    from flywheel.specs import lake_for

    try:
        st = orchestrate.read_state(orchestrate.project_root() / ".prefect")
    except (UserError, OSError, ValueError):
        return
    if not st or st.get("api_url") != api_url or not st.get("lake"):
        return  # another server, or workers on the config's lake.root: nothing recorded to compare
    mine = str(lake_for(cfg).root)
    if st["lake"] != mine:
        raise UserError(
            f"the `flywheel up` workers use the lake {st['lake']} but this run resolves {mine}: pass "
            f"--lake {st['lake']}, or restart them with `flywheel down && flywheel up --lake {mine}`"
        )


def run_flywheel(
    config: str,
    *,
    iterations: int | None = None,
    start_iteration: int | None = None,
    mode: str = "local",
    refresh: bool = False,
    overrides: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Run the `flywheel` flow in this process (its stages in-process, or on their pools in deployed mode)."""
    load_config(config, overrides)  # a bad config fails here, before Prefect starts
    if mode not in ("local", "deployed"):
        raise UserError(f"unknown --mode {mode!r}; use local or deployed")
    with orchestrate.local_settings():
        from prefect.settings import PREFECT_API_URL

        if mode == "deployed" and not PREFECT_API_URL.value():
            raise UserError("deployed mode needs a Prefect server: run `flywheel up` first, or set PREFECT_API_URL")
        if mode == "deployed":
            _check_workers_lake(load_config(config, overrides), PREFECT_API_URL.value())
        state = flywheel(
            config=ConfigRef(path=str(config), overrides=overrides or {}),
            iterations=iterations,
            start_iteration=start_iteration,
            mode=mode,
            refresh=refresh,
            return_state=True,
        )
        if state.is_completed():
            return state.result()
        exc = state.result(raise_on_failure=False)
    if not isinstance(exc, BaseException):  # crashed or cancelled: no exception, only a state message
        exc = RuntimeError(state.message or state.name)
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    run_id = str(state.state_details.flow_run_id) if state.state_details.flow_run_id else None
    raise RunFailed(first, run_id, isinstance(cause, USER_ERRORS)) from None


if __name__ == "__main__":
    main(flywheel)
