"""What the trajectory viewer reads from the lake: DuckDB queries that never scan screenshots.

    v = ViewerData("lake")             # LakeError when there is no lake
    idx = v.index()                    # every episode, columnar, no screenshot bytes
    ep = v.episode(eid)                # episode row + steps (+ RL rows) without screenshots
    png = v.screenshot(eid, 0)         # one PNG, read by key
    pairs = v.pairs(Side.parse("stage=bootstrap"), Side.parse("sft-it0"))   # same task + seed, two policies
    rep = v.report()                   # success per task/iteration, teacher spend, data volumes, lineage, RL

It reads the lake through the same connection as `flywheel query` (storage.catalog.connect): the episode and RL
rows (small, no screenshots) once into memory, and a page's steps by episode id.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from flywheel.reports import iteration_table, teacher_spend_rows
from storage.catalog import connect, explain_duckdb_error
from storage.lake import Lake, LakeError
from storage.lake import open_lake as open_lake_at
from storage.schema import TABLES

# index columns; the categorical ones travel dictionary-encoded (values + codes) to keep the JSON small
INDEX_COLUMNS = (
    "episode_id",
    "iteration",
    "stage",
    "task_id",
    "seed",
    "split",
    "policy",
    "policy_version",
    "success",
    "status",
    "n_steps",
    "task_reward",
    "duration_s",
    "instruction",
)
CATEGORICAL = ("stage", "task_id", "split", "policy", "policy_version", "status")

_STEP_COLUMNS = (
    "step_idx, is_final, screen_w, screen_h, ui_text, prompt_context, response_text, thought, "
    "action_desc, raw_action, action, executed, parse_ok, parse_error, fallback_parse, exec_error, "
    "latency_ms, env_ms, prompt_tokens, completion_tokens, reward, feedback"
)
_RL_COLUMNS = (
    "step_idx, round, advantage, step_advantage, replayed, parse_error, sdpo, sdpo_sibling_episode_id, "
    "sdpo_feedback, run_key"
)
SAFE_ID = re.compile(r"^[A-Za-z0-9_.:=+-]{1,200}$")
SIDE_KEYS = ("policy_version", "policy", "stage", "iteration", "task_id")


class ViewerError(Exception):
    """One line a user can act on (an unknown episode, an ambiguous side, ...)."""


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


@dataclass(frozen=True)
class Side:
    """One side of a comparison: `key=value` terms over SIDE_KEYS, or a bare policy_version substring.

    `Side.parse("stage=evaluate,iteration=1")`, `Side.parse("sft-it0")` (unique among policy versions)."""

    terms: tuple[tuple[str, str], ...]
    text: str

    @classmethod
    def parse(cls, text: str) -> "Side":
        text = (text or "").strip()
        if not text:
            raise ViewerError("an empty comparison side: give key=value terms or a policy version")
        terms = []
        for part in text.split(","):
            key, eq, value = part.partition("=")
            if not eq:
                terms.append(("policy_version~", part.strip()))
                continue
            key = key.strip()
            if key == "checkpoint":
                key = "policy_version"
            if key not in SIDE_KEYS:
                raise ViewerError(
                    f"unknown comparison key {key!r} in {text!r} (use {', '.join(SIDE_KEYS)}, "
                    "or a bare policy-version substring)"
                )
            terms.append((key, value.strip()))
        return cls(tuple(terms), text)

    def where(self, versions: list[str]) -> tuple[str, list[Any]]:
        """SQL condition over `episodes` and its parameters; a bare substring must name one policy version."""
        conds, params = [], []
        for key, value in self.terms:
            if key == "policy_version~":
                hits = [v for v in versions if v == value] or [v for v in versions if value in v]
                if len(hits) != 1:
                    pool = hits or versions
                    shown = ", ".join(sorted(pool)[:6]) + (f" and {len(pool) - 6} more" if len(pool) > 6 else "")
                    what = f"matches {len(hits)} policy versions" if hits else "matches no policy version"
                    raise ViewerError(
                        f"comparison side {value!r} {what} ({'they are' if hits else 'known'}: "
                        f"{shown or 'none'}); give more of it, or key=value terms"
                    )
                conds.append("policy_version = ?")
                params.append(hits[0])
            elif key == "iteration":
                try:
                    params.append(int(value))
                except ValueError:
                    raise ViewerError(f"iteration must be an integer, got {value!r}") from None
                conds.append("iteration = ?")
            else:
                conds.append(f"{key} = ?")
                params.append(value)
        return " AND ".join(conds), params


class ViewerData:
    def __init__(self, root: str | Path | Lake):
        self.lake = open_lake_at(root, create=False)
        self.snapshot = self.lake.snapshot()
        self.con = connect(self.lake)
        self.skipped: list[str] = []  # the page's notices (none: DuckLake reads no file outside its catalog)
        self._one_line(self._materialize)

    def _materialize(self) -> None:
        """Episodes and RL rows (small, no screenshots) into memory."""
        self.con.execute("CREATE OR REPLACE TEMP TABLE ep AS SELECT * FROM episodes")
        self.con.execute(f"CREATE OR REPLACE TEMP TABLE rl AS SELECT episode_id, {_RL_COLUMNS} FROM rl_rows")

    def _step_rows(self, episode_ids: list[str], cols: str, extra: str = "") -> list[dict[str, Any]]:
        """Step rows of these episodes."""
        return self._rows(
            f"SELECT episode_id, {cols} FROM steps WHERE list_contains(?, episode_id) {extra} "
            "ORDER BY episode_id, step_idx",
            [episode_ids],
        )

    def _one_line(self, fn):
        """Run fn(): a DuckDB error becomes one LakeError line."""
        try:
            return fn()
        except duckdb.Error as e:
            raise LakeError(explain_duckdb_error(e, self.lake)) from None

    def _rows(self, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        def run():
            cur = self.con.execute(sql, params or [])
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r)) for r in cur.fetchall()]

        return self._one_line(run)

    def skipped_lines(self) -> list[str]:
        return list(self.skipped)

    # ------------------------------------------------------------------ index
    def index(self) -> dict[str, Any]:
        """Every episode as columns (categoricals as values + codes), newest iteration first."""
        cols = ", ".join(INDEX_COLUMNS)
        tbl = self._one_line(
            lambda: self.con.sql(
                f"SELECT {cols} FROM ep ORDER BY iteration DESC, stage, task_id, seed, policy_version, episode_id"
            ).to_arrow_table()
        )
        out: dict[str, Any] = {"n": tbl.num_rows, "columns": {}}
        for name in INDEX_COLUMNS:
            col = tbl.column(name)
            if name in CATEGORICAL:
                enc = col.cast("string").dictionary_encode().combine_chunks()
                out["columns"][name] = {
                    "values": enc.dictionary.to_pylist(),
                    "codes": enc.indices.fill_null(-1).to_pylist(),
                }
            elif name == "duration_s" or name == "task_reward":
                out["columns"][name] = [None if v is None else round(v, 3) for v in col.to_pylist()]
            else:
                out["columns"][name] = col.to_pylist()
        return out

    def versions(self) -> list[str]:
        return [
            r["v"]
            for r in self._rows(
                "SELECT DISTINCT policy_version AS v FROM ep WHERE policy_version IS NOT NULL ORDER BY 1"
            )
        ]

    # ------------------------------------------------------------------ episodes
    def episode(self, episode_id: str) -> dict[str, Any]:
        if not SAFE_ID.match(episode_id or ""):
            raise ViewerError(f"not an episode id: {episode_id[:80]!r}")
        eps = self._rows("SELECT * FROM ep WHERE episode_id = ? LIMIT 1", [episode_id])
        if not eps:
            raise ViewerError(f"no episode {episode_id!r} in {self.lake.root}")
        steps = [
            {k: v for k, v in r.items() if k != "episode_id"} for r in self._step_rows([episode_id], _STEP_COLUMNS)
        ]
        return {"episode": eps[0], "steps": steps, "rl": self._rl_rows([episode_id]).get(episode_id, {})}

    def episodes(self, episode_ids: list[str]) -> dict[str, dict[str, Any]]:
        """Many episodes in three queries (the static build)."""
        if not episode_ids:
            return {}
        out = {
            r["episode_id"]: {"episode": r, "steps": [], "rl": {}}
            for r in self._rows("SELECT * FROM ep WHERE list_contains(?, episode_id)", [episode_ids])
        }
        for r in self._step_rows(episode_ids, _STEP_COLUMNS):
            if r["episode_id"] in out:
                out[r.pop("episode_id")]["steps"].append(r)
        for eid, rl in self._rl_rows(episode_ids).items():
            if eid in out:
                out[eid]["rl"] = rl
        return out

    def _rl_rows(self, episode_ids: list[str]) -> dict[str, dict[int, dict[str, Any]]]:
        rows = self._rows(
            f"SELECT episode_id, {_RL_COLUMNS} FROM rl WHERE list_contains(?, episode_id) ORDER BY round", [episode_ids]
        )
        out: dict[str, dict[int, dict[str, Any]]] = {}
        for r in rows:
            out.setdefault(r.pop("episode_id"), {})[r["step_idx"]] = r  # the newest round's row wins
        return out

    def screenshot(self, episode_id: str, step_idx: int) -> bytes:
        if not SAFE_ID.match(episode_id or ""):
            raise ViewerError(f"not an episode id: {episode_id[:80]!r}")
        rows = self._step_rows([episode_id], "step_idx, screenshot", f"AND step_idx = {int(step_idx)}")
        if not rows or rows[0]["screenshot"] is None:
            raise ViewerError(f"no screenshot for episode {episode_id!r} step {step_idx}")
        return rows[0]["screenshot"]

    def screenshots(self, episode_ids: list[str]):
        """(episode_id, step_idx, png) for every step of these episodes, streamed in batches."""
        if not episode_ids:
            return
        rows = self._step_rows(episode_ids, "step_idx, screenshot", "AND screenshot IS NOT NULL")
        for r in rows:
            yield r["episode_id"], r["step_idx"], r["screenshot"]

    # ------------------------------------------------------------------ side by side
    def pairs(self, a: Side, b: Side, limit: int = 500) -> list[dict[str, Any]]:
        """Episodes of the same task and seed under side a and side b (the first sample of each)."""
        versions = self.versions()
        wa, pa_ = a.where(versions)
        wb, pb = b.where(versions)
        pick = (
            "SELECT task_id, seed, episode_id AS eid, success AS ok, n_steps AS n FROM ("
            "SELECT *, row_number() OVER (PARTITION BY task_id, seed ORDER BY coalesce(sample_idx, 0), "
            "episode_id) AS r FROM ep WHERE {w}) WHERE r = 1"
        )
        sql = (
            f"WITH a AS ({pick.format(w=wa)}), b AS ({pick.format(w=wb)}) "
            "SELECT a.task_id, a.seed, a.eid AS a_id, b.eid AS b_id, a.ok AS a_success, b.ok AS b_success, "
            "a.n AS a_steps, b.n AS b_steps FROM a JOIN b USING (task_id, seed) "
            "WHERE a.eid <> b.eid ORDER BY a.task_id, a.seed LIMIT ?"
        )
        return self._rows(sql, pa_ + pb + [int(limit)])

    # ------------------------------------------------------------------ iteration report
    def report(self) -> dict[str, Any]:
        evals = self._rows("""
            SELECT v.iteration, v.checkpoint_id, v.task_id, v.split, v.n_episodes, v.successes, v.success_rate,
                   v.ci_low, v.ci_high, v.created_at, c.method
            FROM evals v LEFT JOIN (SELECT DISTINCT ON (checkpoint_id) checkpoint_id, method FROM checkpoints) c
                 USING (checkpoint_id)
            ORDER BY v.iteration, v.created_at, v.checkpoint_id, v.task_id""")
        volumes = self._rows("""
            SELECT iteration, stage, CASE WHEN policy = 'student' THEN 'student' ELSE 'teacher' END AS source,
                   count(*) AS episodes, count(*) FILTER (success) AS successes, coalesce(sum(n_steps), 0) AS steps
            FROM ep GROUP BY ALL ORDER BY iteration, stage, source""")
        datasets = self._rows("""SELECT iteration, dataset_id, n_episodes, n_steps, source_counts, created_at
                                 FROM datasets ORDER BY iteration, created_at""")
        lineage = self._rows("""SELECT iteration, checkpoint_id, method, parent_checkpoint, dataset_id, adapter,
                                       metrics, created_at FROM checkpoints ORDER BY created_at""")
        rl = self._rows("""SELECT run_key, iteration, round, global_step, algo, loss, entropy, approx_kl, clip_frac,
                                  grad_norm, round_success FROM rl_metrics ORDER BY run_key, global_step""")
        curriculum: list[dict[str, Any]] = []
        if "curriculum" in TABLES:  # written by the flywheel's curriculum (when it runs)
            curriculum = self._rows(
                "SELECT iteration, task_id, decision, success_rate, evidence, teacher_demos, "
                "rollout_seeds, rl, reason FROM curriculum ORDER BY iteration, task_id"
            )
        for c in lineage:
            try:
                c["metrics"] = json.loads(c["metrics"]) if c["metrics"] else {}
            except ValueError:
                c["metrics"] = {}
        # the same queries as the Prefect iteration artifact (tasks/artifacts.py)
        per_task = self._one_line(lambda: iteration_table(self.con))
        teacher = self._one_line(lambda: teacher_spend_rows(self.con))
        return {
            "evals": evals,
            "volumes": volumes,
            "datasets": datasets,
            "lineage": lineage,
            "rl": rl,
            "curriculum": curriculum,
            "per_task": per_task,
            "teacher": teacher,
        }

    def close(self) -> None:
        self.con.close()


def open_lake(root: str | Path | None) -> ViewerData:
    """ViewerData over `root`, with LakeError's one line when there is none."""
    try:
        return ViewerData(root)
    except LakeError:
        raise
    except duckdb.Error as e:
        raise LakeError(f"cannot read the lake at {root}: {str(e).splitlines()[0]}") from None
