"""Arrow schemas of the stored tables and where their Parquet files live.

Layout: <work>/data/<run_id>/<stage>/iter=<n>/<table>-<time_ns>-<random>.parquet. Every row also carries run_id,
stage and iteration, so files can be moved or globbed without relying on the path. A zero-row file per table
under data/_schema/_/iter=0/ keeps each view's glob non-empty (DuckDB refuses a glob that matches nothing),
so a view created on an empty work dir still sees files written later.

Storage choices, measured (`lego bench dataset`, synthetic 48x8 routing; zstd): token ids list<int32> ~2 B/token
(a raw blob saves 0.3 B/token but loses SQL access); response mask list<uint8> ~0.01 B/token (run-length
encoded); log-probs list<float32> with byte-stream-split ~0.6 B/token; routed experts as one raw uint8 blob per
segment with its (layers, top_k) beside it ~336 B/token -- the same size as list<uint8> but ~10x faster to
write and ~4x faster to read, and it round-trips as a zero-copy numpy view.
"""

from __future__ import annotations

import re

import pyarrow as pa

from lego.errors import LegoError

KEY_FIELDS = [
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("stage", pa.string(), nullable=False),
    pa.field("iteration", pa.int32(), nullable=False),
    pa.field("written_at", pa.timestamp("us", tz="UTC"), nullable=False),
]

METRICS = pa.map_(pa.string(), pa.float64())

SCHEMAS: dict[str, pa.Schema] = {
    "tasks": pa.schema(KEY_FIELDS + [
        pa.field("instance_id", pa.string(), nullable=False),
        pa.field("repo", pa.string()),
        pa.field("base_commit", pa.string()),
        pa.field("split", pa.string()),
        pa.field("version", pa.string()),
        pa.field("difficulty", pa.string()),
        pa.field("problem_statement", pa.string()),
        pa.field("patch", pa.string()),
        pa.field("test_patch", pa.string()),
        pa.field("FAIL_TO_PASS", pa.list_(pa.string())),
        pa.field("PASS_TO_PASS", pa.list_(pa.string())),
        pa.field("environment_kind", pa.string()),
        pa.field("task_json", pa.string(), nullable=False),  # the whole Task, for an exact rebuild
    ]),
    "rollouts": pa.schema(KEY_FIELDS + [
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("harness", pa.string()),
        pa.field("policy_version", pa.int32()),
        pa.field("sample_index", pa.int32()),
        pa.field("temperature", pa.float64()),  # metadata["temperature"] when the rollout recorded it
        pa.field("termination", pa.string()),
        pa.field("final_diff", pa.string()),
        pa.field("harness_log", pa.string()),
        pa.field("error", pa.string()),
        pa.field("timings", METRICS),
        pa.field("metadata_json", pa.string()),
        pa.field("num_segments", pa.int32()),
        pa.field("num_calls", pa.int32()),
        pa.field("num_turns", pa.int32()),
        pa.field("num_tokens", pa.int64()),
        pa.field("num_response_tokens", pa.int64()),
    ]),
    "llm_calls": pa.schema(KEY_FIELDS + [
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("call_index", pa.int32()),
        pa.field("protocol", pa.string()),
        pa.field("started_at", pa.float64()),
        pa.field("latency_s", pa.float64()),
        pa.field("prompt_tokens", pa.int32()),
        pa.field("completion_tokens", pa.int32()),
        pa.field("finish_reason", pa.string()),
        pa.field("segment_index", pa.int32()),
        pa.field("kind", pa.string()),
        pa.field("new_prompt_tokens", pa.int32()),
        pa.field("stream", pa.bool_()),
        pa.field("error", pa.string()),
        pa.field("thread", pa.string()),
        # what the harness asked (a delta on an earlier call's request) and the reply it got: lego.records.LLMCall
        pa.field("request_json", pa.string()),
        pa.field("reply_json", pa.string()),
    ]),
    "segments": pa.schema(KEY_FIELDS + [
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("segment_index", pa.int32(), nullable=False),
        pa.field("thread", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("num_tokens", pa.int32(), nullable=False),
        pa.field("num_response_tokens", pa.int32()),
        pa.field("token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("response_mask", pa.list_(pa.uint8()), nullable=False),
        pa.field("logprobs", pa.list_(pa.float32()), nullable=False),
        # uint8 [num_tokens, routing_layers, routing_top_k], C order; NULL for a dense model
        pa.field("routed_experts", pa.large_binary()),
        pa.field("routing_layers", pa.int16()),
        pa.field("routing_top_k", pa.int16()),
    ]),
    "outcomes": pa.schema(KEY_FIELDS + [
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("reward", pa.float64()),  # NULL for infra_error: excluded from the loss and group statistics
        pa.field("is_cheat", pa.bool_(), nullable=False),
        pa.field("cheat_rules", pa.list_(pa.string())),
        pa.field("evidence_json", pa.string()),
        pa.field("test_log", pa.string()),
        pa.field("exit_code", pa.int32()),
        pa.field("attempts", pa.int32()),
    ]),
    "train_steps": pa.schema(KEY_FIELDS + [
        pa.field("step", pa.int64(), nullable=False),
        pa.field("policy_version", pa.int32()),
        pa.field("loss", pa.float64()),
        pa.field("num_sequences", pa.int32()),
        pa.field("num_tokens", pa.int64()),
        pa.field("duration_s", pa.float64()),
        pa.field("metrics", METRICS),
    ]),
    "eval_results": pa.schema(KEY_FIELDS + [
        pa.field("policy_version", pa.int32()),
        pa.field("harness", pa.string()),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("rollout_id", pa.string()),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("resolved", pa.bool_(), nullable=False),
        pa.field("reward", pa.float64()),
        pa.field("metrics", METRICS),
    ]),
}

TABLES = tuple(SCHEMAS)
# Per-column Parquet settings: dictionary encoding only where values repeat; byte-stream-split for floats.
DICTIONARY_COLUMNS = {"run_id", "stage", "harness", "thread", "reason", "kind", "termination", "protocol",
                      "finish_reason", "split", "repo", "response_mask.list.element"}
BYTE_STREAM_SPLIT_COLUMNS = {"logprobs.list.element"}

STATISTICS_COLUMNS = ("run_id", "stage", "iteration", "rollout_id", "task_id", "instance_id", "step")

SCHEMA_DIR_PARTS = ("_schema", "_", "iter=0")
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
TEMP_SUFFIX = ".tmp"


class DataLayoutError(LegoError):
    """A run id, stage or table name cannot be used in the data layout."""


def check_name(kind: str, value: str) -> str:
    if not isinstance(value, str) or not SAFE_NAME.match(value):
        raise DataLayoutError(
            f"{kind} {value!r} is not usable as a directory name: use letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (at most 128 characters)"
        )
    return value


def check_table(table: str) -> str:
    if table not in SCHEMAS:
        raise DataLayoutError(f"unknown table {table!r}; the tables are {', '.join(TABLES)}")
    return table


def table_glob(data_root: str, table: str) -> str:
    """The glob of one table's visible files (temp files start with '.' and end with .tmp: never matched)."""
    return f"{data_root}/*/*/iter=*/{check_table(table)}-*.parquet"


def parquet_options(schema: pa.Schema) -> dict:
    leaves = []
    for field in schema:
        if pa.types.is_list(field.type):
            leaves.append(f"{field.name}.list.element")
        else:
            leaves.append(field.name)
    return {
        "compression": "zstd",
        "use_dictionary": [leaf for leaf in leaves if leaf in DICTIONARY_COLUMNS],
        "use_byte_stream_split": [leaf for leaf in leaves if leaf in BYTE_STREAM_SPLIT_COLUMNS],
        "write_statistics": [name for name in STATISTICS_COLUMNS if name in schema.names],
    }
