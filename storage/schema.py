"""The lake's versioned table schemas: one pyarrow schema per table, documented per column.

Every table of the DuckLake catalog also has `iteration`, `stage` and `part` (storage.lake).

Evolving a schema: add *nullable* columns only and bump SCHEMA_VERSION; opening a lake adds the new
columns to its tables (ALTER TABLE ... ADD COLUMN), and older rows read them as NULL.
`python -m storage.schema > docs/SCHEMA.md` regenerates the column reference.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 5

PARTITION_COLUMNS = {"iteration": "INTEGER", "stage": "VARCHAR"}

_TS = pa.timestamp("us", tz="UTC")
_SNAPSHOT_DOC = "The lake snapshot the stage read (`flywheel query --at`; curate at it reproduces the dataset)"


def _f(name: str, typ: pa.DataType, doc: str, nullable: bool = True) -> pa.Field:
    return pa.field(name, typ, nullable=nullable, metadata={"doc": doc})


# Columns every table carries so any row can be traced to the code and config that wrote it.
_PROVENANCE = [
    _f("run_key", pa.string(), "Deterministic key of the stage run that wrote the row (rerun => replaced)", False),
    _f("git_sha", pa.string(), "Commit of the code that wrote the row"),
    _f("config_hash", pa.string(), "Hash of the stage config that produced the row"),
]

TASKS = pa.schema(
    [
        _f("task_id", pa.string(), "Task id, e.g. 'click-test'", False),
        _f("env", pa.string(), "Environment family: 'miniwob' or 'osworld'", False),
        _f("instruction", pa.string(), "Instruction template (the per-seed instruction is on each episode)"),
        _f("config", pa.string(), "Task config as JSON (seed ranges per split, max_steps, env options)"),
        _f("split", pa.string(), "'train', 'eval' (held-out task) or 'both' (split by seed ranges)", False),
        _f("teacher_supported", pa.bool_(), "Whether the scripted teacher solves the task"),
        _f("source", pa.string(), "Where the task comes from: 'miniwob', 'osworld', 'import'"),
        *_PROVENANCE,
    ]
)

EPISODES = pa.schema(
    [
        _f(
            "episode_id",
            pa.string(),
            "Deterministic id: hash of (rollout key, task, seed, policy, sample index)",
            False,
        ),
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
        _f(
            "status",
            pa.string(),
            "'ok' | 'truncated' (step cap) | 'timeout' (wall clock) | 'error' (env/policy crash)",
            False,
        ),
        _f("error", pa.string(), "One-line cause when status is 'error' or 'timeout'"),
        _f("started_at", _TS, "Episode start (UTC)"),
        _f("ended_at", _TS, "Episode end (UTC)"),
        _f("duration_s", pa.float64(), "Wall time of the episode"),
        _f("cost", pa.float64(), "API cost in USD (teachers behind paid APIs: the sum of the steps' cost), else 0"),
        _f(
            "input_tokens",
            pa.int64(),
            "Prompt tokens over the episode's policy calls (cache reads and writes included)",
        ),
        _f("output_tokens", pa.int64(), "Response tokens over the episode's policy calls (extended thinking included)"),
        *_PROVENANCE,
    ]
)

STEPS = pa.schema(
    [
        _f("episode_id", pa.string(), "Episode the step belongs to (joins episodes.episode_id)", False),
        _f("step_idx", pa.int32(), "0-based index; the final observation row has step_idx = n_steps", False),
        _f(
            "is_final", pa.bool_(), "True for the extra row holding the screen after the last action (no action)", False
        ),
        _f(
            "screenshot",
            pa.binary(),
            "PNG bytes of the screen the policy saw (final row: the screen after the last action)",
        ),
        _f("screen_w", pa.int32(), "Screenshot width in pixels (the screen space of action coordinates)"),
        _f("screen_h", pa.int32(), "Screenshot height in pixels"),
        _f("ui_text", pa.string(), "Compact text view of the UI (DOM / accessibility tree) with element boxes"),
        _f(
            "prompt_context", pa.string(), "JSON: what the prompt held besides the screenshot (history window, options)"
        ),
        _f("response_text", pa.string(), "The policy's full output text (untrusted; never executed)"),
        _f("thought", pa.string(), "The <thinking> part of the response"),
        _f("action_desc", pa.string(), "The 'Action:' line of the response"),
        _f("raw_action", pa.string(), "JSON of the action arguments as written (model image space)"),
        _f(
            "action",
            pa.string(),
            "JSON of the parsed action in screen pixels (agents.actions schema); NULL on parse error",
        ),
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
        _f(
            "logprobs",
            pa.list_(pa.float32()),
            "Per-token log-probabilities of the response under the sampling policy (RL)",
        ),
        _f("reward", pa.float64(), "Env reward observed after this step (informational)"),
        _f("feedback", pa.string(), "Env/judge feedback text after the step (SDPO self-teacher input)"),
        _f(
            "cost",
            pa.float64(),
            "API cost of the step in USD (paid teachers, priced with claude.prices); NULL otherwise",
        ),
        _f("cache_read_tokens", pa.int32(), "Prompt-cache read tokens of the step's API calls (part of prompt_tokens)"),
        _f(
            "cache_write_tokens",
            pa.int32(),
            "Prompt-cache write tokens of the step's API calls (part of prompt_tokens)",
        ),
        _f(
            "raw_response",
            pa.string(),
            "JSON list of the API replies behind the step, verbatim (paid teachers; untrusted)",
        ),
        *_PROVENANCE,
    ]
)

CHECKPOINTS = pa.schema(
    [
        _f("checkpoint_id", pa.string(), "Checkpoint id", False),
        _f(
            "path",
            pa.string(),
            "Folder loadable by transformers (adapter or full); relative to the lake root when inside the lake",
        ),
        _f("method", pa.string(), "'init' | 'sft' | 'grpo' | 'sdpo' | 'import'"),
        _f("base_model", pa.string(), "Base model folder (relative to the lake root when inside the lake) or Hub id"),
        _f("parent_checkpoint", pa.string(), "Checkpoint this one was trained from"),
        _f("dataset_id", pa.string(), "Dataset manifest used (joins datasets.dataset_id)"),
        _f("adapter", pa.bool_(), "True if `path` holds a LoRA adapter"),
        _f("metrics", pa.string(), "JSON of training metrics (final loss, steps, tokens/s)"),
        _f("created_at", _TS, "Creation time (UTC)"),
        _f(
            "lake_snapshot",
            pa.int64(),
            "The lake snapshot the stage read (`flywheel query --at`; curate at it reproduces the dataset)",
        ),
        *_PROVENANCE,
    ]
)

DATASETS = pa.schema(
    [
        _f("dataset_id", pa.string(), "Dataset manifest id", False),
        _f("name", pa.string(), "Human name"),
        _f("query", pa.string(), "The curate SQL that selected the data"),
        _f("episode_ids", pa.list_(pa.string()), "Episodes included"),
        _f("n_episodes", pa.int64(), "Episode count"),
        _f("n_steps", pa.int64(), "Step count"),
        _f("source_counts", pa.string(), "JSON: episodes per (policy, iteration)"),
        _f(
            "path",
            pa.string(),
            "Exported dataset folder (datasets.load_dataset('parquet', ...)); relative to the lake root",
        ),
        _f("created_at", _TS, "Creation time (UTC)"),
        _f(
            "lake_snapshot",
            pa.int64(),
            "The lake snapshot the stage read (`flywheel query --at`; curate at it reproduces the dataset)",
        ),
        *_PROVENANCE,
    ]
)

EVALS = pa.schema(
    [
        _f("eval_id", pa.string(), "Evaluation run id", False),
        _f(
            "checkpoint_id",
            pa.string(),
            "Evaluated checkpoint (or policy name); a folder inside the lake relative to its root",
        ),
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
        _f(
            "lake_snapshot",
            pa.int64(),
            "The lake snapshot the stage read (`flywheel query --at`; curate at it reproduces the dataset)",
        ),
        *_PROVENANCE,
    ]
)

# RL (training/rl.py). One `rl_metrics` row per optimizer step of a round's update and one `rl_rows` row per
# training row (episode step) of the round: its advantage and, for SDPO, the teacher context it was distilled
# with, so an update can be reproduced from the lake. Both are written under stage 'rl' with the RL run's key,
# one file part per round (a rerun of a round replaces it).
RL_METRICS = pa.schema(
    [
        _f("round", pa.int32(), "RL round within the run (sample -> update -> reload)", False),
        _f("update_step", pa.int32(), "Optimizer step within the round's update (0-based)", False),
        _f("global_step", pa.int64(), "Optimizer step over the whole run (resumed runs continue the count)"),
        _f("epoch", pa.int32(), "Pass over the round's rows the step belongs to"),
        _f("algo", pa.string(), "'grpo' | 'dr_grpo' | 'gspo' | 'sdpo', or 'clone' for an rl.clone_steps step"),
        _f(
            "loss",
            pa.float64(),
            "Aggregated loss of the step (PG, blended with SDPO by sdpo_weight, + kl_coef * KL); "
            "a 'clone' step: the token-mean NLL of its rows",
        ),
        _f("entropy", pa.float64(), "Policy entropy, mean over the step's response tokens (nats)"),
        _f("clip_frac", pa.float64(), "Fraction of response tokens whose PPO clip is active (zero gradient)"),
        _f("approx_kl", pa.float64(), "k3 estimate of KL(old || current) over the response tokens"),
        _f("kl_ref", pa.float64(), "k3 estimate of KL(current || reference), 0 when kl_coef is 0 (no reference model)"),
        _f("ratio_mean", pa.float64(), "Mean importance ratio current / old over the response tokens"),
        _f("is_weight_mean", pa.float64(), "Mean truncated IS weight min(exp(old - behaviour), is_cap) (stale rows)"),
        _f("adv_mean", pa.float64(), "Mean advantage of the step's rows"),
        _f("adv_std", pa.float64(), "Std of the advantages of the step's rows"),
        _f("adv_abs", pa.float64(), "Mean |advantage| of the step's rows"),
        _f("grad_norm", pa.float64(), "Global gradient norm before clipping"),
        _f("lr", pa.float64(), "Learning rate of the step"),
        _f("n_rows", pa.int32(), "Step rows in the minibatch"),
        _f("n_tokens", pa.int64(), "Response tokens in the minibatch"),
        _f("n_sdpo_rows", pa.int32(), "Rows with a privileged teacher context (the SDPO term applies)"),
        _f(
            "sdpo_teacher_higher_frac",
            pa.float64(),
            "SDPO: fraction of those rows' tokens the teacher scores above the student",
        ),
        _f("sdpo_adv_mean", pa.float64(), "SDPO: mean per-token advantage log pT - log pS over those rows' tokens"),
        _f(
            "sdpo_div_mean",
            pa.float64(),
            (
                "SDPO topk: mean per-token divergence between student and teacher over "
                "the top-k + tail buckets (null in sampled mode)"
            ),
        ),
        _f(
            "demo_nll",
            pa.float64(),
            (
                "rl.demo_nll: token-mean NLL of the minibatch's replayed rows (the "
                "behaviour cloning term before its weight; null without replayed rows)"
            ),
        ),
        _f("round_success", pa.float64(), "Success rate of the round's sampled episodes (replayed ones excluded)"),
        _f("n_groups", pa.int32(), "Groups in the round"),
        _f("n_groups_kept", pa.int32(), "Groups with a learning signal (nonzero reward variance, after replay)"),
        _f("n_replayed", pa.int32(), "Stored successes replayed into all-failed groups this round"),
        _f(
            "rollout_run_keys",
            pa.list_(pa.string()),
            "Run keys of the rollouts the round trained on (joins episodes.run_key)",
        ),
        _f("created_at", _TS, "Creation time (UTC)"),
        *_PROVENANCE,
    ]
)

RL_ROWS = pa.schema(
    [
        _f(
            "episode_id",
            pa.string(),
            "Episode of the row (joins episodes.episode_id; a replayed success keeps its own id)",
            False,
        ),
        _f("step_idx", pa.int32(), "Step of the episode (joins steps.step_idx)", False),
        _f("round", pa.int32(), "RL round the row was trained in", False),
        _f("group_id", pa.string(), "Group the row was trained in (a replayed episode: the group it joined)"),
        _f("task_id", pa.string(), "Task id"),
        _f(
            "reward",
            pa.float64(),
            "Episode reward used for the advantage (binary task reward; 1 for a replayed success)",
        ),
        _f(
            "advantage",
            pa.float64(),
            (
                "Advantage of the row: the episode's group advantage (+ gigpo_omega x "
                "step_advantage with GiGPO on) minus any parse-error penalty"
            ),
        ),
        _f(
            "step_advantage",
            pa.float64(),
            (
                "GiGPO step advantage: the row's discounted return centred within its "
                "step group (its group's rows with the same screen_hash); null when "
                "GiGPO is off"
            ),
        ),
        _f(
            "screen_hash",
            pa.string(),
            "sha1 of the step's screenshot PNG bytes: the GiGPO anchor (equal screens of one group form a step group)",
        ),
        _f(
            "replayed",
            pa.bool_(),
            "A stored success (teacher demo or earlier student success) joined to an all-failed group",
        ),
        _f("parse_error", pa.bool_(), "The row's response did not parse (kept: it is the model's own output)"),
        _f("n_tokens", pa.int32(), "Response tokens of the row"),
        _f(
            "old_logp_mean",
            pa.float64(),
            "Mean per-token log-prob of the response under the weights at the start of the update",
        ),
        _f("is_weight_mean", pa.float64(), "Mean truncated IS weight of the row's tokens (1 for replayed rows)"),
        _f("sdpo", pa.bool_(), "The row had a privileged teacher context (an SDPO term)"),
        _f(
            "sdpo_sibling_episode_id",
            pa.string(),
            "SDPO: the successful episode whose action sequence the teacher saw ('Correct solution:')",
        ),
        _f("sdpo_feedback", pa.string(), "SDPO: the feedback text of the failed attempt the teacher saw"),
        _f("created_at", _TS, "Creation time (UTC)"),
        *_PROVENANCE,
    ]
)

# The flywheel's curriculum (flywheel/curriculum.py): per iteration, one row per train task saying where the
# teacher, rollout and RL budgets went and why, plus a row for task '__sft__' (whether SFT ran: entropulse).
CURRICULUM = pa.schema(
    [
        _f("task_id", pa.string(), "Task id, or '__sft__' for the iteration's SFT decision", False),
        _f("decision", pa.string(), "'bootstrap' | 'train' | 'teacher' | 'park' | 'check' | 'sft' | 'skip_sft'", False),
        _f("reason", pa.string(), "Why, in one line (the evidence and the threshold it met)"),
        _f("success_rate", pa.float64(), "The task's success in the evidence (null: none yet)"),
        _f("evidence", pa.string(), "Where that success comes from: 'evaluate it<k>' (held-out) or 'rollouts it<k>'"),
        _f("n_evidence", pa.int32(), "Episodes behind the evidence"),
        _f("demos_spent", pa.int32(), "Teacher demos of the task already in the lake before this iteration"),
        _f(
            "teacher_demos",
            pa.int32(),
            "Teacher demos planned for this iteration (within bootstrap.max_demos_per_task)",
        ),
        _f("rollout_seeds", pa.int32(), "Student rollout seeds planned for the task this iteration"),
        _f("rl", pa.bool_(), "Whether RL samples the task this iteration"),
        _f("created_at", _TS, "Creation time (UTC)"),
        *_PROVENANCE,
    ]
)

TABLES: dict[str, pa.Schema] = {
    "tasks": TASKS,
    "episodes": EPISODES,
    "steps": STEPS,
    "checkpoints": CHECKPOINTS,
    "datasets": DATASETS,
    "evals": EVALS,
    "rl_metrics": RL_METRICS,
    "rl_rows": RL_ROWS,
    "curriculum": CURRICULUM,
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
        pa.string(): "VARCHAR",
        pa.int32(): "INTEGER",
        pa.int64(): "BIGINT",
        pa.float32(): "FLOAT",
        pa.float64(): "DOUBLE",
        pa.bool_(): "BOOLEAN",
        pa.binary(): "BLOB",
        _TS: "TIMESTAMPTZ",
    }
    return simple[t]


def schema_markdown() -> str:
    lines = [
        f"# Lake schema (version {SCHEMA_VERSION})",
        "",
        "Generated by `python -m storage.schema`.",
        "",
        "## Layout",
        "",
        "The lake is a [DuckLake](https://ducklake.select): a catalog database plus Parquet data.",
        "",
        "- Local lake (a folder): `lake/catalog.sqlite` (the catalog: tables, snapshots, small inserts inlined)",
        "  and `lake/data/` (Parquet files, written by DuckLake and merged by compaction). Side folders:",
        "  `lake/_datasets/` (curated exports) and `lake/_checkpoints/`; rows name them relative to the root,",
        "  so a copied or moved lake still opens.",
        "- Many machines: `lake.catalog: postgresql://user@host:5432/db` (password from `$PGPASSWORD` or",
        "  `~/.pgpass`) with `lake.root: s3://bucket/prefix` (data under `s3://bucket/prefix/data/`).",
        "- Every table also has `iteration` (INTEGER), `stage` (VARCHAR) and `part` (VARCHAR: `<run_key>/<part>`",
        "  of the write that made the row, which a rerun replaces in one transaction). `flywheel query` shows",
        "  `iteration` and `stage`, not `part`.",
        "- Every commit is a snapshot: `flywheel lake snapshots`, `flywheel query --at <snapshot | dataset id>`.",
        "  `datasets`, `checkpoints` and `evals` rows record the snapshot their stage read (`lake_snapshot`).",
        "- Compaction runs after every stage; `flywheel lake compact` runs it by hand. An old one-file-per-write",
        "  lake converts with `flywheel lake migrate OLD NEW`.",
        "",
        "## The DuckDB CLI",
        "",
        "The extensions come from the PyPI packages the project pins (offline), or from DuckDB's repository:",
        "",
        "```sql",
        "INSTALL ducklake; INSTALL sqlite;  -- online; offline: LOAD '<site-packages>/duckdb_extension_ducklake/...'",
        "ATTACH 'ducklake:sqlite:lake/catalog.sqlite' AS lake (DATA_PATH 'lake/data/', OVERRIDE_DATA_PATH true);",
        "USE lake;",
        "SELECT task_id, avg(success::INT) FROM episodes GROUP BY 1;",
        "SELECT count(*) FROM episodes AT (VERSION => 12);   -- time travel",
        "```",
        "",
        "Use `READ_ONLY` in the ATTACH options while a flywheel run writes. A PostgreSQL catalog:",
        "`ATTACH 'ducklake:postgres:dbname=db host=... user=...' AS lake (DATA_PATH 's3://bucket/prefix/data/')`",
        "after `INSTALL postgres; INSTALL httpfs;` and an S3 secret (`CREATE SECRET (TYPE s3, ...)`).",
        "",
        "## Tables",
        "",
    ]
    for name, schema in TABLES.items():
        lines += [f"### `{name}`", "", "| column | type | nullable | meaning |", "|---|---|---|---|"]
        for f in schema:
            doc = (f.metadata or {}).get(b"doc", b"").decode()
            lines.append(f"| `{f.name}` | {duckdb_type(f.type)} | {'yes' if f.nullable else 'no'} | {doc} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(schema_markdown())
