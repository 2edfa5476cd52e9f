"""The lake's versioned table schemas: one pyarrow schema per table, documented per column.

Every Parquet file the lake writer produces carries `flywheel.schema_version` and
`flywheel.table` in its footer metadata. `iteration` and `stage` are hive partition
columns: they live in the path (`<table>/iteration=<n>/stage=<stage>/`), not in the file.

Evolving a schema: add *nullable* columns only and bump SCHEMA_VERSION; files written by
older versions stay readable (DuckDB's `union_by_name` fills the new columns with NULL).
`python -m storage.schema > docs/SCHEMA.md` regenerates the column reference.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 1

PARTITION_COLUMNS = {"iteration": "INTEGER", "stage": "VARCHAR"}

_TS = pa.timestamp("us", tz="UTC")


def _f(name: str, typ: pa.DataType, doc: str, nullable: bool = True) -> pa.Field:
    return pa.field(name, typ, nullable=nullable, metadata={"doc": doc})


# Columns every table carries so any row can be traced to the code and config that wrote it.
_PROVENANCE = [
    _f("run_key", pa.string(), "Deterministic key of the stage run that wrote the row (rerun => replaced)", False),
    _f("git_sha", pa.string(), "Commit of the code that wrote the row"),
    _f("config_hash", pa.string(), "Hash of the stage config that produced the row"),
]

TASKS = pa.schema([
    _f("task_id", pa.string(), "Task id, e.g. 'click-test'", False),
    _f("env", pa.string(), "Environment family: 'miniwob' or 'osworld'", False),
    _f("instruction", pa.string(), "Instruction template (the per-seed instruction is on each episode)"),
    _f("config", pa.string(), "Task config as JSON (seed ranges per split, max_steps, env options)"),
    _f("split", pa.string(), "'train', 'eval' (held-out task) or 'both' (split by seed ranges)", False),
    _f("teacher_supported", pa.bool_(), "Whether the scripted teacher solves the task"),
    _f("source", pa.string(), "Where the task comes from: 'miniwob', 'osworld', 'import'"),
    *_PROVENANCE,
])

EPISODES = pa.schema([
    _f("episode_id", pa.string(), "Deterministic id: hash of (rollout key, task, seed, policy, sample index)", False),
    _f("task_id", pa.string(), "Task id (joins tasks.task_id)", False),
    _f("seed", pa.int64(), "Env seed: the same seed reproduces the same task instance", False),
    _f("split", pa.string(), "'train' or 'eval': which seed range the seed belongs to"),
    _f("instruction", pa.string(), "The instruction shown for this seed"),
    _f("env", pa.string(), "Environment family"),
    _f("env_version", pa.string(), "Version of the env package (e.g. miniwob 1.1.0)"),
    _f("policy", pa.string(), "Policy kind: 'scripted', 'student', 'claude', ..."),
    _f("policy_version", pa.string(), "Checkpoint id / model name / teacher version"),
    _f("group_id", pa.string(), "RL group: episodes of the same task instance sampled together"),
    _f("sample_idx", pa.int32(), "Index of the episode within its group"),
    _f("task_reward", pa.float64(), "Binary task reward from the env's evaluator (0 or 1); NULL if it never ran"),
    _f("success", pa.bool_(), "task_reward >= 1 (never derived from the shaped reward)"),
    _f("shaped_reward", pa.float64(), "Optional shaped reward for RL advantages; never used for filtering"),
    _f("n_steps", pa.int32(), "Number of actions taken"),
    _f("n_parse_errors", pa.int32(), "Steps whose model output did not parse"),
    _f("status", pa.string(), "'ok' | 'truncated' (step cap) | 'timeout' (wall clock) | 'error' (env/policy crash)", False),
    _f("error", pa.string(), "One-line cause when status is 'error' or 'timeout'"),
    _f("started_at", _TS, "Episode start (UTC)"),
    _f("ended_at", _TS, "Episode end (UTC)"),
    _f("duration_s", pa.float64(), "Wall time of the episode"),
    _f("cost", pa.float64(), "API cost in USD (teachers behind paid APIs), else 0"),
    *_PROVENANCE,
])

STEPS = pa.schema([
    _f("episode_id", pa.string(), "Episode the step belongs to (joins episodes.episode_id)", False),
    _f("step_idx", pa.int32(), "0-based index; the final observation row has step_idx = n_steps", False),
    _f("is_final", pa.bool_(), "True for the extra row holding the screen after the last action (no action)", False),
    _f("screenshot", pa.binary(), "PNG bytes of the screen the policy saw (final row: the screen after the last action)"),
    _f("screen_w", pa.int32(), "Screenshot width in pixels (the screen space of action coordinates)"),
    _f("screen_h", pa.int32(), "Screenshot height in pixels"),
    _f("ui_text", pa.string(), "Compact text view of the UI (DOM / accessibility tree) with element boxes"),
    _f("prompt_context", pa.string(), "JSON: what the prompt held besides the screenshot (history window, options)"),
    _f("response_text", pa.string(), "The policy's full output text (untrusted; never executed)"),
    _f("thought", pa.string(), "The <thinking> part of the response"),
    _f("action_desc", pa.string(), "The 'Action:' line of the response"),
    _f("raw_action", pa.string(), "JSON of the action arguments as written (model image space)"),
    _f("action", pa.string(), "JSON of the parsed action in screen pixels (agents.actions schema); NULL on parse error"),
    _f("executed", pa.string(), "JSON of the env-native form actually executed"),
    _f("parse_ok", pa.bool_(), "The response parsed into the action schema"),
    _f("parse_error", pa.string(), "Why parsing failed"),
    _f("fallback_parse", pa.bool_(), "Parsed only by a lenient fallback (excluded from SFT data)"),
    _f("exec_error", pa.string(), "Why the env could not execute the action"),
    _f("latency_ms", pa.float64(), "Policy decision time"),
    _f("env_ms", pa.float64(), "Env step time"),
    _f("prompt_tokens", pa.int32(), "Prompt length in tokens (model policies)"),
    _f("completion_tokens", pa.int32(), "Response length in tokens"),
    _f("token_ids", pa.list_(pa.int32()), "Response token ids (RL)"),
    _f("logprobs", pa.list_(pa.float32()), "Per-token log-probabilities of the response under the sampling policy (RL)"),
    _f("reward", pa.float64(), "Env reward observed after this step (informational)"),
    _f("feedback", pa.string(), "Env/judge feedback text after the step (SDPO self-teacher input)"),
    *_PROVENANCE,
])

CHECKPOINTS = pa.schema([
    _f("checkpoint_id", pa.string(), "Checkpoint id", False),
    _f("path", pa.string(), "Folder loadable by transformers (adapter or full); relative to the lake root when inside the lake"),
    _f("method", pa.string(), "'init' | 'sft' | 'grpo' | 'sdpo' | 'import'"),
    _f("base_model", pa.string(), "Base model folder (relative to the lake root when inside the lake) or Hub id"),
    _f("parent_checkpoint", pa.string(), "Checkpoint this one was trained from"),
    _f("dataset_id", pa.string(), "Dataset manifest used (joins datasets.dataset_id)"),
    _f("adapter", pa.bool_(), "True if `path` holds a LoRA adapter"),
    _f("metrics", pa.string(), "JSON of training metrics (final loss, steps, tokens/s)"),
    _f("created_at", _TS, "Creation time (UTC)"),
    *_PROVENANCE,
])

DATASETS = pa.schema([
    _f("dataset_id", pa.string(), "Dataset manifest id", False),
    _f("name", pa.string(), "Human name"),
    _f("query", pa.string(), "The curate SQL that selected the data"),
    _f("episode_ids", pa.list_(pa.string()), "Episodes included"),
    _f("n_episodes", pa.int64(), "Episode count"),
    _f("n_steps", pa.int64(), "Step count"),
    _f("source_counts", pa.string(), "JSON: episodes per (policy, iteration)"),
    _f("path", pa.string(), "Exported dataset folder (datasets.load_dataset('parquet', ...)); relative to the lake root"),
    _f("created_at", _TS, "Creation time (UTC)"),
    *_PROVENANCE,
])

EVALS = pa.schema([
    _f("eval_id", pa.string(), "Evaluation run id", False),
    _f("checkpoint_id", pa.string(), "Evaluated checkpoint (or policy name); a folder inside the lake relative to its root"),
    _f("task_id", pa.string(), "Task, or '__all__' for the overall row"),
    _f("split", pa.string(), "Seed split / task list evaluated"),
    _f("n_episodes", pa.int64(), "Episodes run"),
    _f("successes", pa.int64(), "Successful episodes"),
    _f("success_rate", pa.float64(), "successes / n_episodes"),
    _f("ci_low", pa.float64(), "95% Wilson interval, low"),
    _f("ci_high", pa.float64(), "95% Wilson interval, high"),
    _f("avg_steps", pa.float64(), "Mean steps per episode"),
    _f("parse_error_rate", pa.float64(), "Parse errors / steps"),
    _f("created_at", _TS, "Creation time (UTC)"),
    *_PROVENANCE,
])

TABLES: dict[str, pa.Schema] = {
    "tasks": TASKS,
    "episodes": EPISODES,
    "steps": STEPS,
    "checkpoints": CHECKPOINTS,
    "datasets": DATASETS,
    "evals": EVALS,
}

# Large binary columns: never dictionary-encoded, and what "queries that skip screenshots" skip.
BLOB_COLUMNS = {"steps": ["screenshot"]}


def schema_for(table: str) -> pa.Schema:
    try:
        return TABLES[table]
    except KeyError:
        raise KeyError(f"unknown lake table {table!r}; tables are: {', '.join(TABLES)}") from None


def duckdb_type(t: pa.DataType) -> str:
    """DuckDB SQL type for an arrow type used in these schemas."""
    if pa.types.is_list(t):
        return duckdb_type(t.value_type) + "[]"
    simple = {
        pa.string(): "VARCHAR", pa.int32(): "INTEGER", pa.int64(): "BIGINT", pa.float32(): "FLOAT",
        pa.float64(): "DOUBLE", pa.bool_(): "BOOLEAN", pa.binary(): "BLOB", _TS: "TIMESTAMPTZ",
    }
    return simple[t]


def schema_markdown() -> str:
    lines = [f"# Lake schema (version {SCHEMA_VERSION})", "",
             "Generated by `python -m storage.schema`. Every table is hive-partitioned as",
             "`lake/<table>/iteration=<n>/stage=<stage>/<run_key>-<part>.parquet`; `iteration` (INTEGER)",
             "and `stage` (VARCHAR) come from the path.", ""]
    for name, schema in TABLES.items():
        lines += [f"## `{name}`", "", "| column | type | nullable | meaning |", "|---|---|---|---|"]
        for f in schema:
            doc = (f.metadata or {}).get(b"doc", b"").decode()
            lines.append(f"| `{f.name}` | {duckdb_type(f.type)} | {'yes' if f.nullable else 'no'} | {doc} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(schema_markdown())
