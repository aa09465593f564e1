"""The single source of truth for the lake's tables, columns and types.

Every other module, every SQL view under ``sql/``, the docs and the tests use the names
defined here. A column added to the lake is added here first.

The partition columns (``run``, ``rollout_id``, ``TABLE_PARTITIONS``) live in the directory
names, not in the files (the layout: pipeline/tokenlake/layout.py); readers (DuckDB
``hive_partitioning``, Spark, Trino, polars) add them back. A step's training rollout file and
its evaluation file share one partition and are told apart by the ``evaluation`` column.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from tokenlake.errors import RowKeysError

if TYPE_CHECKING:
    import pyarrow as pa

# The Arrow schemas and type maps below are built on first use (each function registered with
# `_built_on_first_use` gives the module attribute it names, through the module's `__getattr__`):
# importing pyarrow costs ~0.15 s of CPU, and the commands that only read the lake through
# DuckDB (`query`, `audit`, `verify`) never need it.
_T = TypeVar("_T")
_ARROW_BUILDERS: dict[str, Callable[[], Any]] = {}


def _built_on_first_use(name: str) -> Callable[[Callable[[], _T]], Callable[[], _T]]:
    """Registers a function as the builder of the module attribute `name`."""

    def register(builder: Callable[[], _T]) -> Callable[[], _T]:
        _ARROW_BUILDERS[name] = builder
        return builder

    return register


def _arrow_value(name: str) -> Any:
    """The Arrow value `name` (`TOKENS_SCHEMA`, `DUCKDB_TYPES`, ...), built once."""
    if name not in globals():
        if name not in _ARROW_BUILDERS:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        globals()[name] = _ARROW_BUILDERS[name]()
    return globals()[name]


def __getattr__(name: str) -> Any:
    return _arrow_value(name)


# Bumped whenever a table's columns or their meaning change; stamped into every Parquet file's
# key-value metadata and into the `runs` table.
# 2: `runs` gained the run metadata columns, and the `metrics` table; `tokens`
#    gained `turn_index`.
# 3: `tokens` gained `first_occurrence`.
# 4: `runs` gained `framework`, `dump_format` and `format_version`; `tokens` gained
#    `token_version`, `token_staleness`, `support_size`, `teacher_log_prob`,
#    `teacher_entropy`, `opd_reverse_kl`, `value` and `loss_weight`; `samples` gained
#    `bounded_sampling`, `start_weight_version` and `start_staleness`.
# 5: `tokens` gained `rl_weight`, `ce_weight`, `ref_kl_weight`, `dppo_masked`,
#    `dppo_masked_high` and `dppo_masked_low` (prime-rl); `samples` gained `env_name`.
SCHEMA_VERSION = 5
TOOL_NAME = "tokenlake"

# ---------------------------------------------------------------------------------------------
# Table names and lake layout
# ---------------------------------------------------------------------------------------------
TOKENS = "tokens"
SAMPLES = "samples"
RUNS = "runs"
VOCAB = "vocab"
METRICS = "metrics"
EXPERTS = "experts"  # only with `tokenlake extract --with-experts`
TABLES = (TOKENS, SAMPLES, RUNS, VOCAB, METRICS, EXPERTS)
# Tables with files per step (listed in each step's manifest record).
STEP_TABLES = (TOKENS, SAMPLES, EXPERTS)
# Tables with files per run (the manifest's `runs_file`, `vocab_file`, `metrics_files`).
SIDE_TABLES = (RUNS, VOCAB, METRICS)
# Rollups: per-step partial aggregates the views read instead of the tokens, one table each,
# written with every step (`sql/rollups/<name>.sql` defines each, columns in its header;
# pipeline/tokenlake/serve/rollups.py computes them). Stored under `LAKE/rollups/<name>/`.
ROLLUP_TABLES = (
    "audit_token_rows",
    "drift_breakdown_parts",
    "drift_histogram_parts",
    "drift_outlier_parts",
    "drift_sample_parts",
    "drift_step_checks",
    "drift_step_parts",
    "drift_teacher_step_parts",
    "drift_token_id_parts",
    "sample_token_parts",
)
ROLLUP_DIR = "rollups"
# Every table the lake stores files of: what the stores list, sweep and check for links.
LAKE_TABLES = (*TABLES, *ROLLUP_TABLES)

CATALOG_FILE = "tokenlake.duckdb"


class Column(NamedTuple):
    """A column as DuckDB names its type (a key of `ARROW_TYPES`): what a writer that does not
    import pyarrow reads (the `runs` row `tokenlake tag` rewrites through DuckDB,
    pipeline/tokenlake/load/write.py), and what the Arrow schema is built from."""

    name: str
    duckdb_type: str
    nullable: bool = True


# Partition columns: part of the directory path, typed explicitly for readers.
RUN = "run"
ROLLOUT_ID = "rollout_id"
PARTITION_DUCKDB_TYPES = {RUN: "VARCHAR", ROLLOUT_ID: "BIGINT"}


@_built_on_first_use("PARTITION_TYPES")
def _partition_types() -> dict[str, pa.DataType]:
    types = _arrow_value("ARROW_TYPES")
    return {name: types[kind] for name, kind in PARTITION_DUCKDB_TYPES.items()}


# File stems inside a partition.
TRAIN_STEM = "train"
EVAL_STEM = "eval"

# ---------------------------------------------------------------------------------------------
# `tokens`: one row per response token of every sample (train and eval).
# Sorted by (batch_position, position) within a file, so DuckDB can prune row groups.
# ---------------------------------------------------------------------------------------------
EVALUATION = "evaluation"
BATCH_POSITION = "batch_position"
SAMPLE_INDEX = "sample_index"
POSITION = "position"
TOKEN_ID = "token_id"
LOSS_MASK = "loss_mask"
TURN_INDEX = "turn_index"
FIRST_OCCURRENCE = "first_occurrence"
ROLLOUT_LOG_PROB = "rollout_log_prob"
TRAIN_LOG_PROB = "train_log_prob"
LP_DIFF = "lp_diff"
REF_LOG_PROB = "ref_log_prob"
ENTROPY = "entropy"
REF_ENTROPY = "ref_entropy"
ADVANTAGE = "advantage"
RETURNS = "returns"
TOKEN_VERSION = "token_version"
TOKEN_STALENESS = "token_staleness"
SUPPORT_SIZE = "support_size"
TEACHER_LOG_PROB = "teacher_log_prob"
TEACHER_ENTROPY = "teacher_entropy"
OPD_REVERSE_KL = "opd_reverse_kl"
VALUE = "value"
LOSS_WEIGHT = "loss_weight"
RL_WEIGHT = "rl_weight"
CE_WEIGHT = "ce_weight"
REF_KL_WEIGHT = "ref_kl_weight"
DPPO_MASKED = "dppo_masked"
DPPO_MASKED_HIGH = "dppo_masked_high"
DPPO_MASKED_LOW = "dppo_masked_low"


@_built_on_first_use("TOKENS_SCHEMA")
def _tokens_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            # True for rows from rollout_data/eval_{rid}.pt; false for training steps.
            pa.field(EVALUATION, pa.bool_(), nullable=False),
            # 0-based position of the sample in the rollout dump's `samples` list (batch order).
            pa.field(BATCH_POSITION, pa.int32(), nullable=False),
            # Sample.index (run-global sample counter; restarts per eval dataset). Null if unset.
            pa.field(SAMPLE_INDEX, pa.int64()),
            # 0-based index in the response: token position P + position of the full sequence.
            pa.field(POSITION, pa.int32(), nullable=False),
            # Token id of the response token.
            pa.field(TOKEN_ID, pa.int64(), nullable=False),
            # Train-side loss mask (0/1); for samples without a train side the rollout dump's own
            # mask; null when neither exists.
            pa.field(LOSS_MASK, pa.int8()),
            # 0-based index of the loss-covered run (turn) the token is in: a run is a maximal
            # stretch of loss_mask > 0 within the response. Null where loss_mask is 0 or null.
            pa.field(TURN_INDEX, pa.int32()),
            # True on the first row of the sample, by position, with this token_id among the rows
            # the drift statistics keep (loss_mask > 0; lp_diff, train_log_prob, rollout_log_prob
            # all finite: drift_tokens' rows of a training step), false on its later ones there;
            # null on every other row. Counting the true rows counts distinct samples per token.
            pa.field(FIRST_OCCURRENCE, pa.bool_()),
            # Log-prob (nats) of the token under the rollout engine. The train-side copy when the
            # sample has one (the pair the trainer compared); else (no train side, or the train
            # copy absent or not CP-aligned) the rollout dump's, as the reference token view does.
            pa.field(ROLLOUT_LOG_PROB, pa.float32()),
            # Log-prob (nats) of the token under the trainer (actor) before the update.
            pa.field(TRAIN_LOG_PROB, pa.float32()),
            # train_log_prob - rollout_log_prob (nats), float32, from the train-side pair.
            pa.field(LP_DIFF, pa.float32()),
            # Log-prob (nats) under the reference model.
            pa.field(REF_LOG_PROB, pa.float32()),
            # Entropy (nats) of the actor's full-vocabulary distribution at this position.
            pa.field(ENTROPY, pa.float32()),
            # Entropy (nats) of the reference model's distribution at this position.
            pa.field(REF_ENTROPY, pa.float32()),
            # Advantage used by the policy loss at this position (miles `advantages`).
            pa.field(ADVANTAGE, pa.float32()),
            # Return at this position (miles `returns`; `return` is an SQL keyword).
            pa.field(RETURNS, pa.float32()),
            # The weight version that generated the token: its `weight_versions` span's (dumps
            # since #1891/#1892); in older dumps the version of its engine call when the calls can
            # be placed on the response (one call, or one loss-covered run per listed version).
            # Null outside every span (tool output, unstamped calls) and wherever it is unknown.
            pa.field(TOKEN_VERSION, pa.string()),
            # rollout_id - token_version (steps), when the version is all digits; else null.
            pa.field(TOKEN_STALENESS, pa.int64()),
            # Token ids the sampler kept at this position (top-k / top-p support, miles
            # `rollout_sampling_mask_offsets`); null when sampling was unbounded (not recorded).
            pa.field(SUPPORT_SIZE, pa.int32()),
            # On-policy distillation: the teacher's log-prob (nats) of the token (train side, else
            # the rollout dump's), the teacher's entropy (train side), and the precomputed
            # per-token reverse-KL estimate (train side, else the rollout dump's).
            pa.field(TEACHER_LOG_PROB, pa.float32()),
            pa.field(TEACHER_ENTROPY, pa.float32()),
            pa.field(OPD_REVERSE_KL, pa.float32()),
            # The critic's value estimate at this position (PPO with a critic: miles `values`).
            pa.field(VALUE, pa.float32()),
            # Client-supplied per-token loss weight (Tinker-style batches, miles `loss_weights`;
            # may be fractional or negative, unlike loss_mask); null where the sample had none.
            pa.field(LOSS_WEIGHT, pa.float32()),
            # prime-rl's per-token loss component weights (`rl_weights`, `ce_weights`,
            # `ref_kl_weights`); null where the micro-batch had no such stream (prime-rl's
            # defaults: rl 1.0 on the loss mask, no ce or ref_kl component) and in other formats.
            pa.field(RL_WEIGHT, pa.float32()),
            pa.field(CE_WEIGHT, pa.float32()),
            pa.field(REF_KL_WEIGHT, pa.float32()),
            # prime-rl's DPPO trust-region masks (`is_masked`, `is_masked_high`, `is_masked_low`):
            # the token was masked out of the policy loss (its probability moved past the bound;
            # high: with a positive advantage, low: with a negative one). Null where prime-rl
            # computed none (a pure cross-entropy micro-batch, another loss) and in other formats.
            pa.field(DPPO_MASKED, pa.bool_()),
            pa.field(DPPO_MASKED_HIGH, pa.bool_()),
            pa.field(DPPO_MASKED_LOW, pa.bool_()),
        ]
    )


# Train-dump per-token fields that are CP-sliced and response-aligned, and the `tokens` column
# each becomes. `rollout_log_probs` is handled separately (it also exists on the rollout side).
TRAIN_TOKEN_FIELDS: dict[str, str] = {
    "log_probs": TRAIN_LOG_PROB,
    "ref_log_probs": REF_LOG_PROB,
    "entropy": ENTROPY,
    "ref_entropy": REF_ENTROPY,
    "advantages": ADVANTAGE,
    "returns": RETURNS,
    "teacher_log_probs": TEACHER_LOG_PROB,
    "teacher_entropy": TEACHER_ENTROPY,
    "opd_reverse_kl": OPD_REVERSE_KL,
    "values": VALUE,
    "loss_weights": LOSS_WEIGHT,
}
# Rollout-sample per-token fields (response-aligned, never CP-sliced) and the `tokens` column
# each fills when the train side lacks it (or the sample has none).
ROLLOUT_TOKEN_FIELDS: dict[str, str] = {
    "teacher_log_probs": TEACHER_LOG_PROB,
    "opd_reverse_kl": OPD_REVERSE_KL,
    "loss_weights": LOSS_WEIGHT,
    "advantages": ADVANTAGE,
}
# Per-token fields only some formats' readers give (prime-rl), never CP-sliced, and the
# `tokens` column each becomes: weights (float32) and flags (bool).
WEIGHT_TOKEN_FIELDS: dict[str, str] = {
    "rl_weights": RL_WEIGHT,
    "ce_weights": CE_WEIGHT,
    "ref_kl_weights": REF_KL_WEIGHT,
}
FLAG_TOKEN_FIELDS: dict[str, str] = {
    "is_masked": DPPO_MASKED,
    "is_masked_high": DPPO_MASKED_HIGH,
    "is_masked_low": DPPO_MASKED_LOW,
}
ROLLOUT_LOG_PROBS_FIELD = "rollout_log_probs"
# Every CP-sliced field the resolver reassembles (the reference's seven, dump-format.md 4.7).
CP_SLICED_FIELDS: tuple[str, ...] = (ROLLOUT_LOG_PROBS_FIELD, *TRAIN_TOKEN_FIELDS)

# Per-token stat columns (NULL where the loss mask is 0 for samples with a mask).
TOKEN_STAT_COLUMNS: tuple[str, ...] = (
    ROLLOUT_LOG_PROB,
    TRAIN_LOG_PROB,
    LP_DIFF,
    REF_LOG_PROB,
    ENTROPY,
    REF_ENTROPY,
    ADVANTAGE,
    RETURNS,
    TEACHER_LOG_PROB,
    TEACHER_ENTROPY,
    OPD_REVERSE_KL,
    VALUE,
    LOSS_WEIGHT,
    RL_WEIGHT,
    CE_WEIGHT,
    REF_KL_WEIGHT,
)
# Per-token flag columns (bool; NULL where the loss mask is 0, as the stat columns).
TOKEN_FLAG_COLUMNS: tuple[str, ...] = tuple(FLAG_TOKEN_FIELDS.values())

# ---------------------------------------------------------------------------------------------
# `samples`: one row per sample of every rollout dump, keyed by
# (run, rollout_id, evaluation, batch_position).
# ---------------------------------------------------------------------------------------------
GROUP_INDEX = "group_index"
ROLLOUT_EXECUTION_ID = "rollout_execution_id"
STATUS = "status"
REMOVE_SAMPLE = "remove_sample"
RESPONSE_LENGTH = "response_length"
TOTAL_LENGTH = "total_length"
PROMPT_LENGTH = "prompt_length"
REWARD = "reward"
REWARD_JSON = "reward_json"
WEIGHT_VERSIONS = "weight_versions"
WEIGHT_VERSION = "weight_version"
WEIGHT_VERSION_MIN = "weight_version_min"
MIXED_VERSION = "mixed_version"
STALENESS = "staleness"
START_WEIGHT_VERSION = "start_weight_version"
START_STALENESS = "start_staleness"
TURNS = "turns"
TOOL_CALLS = "tool_calls"
NON_GENERATION_TIME = "non_generation_time"
SPEC_ACCEPT_RATE = "spec_accept_rate"
PREFIX_CACHE_HIT_RATE = "prefix_cache_hit_rate"
LABEL = "label"
PROMPT_TEXT = "prompt_text"
RESPONSE_TEXT = "response_text"
PROMPT_TOKEN_IDS = "prompt_token_ids"
METADATA_JSON = "metadata_json"
BOUNDED_SAMPLING = "bounded_sampling"
MESSAGES_JSON = "messages_json"
HAS_TRAIN_ROW = "has_train_row"
STEP_TRAIN_FILES = "step_train_files"
RAW_REWARD = "raw_reward"
NORMALIZED_REWARD = "normalized_reward"
TRUNCATED = "truncated"
DUMPED_RANK = "dumped_rank"
ALIGNMENT_FAILED = "alignment_failed"
TRAIN_TOTAL_LENGTH = "train_total_length"
TRAIN_RESPONSE_LENGTH = "train_response_length"
ENV_NAME = "env_name"


@_built_on_first_use("SAMPLES_SCHEMA")
def _samples_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            pa.field(EVALUATION, pa.bool_(), nullable=False),
            pa.field(BATCH_POSITION, pa.int32(), nullable=False),
            # --- rollout side (dump-format.md 6.2) ---
            pa.field(SAMPLE_INDEX, pa.int64()),  # Sample.index
            pa.field(GROUP_INDEX, pa.int64()),  # GRPO prompt group (run-global); null for eval
            pa.field(ROLLOUT_EXECUTION_ID, pa.int64()),  # Sample.rollout_id (agentic siblings)
            pa.field(STATUS, pa.string()),  # completed / truncated / aborted / failed / pending
            pa.field(REMOVE_SAMPLE, pa.bool_()),  # kept in the batch but excluded from the loss
            pa.field(RESPONSE_LENGTH, pa.int32()),  # R, from the rollout dump
            pa.field(TOTAL_LENGTH, pa.int32()),  # T = len(Sample.tokens)
            pa.field(PROMPT_LENGTH, pa.int32()),  # P = T - R
            pa.field(REWARD, pa.float64()),  # float(Sample.reward) if int/float/bool, else null
            pa.field(REWARD_JSON, pa.string()),  # Sample.reward as JSON when it is not a number
            pa.field(WEIGHT_VERSIONS, pa.list_(pa.string())),  # one per engine call
            pa.field(WEIGHT_VERSION, pa.string()),  # last of weight_versions
            pa.field(WEIGHT_VERSION_MIN, pa.int64()),  # min of the all-digit versions
            pa.field(MIXED_VERSION, pa.bool_()),  # more than one distinct version
            pa.field(STALENESS, pa.int64()),  # rollout_id - weight_version_min (reference formula)
            pa.field(START_WEIGHT_VERSION, pa.int64()),  # version when the trajectory was submitted
            pa.field(START_STALENESS, pa.int64()),  # rollout_id - start_weight_version
            pa.field(TURNS, pa.int64()),  # len(weight_versions), null if empty
            pa.field(TOOL_CALLS, pa.int64()),  # `tool` messages in a list prompt; null for str
            pa.field(NON_GENERATION_TIME, pa.float64()),  # seconds outside generation
            pa.field(SPEC_ACCEPT_RATE, pa.float64()),  # accepted / drafted speculative tokens
            pa.field(PREFIX_CACHE_HIT_RATE, pa.float64()),  # cached / total prompt tokens
            pa.field(LABEL, pa.string()),  # reference answer
            pa.field(PROMPT_TEXT, pa.string()),  # str prompt as is; message list as JSON
            pa.field(RESPONSE_TEXT, pa.string()),  # decoded response
            pa.field(PROMPT_TOKEN_IDS, pa.list_(pa.int64())),  # the P prompt token ids
            pa.field(METADATA_JSON, pa.string()),  # Sample.metadata as JSON
            # The sampler recorded a bounded support (top-k / top-p) for the response tokens
            pa.field(BOUNDED_SAMPLING, pa.bool_(), nullable=False),
            # The conversation (chat messages, tool calls) from trajectory/{stem}.jsonl, as JSON
            pa.field(MESSAGES_JSON, pa.string()),
            # --- train side (null when the sample has no train row) ---
            pa.field(HAS_TRAIN_ROW, pa.bool_(), nullable=False),  # some train file holds it
            # Train files the step had at extraction; 0 marks a rollout-only step (eval files,
            # --debug-rollout-only, or a step still training: re-extracted when they appear).
            pa.field(STEP_TRAIN_FILES, pa.int32(), nullable=False),
            pa.field(RAW_REWARD, pa.float64()),  # raw_reward[batch_position]
            pa.field(NORMALIZED_REWARD, pa.float64()),  # train `rewards` (group-normalised)
            pa.field(TRUNCATED, pa.bool_()),  # train flag, else status; null: not logged
            pa.field(DUMPED_RANK, pa.int64()),  # lowest global rank holding the sample
            pa.field(ALIGNMENT_FAILED, pa.bool_(), nullable=False),  # CP reassembly refused
            pa.field(TRAIN_TOTAL_LENGTH, pa.int32()),  # train `total_lengths` (media expansion)
            pa.field(TRAIN_RESPONSE_LENGTH, pa.int32()),  # train `response_lengths`
            pa.field(ENV_NAME, pa.string()),  # the environment the sample came from (prime-rl)
        ]
    )


# ---------------------------------------------------------------------------------------------
# `experts`: routing replay, one row per position of a sample's `rollout_routed_experts` /
# `rollout_indexer_topk` arrays ([T-1, layers, k]); written only with --with-experts.
# ---------------------------------------------------------------------------------------------
@_built_on_first_use("EXPERTS_SCHEMA")
def _experts_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            pa.field(EVALUATION, pa.bool_(), nullable=False),
            pa.field(BATCH_POSITION, pa.int32(), nullable=False),
            pa.field(SAMPLE_INDEX, pa.int64()),
            # Index j of the arrays' first axis (0..T-2 for text: the forward pass at token j).
            pa.field("token_position", pa.int32(), nullable=False),
            # rollout_routed_experts[j]: per MoE layer, the top-k experts; null if not dumped.
            pa.field("routed_experts", pa.list_(pa.list_(pa.int32()))),
            # rollout_indexer_topk[j]: per indexer layer, its top-k; null if not dumped.
            pa.field("indexer_topk", pa.list_(pa.list_(pa.int32()))),
        ]
    )


# ---------------------------------------------------------------------------------------------
# `runs`: one row per extracted run.
# ---------------------------------------------------------------------------------------------
RUNS_BASE_COLUMNS = (
    Column("source_dir", "VARCHAR", nullable=False),  # absolute dump directory
    Column("extracted_at", "TIMESTAMP WITH TIME ZONE", nullable=False),
    Column("tool", "VARCHAR", nullable=False),  # "tokenlake <version>"
    Column("schema_version", "INTEGER", nullable=False),  # SCHEMA_VERSION
    Column("train_steps", "BIGINT", nullable=False),  # training steps extracted
    Column("eval_steps", "BIGINT", nullable=False),  # evaluation files extracted
)


def _arrow_schema(columns: Sequence[Column]) -> pa.Schema:
    import pyarrow as pa

    types = _arrow_value("ARROW_TYPES")
    return pa.schema([pa.field(c.name, types[c.duckdb_type], c.nullable) for c in columns])


@_built_on_first_use("RUNS_BASE_SCHEMA")
def _runs_base_schema() -> pa.Schema:
    return _arrow_schema(RUNS_BASE_COLUMNS)


# ---------------------------------------------------------------------------------------------
# `vocab`: one row per token id of the run's tokenizer (only when the dump saved `tokenizer/`).
# ---------------------------------------------------------------------------------------------
@_built_on_first_use("VOCAB_SCHEMA")
def _vocab_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            pa.field(TOKEN_ID, pa.int64(), nullable=False),  # joins tokens.token_id
            pa.field("token_text", pa.string()),  # the id decoded alone, special tokens kept
        ]
    )


# Hive partition columns of each table, outermost first.
TABLE_PARTITIONS: dict[str, tuple[str, ...]] = {
    TOKENS: (RUN, ROLLOUT_ID),
    SAMPLES: (RUN, ROLLOUT_ID),
    RUNS: (RUN,),
    VOCAB: (RUN,),
    METRICS: (RUN,),
    EXPERTS: (RUN, ROLLOUT_ID),
    **{rollup: (RUN, ROLLOUT_ID) for rollup in ROLLUP_TABLES},
}


# ---------------------------------------------------------------------------------------------
# Run metadata: `runs` columns from `DUMP/dashboard/meta.json` (pipeline/tokenlake/read/dashboard.py)
# and the user's tags (pipeline/tokenlake/tags.py), appended to the `runs` columns (schema version 2;
# `runs` files of version 1 lack them and read as NULL there, see sql_views.base_view_sql).
# ---------------------------------------------------------------------------------------------
START_TS = "start_ts"
WANDB_PROJECT = "wandb_project"
WANDB_GROUP = "wandb_group"
WANDB_RUN_ID = "wandb_run_id"
HF_CHECKPOINT = "hf_checkpoint"
ARGS_JSON = "args_json"
TAGS_JSON = "tags_json"


RUN_META_COLUMNS = (
    Column(START_TS, "TIMESTAMP WITH TIME ZONE"),  # meta.json `start_ts`: run start
    Column(WANDB_PROJECT, "VARCHAR"),  # meta.json args.wandb_project
    Column(WANDB_GROUP, "VARCHAR"),  # meta.json args.wandb_group
    Column(WANDB_RUN_ID, "VARCHAR"),  # meta.json args.wandb_run_id
    Column(HF_CHECKPOINT, "VARCHAR"),  # meta.json args.hf_checkpoint (model path)
    Column(ARGS_JSON, "VARCHAR"),  # meta.json `args`, the whole object, keys sorted
    Column(TAGS_JSON, "VARCHAR"),  # user tags {key: value} as JSON, keys sorted
)


@_built_on_first_use("RUN_META_SCHEMA")
def _run_meta_schema() -> pa.Schema:
    return _arrow_schema(RUN_META_COLUMNS)


# ---------------------------------------------------------------------------------------------
# `metrics`: one row per (logged payload, numeric metric) of `DUMP/dashboard/metrics.jsonl`,
# long format, partitioned by run (see pipeline/tokenlake/read/dashboard.py for what is kept or skipped).
# ---------------------------------------------------------------------------------------------
METRIC = "metric"


@_built_on_first_use("METRICS_SCHEMA")
def _metrics_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            # The step axis the payload was logged against (`rollout/step`, `train/step`, ...).
            pa.field("step_key", pa.string()),
            # The step on that axis: `rollout_id` for `rollout/step` and `eval/step`; for
            # `train/step` the optimizer step, rollout_id * num_steps_per_rollout + step_id.
            pa.field("step", pa.int64()),
            # Metric name as logged to W&B (`rollout/raw_reward`, `train/grad_norm`, `perf/...`).
            pa.field(METRIC, pa.string(), nullable=False),
            # The value; bools as 1.0/0.0; NaN and ±inf kept as logged.
            pa.field("value", pa.float64(), nullable=False),
            # When the payload was logged (the collector's wall clock).
            pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
        ]
    )


# ---------------------------------------------------------------------------------------------
# The dump's framework and format, as detected or forced (pipeline/tokenlake/read/formats.py,
# docs/frameworks.md); `runs` files of schema version 3 and before lack them (NULL).
# ---------------------------------------------------------------------------------------------
FRAMEWORK = "framework"
DUMP_FORMAT = "dump_format"
FORMAT_VERSION = "format_version"


RUN_FORMAT_COLUMNS = (
    Column(FRAMEWORK, "VARCHAR"),  # miles, slime, nemo-rl or prime-rl
    Column(DUMP_FORMAT, "VARCHAR"),  # miles, slime-v1, slime-v2, nemo-rl or prime-rl (--format)
    # The framework's numbered train dump format (slime: 1 or 2); NULL for unnumbered ones.
    Column(FORMAT_VERSION, "INTEGER"),
)


@_built_on_first_use("RUN_FORMAT_SCHEMA")
def _run_format_schema() -> pa.Schema:
    return _arrow_schema(RUN_FORMAT_COLUMNS)


# `runs`: the base columns, the run metadata (files of schema version 1 lack it), then the
# dump's format (files of schema version 3 and before lack it).
RUNS_COLUMNS = RUNS_BASE_COLUMNS + RUN_META_COLUMNS + RUN_FORMAT_COLUMNS


@_built_on_first_use("RUNS_SCHEMA")
def _runs_schema() -> pa.Schema:
    return _arrow_schema(RUNS_COLUMNS)


@_built_on_first_use("TABLE_SCHEMAS")
def _table_schemas() -> dict[str, pa.Schema]:
    return {
        TOKENS: _arrow_value("TOKENS_SCHEMA"),
        SAMPLES: _arrow_value("SAMPLES_SCHEMA"),
        RUNS: _arrow_value("RUNS_SCHEMA"),
        VOCAB: _arrow_value("VOCAB_SCHEMA"),
        METRICS: _arrow_value("METRICS_SCHEMA"),
        EXPERTS: _arrow_value("EXPERTS_SCHEMA"),
    }


def polars_types(table: str) -> dict[str, Any]:
    """Column -> polars dtype of a table, partition columns included (from tokenlake.schema)."""
    import polars as pl
    import pyarrow as pa

    partition_types = _arrow_value("PARTITION_TYPES")
    fields = [pa.field(c, partition_types[c]) for c in TABLE_PARTITIONS[table]]
    table_schema = _arrow_value("TABLE_SCHEMAS")[table]
    empty = pl.from_arrow(pa.schema([*fields, *table_schema]).empty_table())
    assert isinstance(empty, pl.DataFrame)
    return dict(empty.schema)


def duckdb_columns(table: str) -> tuple[Column, ...]:
    """The columns of `table` with their DuckDB types; of `runs`, without importing pyarrow
    (`tokenlake tag` rebuilds its base view without it).

    Examples:
        >>> duckdb_columns(VOCAB)[0]
        Column(name='token_id', duckdb_type='BIGINT', nullable=False)
    """
    if table == RUNS:
        return RUNS_COLUMNS
    types = _arrow_value("DUCKDB_TYPES")
    fields = _arrow_value("TABLE_SCHEMAS")[table]
    return tuple(Column(f.name, types[f.type], f.nullable) for f in fields)


def table_from_rows(table: str, rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """`rows` as a pyarrow Table with the schema of `table`, each row holding exactly its columns.

    The one way tokenlake turns rows (dicts) into a table: `pa.Table.from_pylist` with a schema
    drops a key the schema lacks and reads a column no row has as all NULL, so a misspelt key
    would land as a column of NULLs.

    Raises:
        RowKeysError: A row has a key that is not a column of the schema, or lacks a column.

    Examples:
        >>> table_from_rows(VOCAB, [{TOKEN_ID: 7, "token_text": "a"}]).to_pylist()
        [{'token_id': 7, 'token_text': 'a'}]
    """
    import pyarrow as pa

    table_schema = _arrow_value("TABLE_SCHEMAS")[table]
    columns = set(table_schema.names)
    for index, row in enumerate(rows):
        if row.keys() != columns:
            unknown = [key for key in row if key not in columns]
            missing = [name for name in table_schema.names if name not in row]
            raise RowKeysError(table, index, unknown, missing)
    return pa.Table.from_pylist(list(rows), schema=table_schema)


# The one map between the lake's Arrow types and DuckDB's type names: base views cast to them,
# rollup headers name them (`sql/rollups/*.sql`) and their files are written from them.
@_built_on_first_use("DUCKDB_TYPES")
def _duckdb_types() -> dict[pa.DataType, str]:
    import pyarrow as pa

    return {
        pa.bool_(): "BOOLEAN",
        pa.int8(): "TINYINT",
        pa.int32(): "INTEGER",
        pa.int64(): "BIGINT",
        pa.float32(): "FLOAT",
        pa.float64(): "DOUBLE",
        pa.string(): "VARCHAR",
        pa.timestamp("us", tz="UTC"): "TIMESTAMP WITH TIME ZONE",
        pa.list_(pa.string()): "VARCHAR[]",
        pa.list_(pa.int64()): "BIGINT[]",
        pa.list_(pa.list_(pa.int32())): "INTEGER[][]",  # experts: per layer, the top-k
    }


@_built_on_first_use("ARROW_TYPES")
def _arrow_types() -> dict[str, pa.DataType]:
    return {name: t for t, name in _arrow_value("DUCKDB_TYPES").items()}


if TYPE_CHECKING:  # the attributes `__getattr__` builds, as the type checker sees them
    PARTITION_TYPES: dict[str, pa.DataType]
    TOKENS_SCHEMA: pa.Schema
    SAMPLES_SCHEMA: pa.Schema
    EXPERTS_SCHEMA: pa.Schema
    RUNS_BASE_SCHEMA: pa.Schema
    VOCAB_SCHEMA: pa.Schema
    RUN_META_SCHEMA: pa.Schema
    METRICS_SCHEMA: pa.Schema
    RUN_FORMAT_SCHEMA: pa.Schema
    RUNS_SCHEMA: pa.Schema
    TABLE_SCHEMAS: dict[str, pa.Schema]
    DUCKDB_TYPES: dict[pa.DataType, str]
    ARROW_TYPES: dict[str, pa.DataType]
