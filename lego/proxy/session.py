"""A session per rollout attempt: the exact token streams it served, and a record of every call.

How a request becomes tokens (the heart of tokens in / tokens out):
- Requests are grouped into *threads* by their leading system text. The main thread is the first thread whose
  requests carry tools (or, when no request ever carries tools, the first thread); every other thread is a
  sub-agent (Claude Code's title or Agent-tool calls, OpenCode's title generator) and is kept apart.
- A thread holds *branches*: token streams, each of which becomes one `Segment`. A branch knows the content keys of
  the messages it covers (see `messages.ChatMessage.key`) and *checkpoints*: token positions where a known message
  list ends (after the leading system turn, at the end of each prompt's messages, after each sampled reply).
- A request is matched against the thread's branches: the longest common run of message keys, cut back to the
  nearest checkpoint. Those messages map to the stored tokens; only the messages after it are rendered and
  tokenized (mask 0), then the sampled tokens are appended exactly as the engine returned them (mask 1, with
  their log-probs and routed experts).
  * All of the branch known and nothing after it: the branch is extended (call kind `extend`).
  * Only part of it known (a harness dropped a bad reply, retried a call, compacted or edited history): the branch
    is left as it is, a closed record of what was sampled and shown, and a new branch starts from the common
    checkpoint with a copy of its tokens (kind `rewrite`, segment reason `rewrite`). The copy is context only
    (mask 0): each sampled token has mask 1 in exactly one segment, the one it was sampled in. mini-swe-agent's dropped
    malformed reply thus stays in the old segment with its mask-1 tokens, and the continuing segment holds only
    tokens the model sampled or was shown, in the order it saw them.
  * Nothing known: a new branch from scratch (kind `start` for a thread's first call, else `rewrite`).
- Sampled tokens stay as sampled in the stream, so later prompts contain the model's own tokens even when the
  harness re-serializes its tool-call JSON or when the template would strip `<think>` from earlier turns (Qwen3
  drops reasoning of assistant turns before the last user query; the stream keeps what the model actually saw).
- A prompt that does not fit (prompt + max_tokens > engine.max_context) marks the session `overlong` and is
  answered with the protocol's context-length error.
- Temperature and top-p come from the policy's SamplingConfig, never from the request: the log-probs the trainer
  compares against must come from the distribution that was sampled, the same for every harness (on-policy RL).
  The request's max_tokens is honoured only below the configured maximum.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np

from lego.config import SamplingConfig
from lego.engine.base import Engine, GenerateResult, SamplingParams
from lego.proxy.messages import ContextOverflowError, Conversation, RequestError
from lego.proxy.render import ChatRenderer
from lego.proxy.reply import Reply, parse_reply
from lego.records import LLMCall, Segment, SegmentReason


@dataclass
class Checkpoint:
    messages: int  # how many of the branch's keys (tools key included) the stream covers here
    position: int  # stream length at this point
    bridge: str = ""  # template text still owed before the next message (after a sampled <|im_end|>: "\n")


class Branch:
    """One token stream of a thread; becomes one Segment."""

    def __init__(self, thread: Thread, reason: SegmentReason) -> None:
        self.thread = thread
        self.reason = reason
        self.token_ids: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.routing: list[np.ndarray] = []  # row chunks, [rows, layers, top_k]
        self.routing_rows = 0
        self.keys: list[str] = []
        self.checkpoints: list[Checkpoint] = [Checkpoint(0, 0)]
        self.busy = False

    def fork(self, checkpoint: Checkpoint) -> Branch:
        branch = Branch(self.thread, SegmentReason.rewrite)
        end = checkpoint.position
        # The copied prefix is context here: its sampled tokens keep mask 1 only in the segment they were
        # sampled in, so every sampled token is trained exactly once.
        branch.token_ids = self.token_ids[:end]
        branch.mask = [0] * end
        branch.logprobs = [0.0] * end
        if self.routing and self.routing_rows:
            rows = np.concatenate(self.routing, axis=0)[: min(end, self.routing_rows)]
            branch.routing, branch.routing_rows = [rows], len(rows)
        branch.keys = self.keys[: checkpoint.messages]
        branch.checkpoints = [c for c in self.checkpoints if c.messages <= checkpoint.messages and c.position <= end]
        return branch

    def append(self, ids: list[int], sampled: bool, logprobs: list[float] | None = None) -> None:
        self.token_ids.extend(ids)
        self.mask.extend([1 if sampled else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))

    def add_routing(self, routed: np.ndarray | None) -> None:
        """Keep the routing of positions not yet recorded (each token's routing from the call that first ran it)."""
        if routed is None:
            return
        end = min(len(self.token_ids), routed.shape[0])
        if end > self.routing_rows:
            self.routing.append(np.asarray(routed[self.routing_rows:end], dtype=np.uint8))
            self.routing_rows = end

    def truncate(self, position: int, keys: int, checkpoints: int) -> None:
        del self.token_ids[position:], self.mask[position:], self.logprobs[position:]
        del self.keys[keys:], self.checkpoints[checkpoints:]
        if self.routing_rows > position:
            rows = np.concatenate(self.routing, axis=0)[:position]
            self.routing, self.routing_rows = [rows], len(rows)

    def segment(self, thread_label: str, reason: SegmentReason) -> Segment:
        routed = None
        if self.routing:
            rows = np.concatenate(self.routing, axis=0)
            if len(rows) < len(self.token_ids):  # never expected: every call returns its prompt's routing
                pad = np.zeros((len(self.token_ids) - len(rows), *rows.shape[1:]), dtype=np.uint8)
                rows = np.concatenate([rows, pad], axis=0)
            routed = rows
        return Segment(token_ids=np.asarray(self.token_ids, dtype=np.int32),
                       response_mask=np.asarray(self.mask, dtype=np.uint8),
                       logprobs=np.asarray(self.logprobs, dtype=np.float32),
                       routed_experts=routed, reason=reason, thread=thread_label)


@dataclass
class Thread:
    key: str
    order: int
    has_tools: bool
    branches: list[Branch] = field(default_factory=list)


@dataclass
class _Call:
    record: LLMCall
    branch: Branch | None
    thread: Thread


@dataclass
class Completion:
    reply: Reply
    finish_reason: str  # stop | length (as the engine said)
    prompt_tokens: int
    completion_tokens: int
    stop_sequence: str | None = None  # the request's stop string that ended the reply (not in the reply's text)


@dataclass
class _Plan:
    thread: Thread
    source: Branch | None
    checkpoint: Checkpoint
    new_ids: list[int]
    header: Checkpoint | None  # the end of the leading system turn on a branch built from scratch
    prompt_end: int | None  # position where the generation prompt starts


def common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class Session:
    """One rollout attempt's view of the proxy (see the module docstring)."""

    def __init__(self, session_id: str, renderer: ChatRenderer, engine: Engine, sampling: SamplingConfig,
                 base_url: str = "", label: str = "") -> None:
        self.id = session_id
        self.label = label
        self.renderer = renderer
        self.engine = engine
        self.sampling = sampling
        self.base_url = base_url  # http://127.0.0.1:PORT/s/<id>
        self.overlong = False
        self.closed = False
        # completion requests the proxy failed or refused (overlong aside): a harness crash after one is not the policy's
        self.internal_errors: list[str] = []
        self._inflight: set[asyncio.Task] = set()  # requests being served, cancelled when the session closes
        self.created_at = time.time()
        self._lock = asyncio.Lock()
        self._threads: dict[str, Thread] = {}
        self._branches: list[Branch] = []
        self._calls: list[_Call] = []

    @property
    def openai_base_url(self) -> str:
        return f"{self.base_url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.base_url

    @property
    def num_calls(self) -> int:
        return len(self._calls)

    # ------------------------------------------------------------------------------------------ serving

    async def complete(self, conversation: Conversation, *, protocol: str, stream: bool = False,
                       max_tokens: int | None = None, parse_tools: bool = True,
                       stop: tuple[str, ...] = ()) -> Completion:
        if not conversation.messages:
            raise RequestError("the request has no messages", param="messages")
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
        started_at, clock = time.time(), time.perf_counter()
        limit = self.sampling.max_tokens if max_tokens is None else max(1, min(max_tokens, self.sampling.max_tokens))
        async with self._lock:
            plan = self._plan(conversation)
            prompt_tokens = plan.checkpoint.position + len(plan.new_ids)
            if prompt_tokens + limit > self.engine.max_context:
                self.overlong = True
                message = (f"the prompt has {prompt_tokens} tokens and may sample {limit} more, over the model's "
                           f"context of {self.engine.max_context} tokens")
                self._record(plan.thread, None, protocol, stream, started_at, clock, prompt_tokens, 0,
                             "overlong", self._kind(plan), len(plan.new_ids), error=message)
                raise ContextOverflowError(message)
            branch, kind, undo = self._commit(plan, conversation)
            branch.busy = True
            prompt = list(branch.token_ids)
        sampling = SamplingParams(temperature=self.sampling.temperature, top_p=self.sampling.top_p,
                                  max_tokens=limit, stop_token_ids=tuple(self.engine.eos_token_ids), stop=stop)
        try:
            result: GenerateResult = await self.engine.generate(prompt, sampling)
        except Exception as exc:
            async with self._lock:
                self._undo(branch, undo)
                self._record(plan.thread, None, protocol, stream, started_at, clock, len(prompt), 0, "error",
                             kind, len(plan.new_ids), error=f"{type(exc).__name__}: {exc}")
            raise RequestError(f"the policy engine failed: {exc}", status=500, kind="api_error") from exc
        async with self._lock:
            branch.append(list(result.token_ids), sampled=True, logprobs=list(result.logprobs))
            branch.add_routing(result.routed_experts)
            sampled_text = self.renderer.decode(list(result.token_ids))
            shown = list(result.token_ids)
            if result.finish_reason == "stop" and shown and shown[-1] in self.engine.eos_token_ids:
                shown = shown[:-1]
            shown_text = self.renderer.decode(shown)
            if result.stop_sequence and result.stop_sequence in shown_text:
                # As the protocols define it, the reply ends before the stop string; the stream keeps every
                # sampled token, so the model's next turn continues from exactly what it sampled.
                shown_text = shown_text[: shown_text.index(result.stop_sequence)]
            reply = parse_reply(shown_text, parse_tools=parse_tools)
            branch.keys.append(reply.as_message().key())
            branch.checkpoints.append(Checkpoint(len(branch.keys), len(branch.token_ids),
                                                 self.renderer.bridge_after(sampled_text)))
            branch.busy = False
            self._record(plan.thread, branch, protocol, stream, started_at, clock, len(prompt),
                         len(result.token_ids), result.finish_reason, kind, len(plan.new_ids))
        return Completion(reply=reply, finish_reason=result.finish_reason, prompt_tokens=len(prompt),
                          completion_tokens=len(result.token_ids), stop_sequence=result.stop_sequence)

    def _plan(self, conversation: Conversation) -> _Plan:
        keys = conversation.keys()
        thread_key = conversation.system_text()
        thread = self._threads.get(thread_key)
        if thread is None:
            thread = self._threads[thread_key] = Thread(thread_key, len(self._threads), bool(conversation.tools))
        # Candidate starting points: for each branch, checkpoints within the known run of keys, longest first.
        candidates: list[tuple[int, int, Branch | None, Checkpoint]] = []
        for order, branch in enumerate(thread.branches):
            known = common_prefix(keys, branch.keys)
            for checkpoint in branch.checkpoints:
                if 0 < checkpoint.messages <= known:
                    candidates.append((checkpoint.messages, order, branch, checkpoint))
        candidates.sort(key=lambda c: (c[0], c[1]), reverse=True)
        candidates.append((0, -1, None, Checkpoint(0, 0)))
        tools = conversation.tools
        for messages_known, _, branch, checkpoint in candidates:
            known = max(0, messages_known - 1)  # keys[0] is the tools key
            template = conversation.template_messages(known=known)
            full = self.renderer.render(template, tools, add_generation_prompt=True)
            prefix = self.renderer.prefix_text(template[:known], tools)
            if not full.startswith(prefix):
                continue  # the template renders the known part differently now: try an earlier checkpoint
            header = None
            if branch is None and len(template) > 1 and template[0]["role"] == "system":
                head = self.renderer.prefix_text(template[:1], tools)
                if full.startswith(head):
                    head_ids = self.renderer.encode(head)
                    new_ids = head_ids + self.renderer.encode(full[len(head):])
                    header = Checkpoint(2, len(head_ids))
                else:
                    new_ids = self.renderer.encode(full)
            else:
                new_ids = self.renderer.encode(checkpoint.bridge + full[len(prefix):])
            gen = self.renderer.generation_prompt_ids
            prompt_end = None
            if gen and new_ids[-len(gen):] == gen:
                prompt_end = checkpoint.position + len(new_ids) - len(gen)
            return _Plan(thread, branch, checkpoint, new_ids, header, prompt_end)
        raise AssertionError("the empty checkpoint always matches")  # pragma: no cover

    @staticmethod
    def _extends(plan: _Plan) -> bool:
        source, checkpoint = plan.source, plan.checkpoint
        return (source is not None and not source.busy and checkpoint.messages == len(source.keys)
                and checkpoint.position == len(source.token_ids))

    def _kind(self, plan: _Plan) -> str:
        if self._extends(plan):
            return "extend"
        return "start" if not plan.thread.branches else "rewrite"

    def _commit(self, plan: _Plan, conversation: Conversation) -> tuple[Branch, str, tuple]:
        source, checkpoint = plan.source, plan.checkpoint
        if self._extends(plan):
            branch, kind = source, "extend"
            undo = (False, len(branch.token_ids), len(branch.keys), len(branch.checkpoints))
        else:
            if source is not None:
                branch = source.fork(checkpoint)
            else:
                reason = SegmentReason.start if not plan.thread.branches else SegmentReason.rewrite
                branch = Branch(plan.thread, reason)
            kind = self._kind(plan)
            plan.thread.branches.append(branch)
            self._branches.append(branch)
            undo = (True, 0, 0, 0)
        keys = conversation.keys()
        branch.append(plan.new_ids, sampled=False)
        branch.keys = keys
        if plan.header is not None:
            branch.checkpoints.append(plan.header)
        if plan.prompt_end is not None:
            branch.checkpoints.append(Checkpoint(len(keys), plan.prompt_end))
        return branch, kind, undo

    def _undo(self, branch: Branch, undo: tuple) -> None:
        created, position, keys, checkpoints = undo
        branch.busy = False
        if created:
            branch.thread.branches.remove(branch)
            self._branches.remove(branch)
        else:
            branch.truncate(position, keys, checkpoints)

    def _record(self, thread: Thread, branch: Branch | None, protocol: str, stream: bool, started_at: float,
                clock: float, prompt_tokens: int, completion_tokens: int, finish_reason: str, kind: str,
                new_prompt_tokens: int, error: str | None = None) -> None:
        record = LLMCall(call_index=len(self._calls), protocol=protocol, started_at=started_at,
                         latency_s=time.perf_counter() - clock, prompt_tokens=prompt_tokens,
                         completion_tokens=completion_tokens, finish_reason=finish_reason, segment_index=-1,
                         kind=kind, new_prompt_tokens=new_prompt_tokens, stream=stream, error=error)
        self._calls.append(_Call(record, branch, thread))

    # ------------------------------------------------------------------------------------------ results

    def cancel_inflight(self) -> int:
        """Cancel the requests still being served (the rollout ended: nobody waits for their answers)."""
        pending = [task for task in self._inflight if not task.done()]
        for task in pending:  # close_session may be called from another thread than the proxy's loop
            task.get_loop().call_soon_threadsafe(task.cancel)
        return len(pending)

    def main_thread(self) -> Thread | None:
        threads = sorted(self._threads.values(), key=lambda t: t.order)
        with_tools = [t for t in threads if t.has_tools and t.branches]
        with_tokens = [t for t in threads if t.branches]
        return (with_tools or with_tokens or [None])[0]

    def trajectory_parts(self) -> tuple[list[Segment], list[LLMCall]]:
        """Segments (main thread and sub-agents, in the order they began) and every call, with the call's
        segment index and kind resolved (a call outside the main thread has kind `subagent`)."""
        main = self.main_thread()
        segments: list[Segment] = []
        index: dict[int, int] = {}
        for branch in self._branches:
            if not branch.token_ids:
                continue
            is_main = branch.thread is main
            label = "main" if is_main else f"subagent:{branch.thread.order}"
            reason = branch.reason if is_main else SegmentReason.subagent
            index[id(branch)] = len(segments)
            segments.append(branch.segment(label, reason))
        calls = []
        for call in self._calls:
            record = LLMCall(**{**call.record.__dict__})
            record.segment_index = index.get(id(call.branch), -1) if call.branch is not None else -1
            if call.thread is not main:
                record.kind = "subagent"
            calls.append(record)
        return segments, calls
