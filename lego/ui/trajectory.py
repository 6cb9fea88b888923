"""One rollout, token by token: what the trainer reads, which MLflow's trace viewer (text and counts) cannot show.

Each segment's tokens with their mask (prompt: 0, sampled: 1), the engine's log-prob of each sampled token and
the experts each token was routed to per layer (what R3 replays), decoded with the real Qwen3 tokenizer. A
segment is shown a window of WINDOW tokens at a time.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from lego.data import queries
from lego.data.catalog import Catalog
from lego.data.reader import read_trajectories
from lego.engine.tokenizer import tokenizer_dir, verify
from lego.records import Segment, Trajectory

WINDOW = 2000  # tokens of one segment on screen at a time
LOG_TAIL = 6000  # characters of the harness log and the test log shown
DIFF_LIMIT = 20_000


class TokenText:
    """Token ids to the text each one stands for, with the Qwen3 tokenizer set up by `lego setup`."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or tokenizer_dir()
        self._tokenizer: Any = None
        self._lock = threading.Lock()
        self.note: str | None = None

    def _load(self) -> Any:
        with self._lock:
            if self._tokenizer is None and self.note is None:
                missing = verify(self.directory)
                if missing:
                    self.note = (f"the Qwen3 tokenizer is not set up in {self.directory} (missing or altered: "
                                 f"{', '.join(missing)}): token ids are shown; run `lego setup` to fetch it")
                else:
                    from tokenizers import Tokenizer

                    self._tokenizer = Tokenizer.from_file(str(self.directory / "tokenizer.json"))
            return self._tokenizer

    def pieces(self, ids: list[int]) -> list[str]:
        """The text of each token on its own (a character split over two tokens shows as U+FFFD in each)."""
        tokenizer = self._load()
        if tokenizer is None:
            return [f"[{token}]" for token in ids]
        return tokenizer.decode_batch([[token] for token in ids], skip_special_tokens=False)


class TokenView(BaseModel):
    position: int
    token_id: int
    text: str
    sampled: bool
    logprob: float | None  # the engine's, for sampled tokens
    experts: list[list[int]] | None  # per layer, the top-k experts; None for a dense model


class SegmentSummary(BaseModel):
    index: int
    thread: str
    reason: str
    tokens: int
    sampled: int


class SegmentView(SegmentSummary):
    start: int  # the window's first token
    mean_logprob: float | None
    routed: bool
    window: list[TokenView]


class CallRow(BaseModel):
    index: int
    kind: str
    thread: str
    segment_index: int
    prompt_tokens: int
    new_prompt_tokens: int
    completion_tokens: int
    latency_s: float
    finish_reason: str | None
    error: str | None


class TrajectoryView(BaseModel):
    rollout_id: str
    data_run_id: str
    stage: str
    iteration: int
    task_id: str
    harness: str
    policy_version: int
    sample_index: int
    termination: str
    kind: str | None  # the outcome (None: not graded yet)
    reward: float | None
    cheat_rules: list[str] = Field(default_factory=list)
    turns: int
    tokens: int
    error: str | None
    timings: dict[str, float] = Field(default_factory=dict)
    final_diff: str
    harness_log: str  # its tail
    test_log: str  # its tail
    segments: list[SegmentSummary]
    segment: SegmentView | None
    calls: list[CallRow]
    trace_url: str | None = None
    tokenizer_note: str | None = None


def segment_view(segment: Segment, index: int, start: int, text: TokenText) -> SegmentView:
    n = len(segment.token_ids)
    start = max(0, min(start, max(n - 1, 0)))
    end = min(n, start + WINDOW)
    ids = [int(token) for token in segment.token_ids[start:end]]
    pieces = text.pieces(ids)
    mask = segment.response_mask
    sampled = int(mask.sum())
    experts = segment.routed_experts
    window = [TokenView(position=position, token_id=ids[offset], text=pieces[offset], sampled=bool(mask[position]),
                        logprob=float(segment.logprobs[position]) if mask[position] else None,
                        experts=experts[position].tolist() if experts is not None else None)
              for offset, position in enumerate(range(start, end))]
    mean = float(segment.logprobs[mask == 1].mean()) if sampled else None
    return SegmentView(index=index, thread=segment.thread, reason=str(segment.reason), tokens=n, sampled=sampled,
                       start=start, mean_logprob=mean, routed=experts is not None, window=window)


def _tail(text: str | None, limit: int) -> str:
    text = text or ""
    return text if len(text) <= limit else f"... ({len(text) - limit} characters before)\n" + text[-limit:]


def trajectory_view(catalog: Catalog, data_run_id: str, rollout_id: str, text: TokenText, *, segment: int = 0,
                    start: int = 0) -> TrajectoryView | None:
    """The rollout's record, its outcome, its calls and one window of one of its segments; None when the catalog
    holds no such rollout."""
    row = queries.rollout_detail(catalog, data_run_id, rollout_id)
    if row is None:
        return None
    trajectory: Trajectory = read_trajectories(catalog, [rollout_id], run_id=data_run_id)[0]
    summaries = [SegmentSummary(index=i, thread=s.thread, reason=str(s.reason), tokens=len(s.token_ids),
                                sampled=int(s.response_mask.sum())) for i, s in enumerate(trajectory.segments)]
    shown = None
    if trajectory.segments:
        index = max(0, min(segment, len(trajectory.segments) - 1))
        shown = segment_view(trajectory.segments[index], index, start, text)
    threads = [s.thread for s in trajectory.segments]  # a call's thread is its segment's
    calls = [CallRow(index=c.call_index, kind=c.kind,
                     thread=threads[c.segment_index] if 0 <= c.segment_index < len(threads) else "?",
                     segment_index=c.segment_index,
                     prompt_tokens=c.prompt_tokens, new_prompt_tokens=c.new_prompt_tokens,
                     completion_tokens=c.completion_tokens, latency_s=c.latency_s, finish_reason=c.finish_reason,
                     error=c.error) for c in trajectory.calls]
    diff = trajectory.final_diff or ""
    return TrajectoryView(
        rollout_id=rollout_id, data_run_id=data_run_id, stage=row["stage"], iteration=int(row["iteration"]),
        task_id=trajectory.task_id, harness=trajectory.harness, policy_version=trajectory.policy_version,
        sample_index=trajectory.sample_index, termination=str(trajectory.termination), kind=row.get("kind"),
        reward=row.get("reward"), cheat_rules=list(row.get("cheat_rules") or []), turns=int(row.get("num_turns") or 0),
        tokens=int(row.get("num_tokens") or 0), error=trajectory.error,
        timings={k: float(v) for k, v in (trajectory.timings or {}).items()},
        final_diff=diff if len(diff) <= DIFF_LIMIT else diff[:DIFF_LIMIT] + f"\n... ({len(diff) - DIFF_LIMIT} more)",
        harness_log=_tail(trajectory.harness_log, LOG_TAIL), test_log=_tail(row.get("test_log"), LOG_TAIL),
        segments=summaries, segment=shown, calls=calls, tokenizer_note=text.note)
