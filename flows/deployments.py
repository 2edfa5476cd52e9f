"""prefect.yaml, generated from the stage registry: one deployment per registered stage on its pool, plus the parent.

    python -m flows.deployments --write      # (re)write prefect.yaml
    python -m flows.deployments --check      # exit 1 if prefect.yaml is not what the registry gives (tests do this)
    python -m flows.deployments              # print it

Each stage's deployment is `<stage>/<pool>` (entrypoint `flows.stages:<stage>`, the stage's pool, its tags, one
flow run at a time on `gpu`); the pools, the default config and the parent's schedule are the text below. Edit
them here (or a stage's `pool` in flywheel/pipeline.py) and rewrite the file: a hand edit of prefect.yaml fails
the check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flywheel.pipeline import STAGES, Stage, get_stage

PREFECT_YAML = Path(__file__).resolve().parents[1] / "prefect.yaml"

HEADER = """\
# Prefect deployments of the flywheel: one per stage plus the `flywheel` parent.
# Generated from the stage registry (flywheel/pipeline.py) by `python -m flows.deployments --write`:
# edit flows/deployments.py or a stage's pool there, not this file (tests check that it is current).
#
#   flywheel up                   # server + the pools below + `prefect deploy --all` + one worker per pool
#   PREFECT_API_URL=http://127.0.0.1:4200/api prefect --no-prompt deploy --all    # by hand, from this folder
#
# Infrastructure is YAML, not code: `cpu` runs the browser-bound and DuckDB stages and the parent,
# `gpu` the training stages. Both are process pools (a worker runs each flow run as a subprocess of
# itself, in this folder). There is no `pull:` section on purpose: `prefect deploy` then records the
# folder it ran in, so a worker on another machine needs the same checkout at the same path (or add
# a git_clone pull step; see docs/PREFECT.md).
# Entrypoints are module paths (flows.stages:curate), not file paths: Prefect loads a file path
# with its folder first on sys.path, where flows/flywheel.py would shadow the `flywheel` package.
name: gui-flywheel
prefect-version: 3.8.8

definitions:
  # Read by `flywheel up` (flows/orchestrate.py) to create the pools; `prefect deploy` ignores
  # the extra keys. `concurrency_limit` caps flow runs across the whole pool; `worker_limit` caps
  # one worker. One GPU must never run two training jobs: the gpu pool takes one flow run at a time
  # (raise it to the number of GPU workers when you add machines, each started with --limit 1).
  work_pools:
    cpu: &cpu_pool
      name: cpu
      type: process
      concurrency_limit: null
      worker_limit: null
    gpu: &gpu_pool
      name: gpu
      type: process
      concurrency_limit: 1
      worker_limit: 1
  config: &config
    path: configs/local.yaml
    overrides: {}

deployments:
  - name: cpu
    entrypoint: flows.flywheel:flywheel
    description: The flywheel parent; dispatches each stage to its own deployment (mode deployed).
    work_pool: *cpu_pool
    enforce_parameter_schema: true
    concurrency_limit: 1  # two parents would race on the same iterations
    tags: [flywheel]
    parameters:
      config: *config
      mode: deployed
    schedules:
      # Nightly iteration; inactive until someone turns it on in the UI (Deployments > flywheel/cpu).
      - cron: "0 2 * * *"
        timezone: UTC
        active: false
"""


def deployment_name(stage: str) -> str:
    """`<flow>/<deployment>` as `run_deployment` takes it: the pool a stage runs on is its deployment's name."""
    return f"{stage}/{get_stage(stage).pool}"


def stage_deployment(stage: Stage) -> str:
    gpu = stage.pool == "gpu"
    lines = [
        f"  - name: {stage.pool}",
        f"    entrypoint: flows.stages:{stage.name}",
        f"    work_pool: *{stage.pool}_pool",
        "    enforce_parameter_schema: true",
        *(["    concurrency_limit: 1"] if gpu else []),
        f'    tags: [flywheel, "stage:{stage.name}"{", gpu" if gpu else ""}]',
        "    parameters: {config: *config}",
    ]
    return "\n".join(lines) + "\n"


def render(stages: list[Stage] | None = None) -> str:
    """The whole prefect.yaml text for these stages (default: the registry's)."""
    return HEADER + "".join("\n" + stage_deployment(s) for s in (STAGES if stages is None else stages))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flows.deployments", description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help=f"write {PREFECT_YAML.name}")
    g.add_argument("--check", action="store_true", help=f"exit 1 if {PREFECT_YAML.name} is stale")
    a = p.parse_args(argv)
    text = render()
    if a.write:
        PREFECT_YAML.write_text(text)
        print(f"wrote {PREFECT_YAML} ({len(STAGES)} stage deployments + the parent)")
    elif a.check:
        if not PREFECT_YAML.exists() or PREFECT_YAML.read_text() != text:
            print(f"{PREFECT_YAML} is stale: run `python -m flows.deployments --write`", file=sys.stderr)
            return 1
        print(f"{PREFECT_YAML.name} is current")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
