"""The lake's versioned table schemas: one pyarrow schema per table, documented per column.

Each table is written as its columns, one per line: `name  type  doc`, where the type is str, i32, i64, f32, f64,
bool, bytes (binary) or time (UTC microseconds), `[]` makes it a list and `!` NOT NULL; an indented line continues
the doc above it. Every table ends with the provenance columns, and in the DuckLake catalog also has `iteration`,
`stage` and `part` (storage.lake).

Evolving a schema: add *nullable* columns only and bump SCHEMA_VERSION; opening a lake adds them (older rows read
NULL). `python -m storage.schema` prints the column reference that docs/SCHEMA.md ends with.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 5

PARTITION_COLUMNS = {"iteration": "INTEGER", "stage": "VARCHAR"}

_TS = pa.timestamp("us", tz="UTC")
_TYPES = {
    "str": (pa.string(), "VARCHAR"),
    "i32": (pa.int32(), "INTEGER"),
    "i64": (pa.int64(), "BIGINT"),
    "f32": (pa.float32(), "FLOAT"),
    "f64": (pa.float64(), "DOUBLE"),
    "bool": (pa.bool_(), "BOOLEAN"),
    "bytes": (pa.binary(), "BLOB"),
    "time": (_TS, "TIMESTAMPTZ"),
}

# Columns every table carries so any row can be traced to the code and config that wrote it.
_PROVENANCE = """
run_key      str!   Deterministic key of the stage run that wrote the row (rerun => replaced)
git_sha      str    Commit of the code that wrote the row
config_hash  str    Hash of the stage config that produced the row
"""


def _columns(spec: str) -> list[pa.Field]:
    rows: list[list[str]] = []
    for line in spec.strip("\n").splitlines():
        if line[:1].isspace():  # the doc of the column above goes on
            rows[-1][2] += " " + line.strip()
        else:
            rows.append(line.split(None, 2))
    out = []
    for name, typ, doc in rows:
        base = typ.rstrip("!").removesuffix("[]")
        arrow = _TYPES[base][0] if base == typ.rstrip("!") else pa.list_(_TYPES[base][0])
        out.append(pa.field(name, arrow, nullable=not typ.endswith("!"), metadata={"doc": doc}))
    return out


def _table(spec: str) -> pa.Schema:
    return pa.schema(_columns(spec) + _columns(_PROVENANCE))


TASKS = _table(
    """
task_id            str!   Task id, e.g. 'click-test'
env                str!   Environment family: 'miniwob' or 'osworld'
instruction        str    Instruction template (the per-seed instruction is on each episode)
config             str    Task config as JSON (seed ranges per split, max_steps, env options)
split              str!   'train', 'eval' (held-out task) or 'both' (split by seed ranges)
teacher_supported  bool   Whether the scripted teacher solves the task
source             str    Where the task comes from: 'miniwob', 'osworld', 'import'
"""
)


EPISODES = _table(
    """
episode_id      str!   Deterministic id: hash of (rollout key, task, seed, policy, sample index)
task_id         str!   Task id (joins tasks.task_id)
seed            i64!   Env seed: the same seed reproduces the same task instance
split           str    'train' or 'eval': which seed range the seed belongs to
instruction     str    The instruction shown for this seed
env             str    Environment family
env_version     str    Version of the env package (e.g. miniwob 1.1.0)
policy          str    Policy kind: 'scripted', 'student', 'claude', ...
policy_version  str    Checkpoint id / model name / teacher version
group_id        str    RL group: episodes of the same task instance sampled together
sample_idx      i32    Index of the episode within its group
task_reward     f64    Binary task reward from the env's evaluator (0 or 1); NULL if it never ran
success         bool   task_reward >= 1 (never derived from the shaped reward)
shaped_reward   f64    Optional shaped reward for RL advantages; never used for filtering
n_steps         i32    Number of actions taken
n_parse_errors  i32    Steps whose model output did not parse
status          str!   'ok' | 'truncated' (step cap) | 'timeout' (wall clock) | 'error' (env/policy crash)
error           str    One-line cause when status is 'error' or 'timeout'
started_at      time   Episode start (UTC)
ended_at        time   Episode end (UTC)
duration_s      f64    Wall time of the episode
cost            f64    API cost in USD (teachers behind paid APIs: the sum of the steps' cost), else 0
input_tokens    i64    Prompt tokens over the episode's policy calls (cache reads and writes included)
output_tokens   i64    Response tokens over the episode's policy calls (extended thinking included)
"""
)


STEPS = _table(
    """
episode_id          str!   Episode the step belongs to (joins episodes.episode_id)
step_idx            i32!   0-based index; the final observation row has step_idx = n_steps
is_final            bool!  True for the extra row holding the screen after the last action (no action)
screenshot          bytes  PNG bytes of the screen the policy saw (final row: the screen after the last action)
screen_w            i32    Screenshot width in pixels (the screen space of action coordinates)
screen_h            i32    Screenshot height in pixels
ui_text             str    Compact text view of the UI (DOM / accessibility tree) with element boxes
prompt_context      str    JSON: what the prompt held besides the screenshot (history window, options)
response_text       str    The policy's full output text (untrusted; never executed)
thought             str    The <thinking> part of the response
action_desc         str    The 'Action:' line of the response
raw_action          str    JSON of the action arguments as written (model image space)
action              str    JSON of the parsed action in screen pixels (agents.actions schema); NULL on parse error
executed            str    JSON of the env-native form actually executed
parse_ok            bool   The response parsed into the action schema
parse_error         str    Why parsing failed
fallback_parse      bool   Parsed only by a lenient fallback (excluded from SFT data)
exec_error          str    Why the env could not execute the action
latency_ms          f64    Policy decision time
env_ms              f64    Env step time
prompt_tokens       i32    Prompt length in tokens (model policies)
completion_tokens   i32    Response length in tokens
token_ids           i32[]  Response token ids (RL)
logprobs            f32[]  Per-token log-probabilities of the response under the sampling policy (RL)
reward              f64    Env reward observed after this step (informational)
feedback            str    Env/judge feedback text after the step (SDPO self-teacher input)
cost                f64    API cost of the step in USD (paid teachers, priced with claude.prices); NULL otherwise
cache_read_tokens   i32    Prompt-cache read tokens of the step's API calls (part of prompt_tokens)
cache_write_tokens  i32    Prompt-cache write tokens of the step's API calls (part of prompt_tokens)
raw_response        str    JSON list of the API replies behind the step, verbatim (paid teachers; untrusted)
"""
)


CHECKPOINTS = _table(
    """
checkpoint_id      str!   Checkpoint id
path               str    Folder loadable by transformers (adapter or full); relative to the lake root when inside
                          the lake
method             str    'init' | 'sft' | 'grpo' | 'sdpo' | 'import'
base_model         str    Base model folder (relative to the lake root when inside the lake) or Hub id
parent_checkpoint  str    Checkpoint this one was trained from
dataset_id         str    Dataset manifest used (joins datasets.dataset_id)
adapter            bool   True if `path` holds a LoRA adapter
metrics            str    JSON of training metrics (final loss, steps, tokens/s)
created_at         time   Creation time (UTC)
lake_snapshot      i64    The lake snapshot the stage read (`flywheel query --at`; curate at it reproduces the
                          dataset)
"""
)


DATASETS = _table(
    """
dataset_id     str!   Dataset manifest id
name           str    Human name
query          str    The curate SQL that selected the data
episode_ids    str[]  Episodes included
n_episodes     i64    Episode count
n_steps        i64    Step count
source_counts  str    JSON: episodes per (policy, iteration)
path           str    Exported dataset folder (datasets.load_dataset('parquet', ...)); relative to the lake root
created_at     time   Creation time (UTC)
lake_snapshot  i64    The lake snapshot the stage read (`flywheel query --at`; curate at it reproduces the dataset)
"""
)


EVALS = _table(
    """
eval_id           str!   Evaluation run id
checkpoint_id     str    Evaluated checkpoint (or policy name); a folder inside the lake relative to its root
task_id           str    Task, or '__all__' for the overall row
split             str    Seed split / task list evaluated
n_episodes        i64    Episodes run
successes         i64    Successful episodes
success_rate      f64    successes / n_episodes
ci_low            f64    95% Wilson interval, low
ci_high           f64    95% Wilson interval, high
avg_steps         f64    Mean steps per episode
parse_error_rate  f64    Parse errors / steps
created_at        time   Creation time (UTC)
lake_snapshot     i64    The lake snapshot the stage read (`flywheel query --at`; curate at it reproduces the
                         dataset)
"""
)


# RL (training/rl.py). One `rl_metrics` row per optimizer step of a round's update and one `rl_rows` row per
# training row (episode step) of the round: its advantage and, for SDPO, the teacher context it was distilled
# with, so an update can be reproduced from the lake. Both are written under stage 'rl' with the RL run's key,
# one file part per round (a rerun of a round replaces it).
RL_METRICS = _table(
    """
round                     i32!   RL round within the run (sample -> update -> reload)
update_step               i32!   Optimizer step within the round's update (0-based)
global_step               i64    Optimizer step over the whole run (resumed runs continue the count)
epoch                     i32    Pass over the round's rows the step belongs to
algo                      str    'grpo' | 'dr_grpo' | 'gspo' | 'sdpo', or 'clone' for an rl.clone_steps step
loss                      f64    Aggregated loss of the step (PG, blended with SDPO by sdpo_weight, + kl_coef * KL);
                                 a 'clone' step: the token-mean NLL of its rows
entropy                   f64    Policy entropy, mean over the step's response tokens (nats)
clip_frac                 f64    Fraction of response tokens whose PPO clip is active (zero gradient)
approx_kl                 f64    k3 estimate of KL(old || current) over the response tokens
kl_ref                    f64    k3 estimate of KL(current || reference), 0 when kl_coef is 0 (no reference model)
ratio_mean                f64    Mean importance ratio current / old over the response tokens
is_weight_mean            f64    Mean truncated IS weight min(exp(old - behaviour), is_cap) (stale rows)
adv_mean                  f64    Mean advantage of the step's rows
adv_std                   f64    Std of the advantages of the step's rows
adv_abs                   f64    Mean |advantage| of the step's rows
grad_norm                 f64    Global gradient norm before clipping
lr                        f64    Learning rate of the step
n_rows                    i32    Step rows in the minibatch
n_tokens                  i64    Response tokens in the minibatch
n_sdpo_rows               i32    Rows with a privileged teacher context (the SDPO term applies)
sdpo_teacher_higher_frac  f64    SDPO: fraction of those rows' tokens the teacher scores above the student
sdpo_adv_mean             f64    SDPO: mean per-token advantage log pT - log pS over those rows' tokens
sdpo_div_mean             f64    SDPO topk: mean per-token divergence between student and teacher over the top-k +
                                 tail buckets (null in sampled mode)
demo_nll                  f64    rl.demo_nll: token-mean NLL of the minibatch's replayed rows (the behaviour cloning
                                 term before its weight; null without replayed rows)
round_success             f64    Success rate of the round's sampled episodes (replayed ones excluded)
n_groups                  i32    Groups in the round
n_groups_kept             i32    Groups with a learning signal (nonzero reward variance, after replay)
n_replayed                i32    Stored successes replayed into all-failed groups this round
rollout_run_keys          str[]  Run keys of the rollouts the round trained on (joins episodes.run_key)
created_at                time   Creation time (UTC)
"""
)


RL_ROWS = _table(
    """
episode_id               str!   Episode of the row (joins episodes.episode_id; a replayed success keeps its own id)
step_idx                 i32!   Step of the episode (joins steps.step_idx)
round                    i32!   RL round the row was trained in
group_id                 str    Group the row was trained in (a replayed episode: the group it joined)
task_id                  str    Task id
reward                   f64    Episode reward used for the advantage (binary task reward; 1 for a replayed success)
advantage                f64    Advantage of the row: the episode's group advantage (+ gigpo_omega x step_advantage
                                with GiGPO on) minus any parse-error penalty
step_advantage           f64    GiGPO step advantage: the row's discounted return centred within its step group (its
                                group's rows with the same screen_hash); null when GiGPO is off
screen_hash              str    sha1 of the step's screenshot PNG bytes: the GiGPO anchor (equal screens of one
                                group form a step group)
replayed                 bool   A stored success (teacher demo or earlier student success) joined to an all-failed
                                group
parse_error              bool   The row's response did not parse (kept: it is the model's own output)
n_tokens                 i32    Response tokens of the row
old_logp_mean            f64    Mean per-token log-prob of the response under the weights at the start of the update
is_weight_mean           f64    Mean truncated IS weight of the row's tokens (1 for replayed rows)
sdpo                     bool   The row had a privileged teacher context (an SDPO term)
sdpo_sibling_episode_id  str    SDPO: the successful episode whose action sequence the teacher saw ('Correct
                                solution:')
sdpo_feedback            str    SDPO: the feedback text of the failed attempt the teacher saw
created_at               time   Creation time (UTC)
"""
)


# The flywheel's curriculum (flywheel/curriculum.py): per iteration, one row per train task saying where the
# teacher, rollout and RL budgets went and why, plus a row for task '__sft__' (whether SFT ran: entropulse).
CURRICULUM = _table(
    """
task_id        str!   Task id, or '__sft__' for the iteration's SFT decision
decision       str!   'bootstrap' | 'train' | 'teacher' | 'park' | 'check' | 'sft' | 'skip_sft'
reason         str    Why, in one line (the evidence and the threshold it met)
success_rate   f64    The task's success in the evidence (null: none yet)
evidence       str    Where that success comes from: 'evaluate it<k>' (held-out) or 'rollouts it<k>'
n_evidence     i32    Episodes behind the evidence
demos_spent    i32    Teacher demos of the task already in the lake before this iteration
teacher_demos  i32    Teacher demos planned for this iteration (within bootstrap.max_demos_per_task)
rollout_seeds  i32    Student rollout seeds planned for the task this iteration
rl             bool   Whether RL samples the task this iteration
created_at     time   Creation time (UTC)
"""
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


def schema_for(table: str) -> pa.Schema:
    try:
        return TABLES[table]
    except KeyError:
        raise KeyError(f"unknown lake table {table!r}; tables are: {', '.join(TABLES)}") from None


def duckdb_type(t: pa.DataType) -> str:
    """DuckDB SQL type for an arrow type used in these schemas."""
    if pa.types.is_list(t):
        return duckdb_type(t.value_type) + "[]"
    return next(sql for arrow, sql in _TYPES.values() if arrow == t)


def schema_markdown() -> str:
    """The column reference (docs/SCHEMA.md's "Tables" section)."""
    lines = ["## Tables", ""]
    for name, schema in TABLES.items():
        lines += [f"### `{name}`", "", "| column | type | nullable | meaning |", "|---|---|---|---|"]
        for f in schema:
            doc = (f.metadata or {}).get(b"doc", b"").decode()
            lines.append(f"| `{f.name}` | {duckdb_type(f.type)} | {'yes' if f.nullable else 'no'} | {doc} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(schema_markdown())
