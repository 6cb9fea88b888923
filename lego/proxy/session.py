"""A session per rollout attempt: the exact token streams it served, and a record of every call.

How a request becomes tokens (the heart of tokens in / tokens out):
- Requests are grouped into *threads*, one per agent the harness runs. What tells agents apart is what the
  requests show, checked in this order:
  1. The agent's *signature*: its leading system text (whitespace-normalized, volatile parts removed: Claude Code's
     billing header carries `cc_version=<version>.<fingerprint of the first user message>`, which changes when it
     compacts) and the set of its tool names. A request with a signature seen before belongs to that thread.
     Sub-agents differ from their parent in one or the other: Claude Code's Agent sub-agents and the title
     generators by system text; OpenCode's `task` and Codex's `spawn_agent` sub-agents (even with
     `fork_context`, which replays the parent's user messages) send the parent's system text with fewer tools.
  2. A new signature, with tools, whose conversation *continues* a thread: after the system turn it holds all of
     one of the thread's branches, the model's sampled replies included, in order (the harness changed its system
     text or tools mid-conversation). It joins that thread (kind `rewrite`: the prompt renders differently from the
     start). Sharing user messages is not enough: a forked sub-agent replays them, never the parent's sampled
     replies. A request without tools that replays a conversation is a side call (a summary, a classifier), not
     the agent going on. Nor does a request whose system text marks it a sub-agent continue a thread whose
     requests lack the mark (or the other way round): Claude Code's billing header adds `cc_is_subagent=true;`
     for every agent but the main one, and its fork sub-agent (`Agent(subagent_type: "fork")`) sends the main
     system text and tools, the whole main history and a copy of the launching reply, which matches key for key
     when that reply has no text. The mark is all that tells such a fork from the main agent going on.
  3. Otherwise a new thread.
  The main thread is the first thread whose requests carry tools (or, when no request ever carries tools, the first
  thread): harnesses start their main agent before any sub-agent, and a title request carries no tools. Every other
  thread is a sub-agent and kept apart. Compaction stays in the main thread: Claude Code's summary request is the
  main agent's history plus an instruction (a `rewrite` from the last common checkpoint), and the compacted
  conversation that follows has the main signature and no common messages (a `rewrite` from scratch).
  A fresh conversation with exactly the main agent's system text and tools is taken for a main-thread `rewrite`;
  none of Claude Code, OpenCode, Codex, mini-swe-agent or OpenHands starts a sub-agent that way.
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
- What a request asks is either done, decided by the policy, harmless, or refused with the protocol's 400 naming it:
  nothing is dropped silently. Each parser lists every request field it accepts and why (`FIELDS` in
  anthropic.py, openai_chat.py and responses.py; lego/proxy/fields.py) and refuses any other.
  Constraints on the reply's shape are enforced by the engine (constrained decoding, lego/engine/constraints.py):
  every sampled token is one the constraint's grammar allows, so no model can answer in another shape, and each
  recorded log-prob is the sampled token's under the masked distribution it was drawn from. Nothing is written into
  the prompt: the model samples every token of the reply (mask 1).
  * A forced tool call (`tool_choice` required/any or a named tool): the reply is tool calls of the request's tools
    (the named one: one call of it), each as the chat template writes it, arguments following the tool's schema.
  * Structured output (OpenAI `response_format` json_schema / json_object, Responses `text.format`, Anthropic
    `output_config.format` / `output_format`): the reply is JSON following the schema (or any JSON object), or
    tool calls where tools may be called.
  * Strict tools (`strict: true`): the reply is free, and every tool call in it follows its tool's schema.
  A thinking template keeps its rule: a forced call or structured output follows an empty think block; with strict
  tools the model reasons freely first. An engine that cannot enforce constraints (`constrained_decoding` false),
  or a schema its grammar library cannot compile, gets the protocol's 400 naming the field: never an unconstrained
  reply. Done without changing what the model sampled, only where its generation ends:
  * No parallel tool calls (OpenAI/Responses `parallel_tool_calls: false`, Anthropic `disable_parallel_tool_use`):
    `</tool_call>` is a stop string, so the generation ends with the first complete call (a `</tool_call>` the model
    writes inside its reasoning would end it too). The recorded tokens are exactly the sampled ones; the template's
    end of turn after them is context owed to the next prompt, as after any stop string.
  * An assistant's refusal in replayed history (an OpenAI `refusal` field or part) is what it said: its text.
  Refused, because serving them would answer something other than what the model was shown or sampled: images,
  audio and files (the policy reads text only); hosted and server tools the proxy does not run (web search, code
  execution, computer use, file search, MCP, Anthropic's built-in tools) and the items they leave in history;
  server-side state (Responses `previous_response_id`, `conversation`, stored prompts and items, encrypted
  reasoning); n > 1 and log-probs in the reply; context edits.
  One hosted tool is accepted and not offered: Codex's `web_search`, which it sends on every call (why that is
  harmless: responses.py). Sampling and reasoning settings (temperature, top_p, top_k, penalties, seed, thinking
  budget, effort, verbosity) are the policy's (below).
- Sampled tokens stay as sampled in the stream, so later prompts contain the model's own tokens even when the
  harness re-serializes its tool-call JSON or when the template would strip `<think>` from earlier turns (Qwen3
  drops reasoning of assistant turns before the last user query; the stream keeps what the model actually saw).
- A prompt that does not fit (prompt + max_tokens > engine.max_context) marks the session `overlong` and is
  answered with the protocol's context-length error.
- Temperature and top-p come from the policy's SamplingConfig, never from the request: the log-probs the trainer
  compares against must come from the distribution that was sampled, the same for every harness (on-policy RL).
  So do the other sampling parameters a request may carry, and reasoning settings: the policy thinks as its chat
  template says (`renderer.thinking`), however much effort or thinking budget a request asks for.
  The request's max_tokens is honoured only below the configured maximum.
- A session opened with a seed (a rollout's attempt seed, lego.rollout.requests) samples its n-th generation with
  a seed derived from it and n, so two sessions with one seed draw the same random numbers call by call; a
  request's own `seed` is ignored like its other sampling settings.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import re
import threading
import time
from array import array
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from lego.cache import derived_seed
from lego.config import SamplingConfig
from lego.engine.base import Engine, GenerateResult, SamplingParams, generate_streaming
from lego.engine.constraints import (
    Constraint,
    ConstraintError,
    forced_call_constraint,
    json_output_constraint,
    strict_tools_constraint,
)
from lego.proxy.messages import ChatMessage, ContextOverflowError, Conversation, MatchKey, RequestError
from lego.proxy.render import ChatRenderer
from lego.proxy.reply import CALL_CLOSE, Reply, parse_reply
from lego.proxy.resend import ResentRequests
from lego.proxy.transcript import RequestLog, reply_json
from lego.records import LLMCall, Segment, SegmentReason


@dataclass
class Checkpoint:
    messages: int  # how many of the branch's keys (tools key included) the stream covers here
    position: int  # stream length at this point
    bridge: str = ""  # template text still owed before the next message (after a sampled <|im_end|>: "\n")


class Branch:
    """One token stream of a thread; becomes one Segment. Its tokens, mask and log-probs are flat arrays (as the
    segment stores them), not lists of Python numbers the garbage collector would walk on every full collection."""

    def __init__(self, thread: Thread, reason: SegmentReason) -> None:
        self.thread = thread
        self.reason = reason
        self.token_ids = array("i")
        self.mask = array("B")
        self.logprobs = array("f")
        self.routing: list[np.ndarray] = []  # row chunks, [rows, layers, top_k]
        self.routing_rows = 0
        self.keys: list[MatchKey] = []
        self.checkpoints: list[Checkpoint] = [Checkpoint(0, 0)]
        self.busy = False

    def fork(self, checkpoint: Checkpoint) -> Branch:
        branch = Branch(self.thread, SegmentReason.rewrite)
        end = checkpoint.position
        # The copied prefix is context here: its sampled tokens keep mask 1 only in the segment they were
        # sampled in, so every sampled token is trained exactly once.
        branch.token_ids = self.token_ids[:end]
        branch.mask = array("B", bytes(end))
        branch.logprobs = array("f", bytes(4 * end))
        if self.routing and self.routing_rows:
            rows = np.concatenate(self.routing, axis=0)[: min(end, self.routing_rows)]
            branch.routing, branch.routing_rows = [rows], len(rows)
        branch.keys = self.keys[: checkpoint.messages]
        branch.checkpoints = [c for c in self.checkpoints if c.messages <= checkpoint.messages and c.position <= end]
        return branch

    def append(self, ids: array | list[int], sampled: bool, logprobs: list[float] | None = None) -> None:
        # frombytes, not extend(bytes): extend reads a bytes object one element at a time
        self.token_ids.extend(ids)
        self.mask.frombytes(bytes([1 if sampled else 0]) * len(ids))
        if logprobs is not None:
            self.logprobs.extend(logprobs)
        else:
            self.logprobs.frombytes(bytes(4 * len(ids)))

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
        # copies (np.array): a view would pin the arrays' buffers, and the branch may still grow
        return Segment(token_ids=np.array(self.token_ids, dtype=np.int32),
                       response_mask=np.array(self.mask, dtype=np.uint8),
                       logprobs=np.array(self.logprobs, dtype=np.float32),
                       routed_experts=routed, reason=reason, thread=thread_label)


@dataclass
class Thread:
    key: str  # the signature of its first request (see `agent_signature`)
    order: int
    has_tools: bool
    marked_subagent: bool = False  # its requests' system text says a sub-agent sends them (`marked_subagent`)
    branches: list[Branch] = field(default_factory=list)
    system_keys: set[MatchKey] = field(default_factory=set)  # keys of its requests' leading system messages

    def continued_by(self, body: list[MatchKey]) -> int:
        """How many messages of the longest of its branches `body` (a request's keys after its system turn)
        holds in full, sampled replies included; 0 when it holds none in full."""
        best = 0
        for branch in self.branches:
            if branch.busy:  # its reply is not known yet
                continue
            start = 1  # keys[0] is the tools key
            while start < len(branch.keys) and branch.keys[start] in self.system_keys:
                start += 1
            theirs = branch.keys[start:]
            if best < len(theirs) <= len(body) and body[: len(theirs)] == theirs:
                best = len(theirs)
        return best


@dataclass
class _Call:
    record: LLMCall
    branch: Branch | None
    thread: Thread


@dataclass(frozen=True)
class ToolChoice:
    """How the reply may call tools, when the request constrains it: a tool call it must make (OpenAI `required` or
    a named function, Anthropic `any` or `tool`) and whether it may make more than one (OpenAI and Responses
    `parallel_tool_calls: false`, Anthropic `disable_parallel_tool_use`)."""

    name: str | None = None  # the tool it must call; None: any of its tools
    required: bool = True  # a tool call is forced (else the model may answer without one)
    parallel: bool = True  # False: the generation ends with the first complete tool call


@dataclass(frozen=True)
class JsonOutput:
    """A structured output the reply must be: JSON following `schema` (None: any JSON object, JSON mode), asked
    for by the request field `param`."""

    schema: dict | bool | None = None
    param: str = "response_format"

    @classmethod
    def of(cls, schema: object, param: str) -> JsonOutput:
        """The structured output a request's `param` (the schema's place in it) asks for; None: JSON mode."""
        if schema is not None and not isinstance(schema, dict | bool):
            raise RequestError(f"'{param}' must be a JSON schema (an object), got {type(schema).__name__}",
                               param=param)
        return cls(schema, param)


def reply_constraint(tools: list[dict], parse_tools: bool, choice: ToolChoice | None, strict_tools: frozenset[str],
                     json_output: JsonOutput | None, renderer: ChatRenderer) -> Constraint | None:
    """The constraint the engine enforces for a request's reply (None: unconstrained); see the module docstring.
    `strict_tools`: the names of its tools with `strict: true`."""
    thinking, encode = renderer.thinking, renderer.encode
    if parse_tools and choice is not None and choice.required:
        return forced_call_constraint(tools, choice.name, choice.parallel, thinking, encode)
    parallel = choice is None or choice.parallel
    if json_output is not None:
        return json_output_constraint(json_output.schema, thinking, tools if parse_tools else None, parallel,
                                      encode, json_output.param)
    if parse_tools and strict_tools and tools:
        return strict_tools_constraint(tools, strict_tools, parallel, thinking, encode)
    return None


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
    new_ids: array  # token ids (lego/proxy/render.py NewTokens)
    header: Checkpoint | None  # the end of the leading system turn on a branch built from scratch
    prompt_end: int | None  # position where the generation prompt starts
    keys: list[MatchKey]  # the request's match keys (the plan's own list: the branch it commits to takes it)


# Parts of a system text that change while the agent stays the same.
VOLATILE = (
    re.compile(r"cc_version=[^;\s]*;?"),  # Claude Code: its version and a fingerprint of the first user message
)


# A harness's own statement, in a system text, that another agent than the main one sends the request.
SUBAGENT_MARKS = (
    # Claude Code: a field of the billing header that opens the (normalized) system text
    re.compile(r"x-anthropic-billing-header:(?: [\w-]+=[^;\s]*;)*? cc_is_subagent=true;"),
)


def marked_subagent(conversation: Conversation) -> bool:
    """Whether the request's system text says a sub-agent sent it (see `SUBAGENT_MARKS`)."""
    text = conversation.system_text()
    return any(mark.match(text) for mark in SUBAGENT_MARKS)


@functools.lru_cache(maxsize=64)
def _system_digest(text: str) -> str:
    """Digest of a system text without its volatile parts (kept: every call of an agent sends the same text)."""
    for pattern in VOLATILE:
        text = pattern.sub("", text)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def agent_signature(conversation: Conversation) -> str:
    """Which agent sent a request: its system text without volatile parts, and the names of its tools."""
    if conversation.signature is None:
        names = ",".join(sorted(tool["function"]["name"] for tool in conversation.tools))
        conversation.signature = f"{_system_digest(conversation.system_text())}:{names}"
    return conversation.signature


def common_prefix(a: list[MatchKey], b: list[MatchKey]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case (a request extends a branch), compared in C: a long history costs little
        return n
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _candidates(branches: list[Branch], keys: list[MatchKey]) -> Iterator[tuple[Branch | None, Checkpoint]]:
    """Where a request's tokens may start, best first: each branch's checkpoints within the run of keys it shares
    with the request, the most messages first (then the later branch, then the earlier checkpoint), and last the
    empty stream. The best is found without listing them all (it is almost always the one taken, and a long
    rollout's branch has hundreds): a branch's checkpoints never go down in messages along its list (they are
    appended as it grows, and a fork keeps a prefix of them). The rest are listed only when the best is not taken."""
    known = [common_prefix(keys, branch.keys) for branch in branches]
    best: tuple[int, int, int] | None = None  # (messages, order, -index): the greatest is the best
    for order, branch in enumerate(branches):
        checkpoints = branch.checkpoints
        index = len(checkpoints) - 1
        while index >= 0 and checkpoints[index].messages > known[order]:
            index -= 1
        if index < 0 or checkpoints[index].messages <= 0:
            continue
        messages = checkpoints[index].messages
        while index > 0 and checkpoints[index - 1].messages == messages:
            index -= 1
        if best is None or (messages, order, -index) > best:
            best = (messages, order, -index)
    if best is not None:
        first_branch = branches[best[1]]
        first = first_branch.checkpoints[-best[2]]
        yield first_branch, first
        rest = [(checkpoint.messages, order, branch, checkpoint)
                for order, branch in enumerate(branches) for checkpoint in branch.checkpoints
                if 0 < checkpoint.messages <= known[order]]
        rest.sort(key=lambda candidate: (candidate[0], candidate[1]), reverse=True)
        for _, _, branch, checkpoint in rest:
            if branch is not first_branch or checkpoint is not first:
                yield branch, checkpoint
    yield None, Checkpoint(0, 0)


class Session:
    """One rollout attempt's view of the proxy (see the module docstring)."""

    def __init__(self, session_id: str, renderer: ChatRenderer, engine: Engine, sampling: SamplingConfig,
                 base_url: str = "", label: str = "", seed: int | None = None) -> None:
        self.id = session_id
        self.label = label
        self.renderer = renderer
        self.engine = engine
        self.sampling = sampling
        self.seed = seed
        self._generations = 0  # generations started: the n of the n-th call's seed
        self.base_url = base_url  # http://127.0.0.1:PORT/s/<id>
        self.overlong = False
        self.closed = False
        # completion requests the proxy failed or refused (overlong aside): a harness crash after one is not the policy's
        self.internal_errors: list[str] = []
        self._inflight: set[asyncio.Task] = set()  # requests being served, cancelled when the session closes
        # close_session cancels them from another thread than the loop's, whose done callbacks remove them
        self._inflight_lock = threading.Lock()
        self.created_at = time.time()
        self._lock = asyncio.Lock()
        self._threads: list[Thread] = []
        self._signatures: dict[str, Thread] = {}  # every signature seen -> its thread
        self._branches: list[Branch] = []
        self._calls: list[_Call] = []
        self._sampling: dict[tuple[int, tuple[str, ...], Constraint | None], SamplingParams] = {}
        self._requests = RequestLog()  # what each call asked, stored as a delta on the thread's previous request
        self.resent = ResentRequests()  # its recent requests' bytes: a resent history is not parsed again

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
                       stop: tuple[str, ...] = (),
                       on_tokens: Callable[[int, list[int]], Awaitable[None]] | None = None,
                       read_reply: Callable[[str], Reply] | None = None,
                       tool_choice: ToolChoice | None = None, strict_tools: frozenset[str] = frozenset(),
                       json_output: JsonOutput | None = None) -> Completion:
        """Serve one call. `on_tokens(prompt_tokens, ids)` is awaited with each chunk of sampled tokens as the
        engine produces them (a streamed answer); the record is committed once the generation ends.
        `read_reply(text)`: what reads the whole reply's text (a stream's own reader, which has read most of it
        already; it must read as `parse_reply` does and not raise); by default `parse_reply`.
        `tool_choice`, `strict_tools` (the names of the tools with `strict: true`) and `json_output` constrain the
        reply's shape: the engine enforces the constraint they make (`reply_constraint`), or the request is refused
        (400) when it cannot. No parallel calls: the end of a tool call (`</tool_call>`) is a stop string, so the
        generation ends with the first complete call; the reply keeps it (it is not one of the request's stop
        strings). Either way every sampled token is the model's own and the record holds exactly what was
        sampled."""
        if not conversation.messages:
            raise RequestError("the request has no messages", param="messages")
        task = asyncio.current_task()
        if task is not None:
            with self._inflight_lock:
                self._inflight.add(task)
            task.add_done_callback(self._served)
        started_at, clock = time.time(), time.perf_counter()
        limit = self.sampling.max_tokens if max_tokens is None else max(1, min(max_tokens, self.sampling.max_tokens))
        constraint = self._constraint(conversation.tools, parse_tools, tool_choice, strict_tools, json_output)
        single_call = parse_tools and tool_choice is not None and not tool_choice.parallel and CALL_CLOSE not in stop
        stops = (*stop, CALL_CLOSE) if single_call else stop
        async with self._lock:
            plan = await self._plan(conversation)
            prompt_tokens = plan.checkpoint.position + len(plan.new_ids)
            if prompt_tokens + limit > self.engine.max_context:
                self.overlong = True
                message = (f"the prompt has {prompt_tokens} tokens and may sample {limit} more, over the model's "
                           f"context of {self.engine.max_context} tokens")
                self._record(plan.thread, None, conversation, protocol, stream, started_at, clock, prompt_tokens,
                             0, "overlong", self._kind(plan), len(plan.new_ids), error=message)
                raise ContextOverflowError(message)
            branch, kind, undo = self._commit(plan, conversation)
            generation = self._generations
            self._generations += 1
            branch.busy = True
            prompt = branch.token_ids[:]  # a snapshot (the branch grows after the call), as a flat array
        new_prompt_tokens = len(plan.new_ids)
        sampling = self._sampling_params(limit, stops, constraint)
        if self.seed is not None:
            sampling = dataclasses.replace(sampling, seed=derived_seed("call", self.seed, generation))
        try:
            if on_tokens is None:
                result: GenerateResult = await self.engine.generate(prompt, sampling)
            else:
                report = functools.partial(on_tokens, len(prompt))
                result = await generate_streaming(self.engine, prompt, sampling, report)
        except Exception as exc:
            async with self._lock:
                self._undo(branch, undo)
                self._record(plan.thread, None, conversation, protocol, stream, started_at, clock, len(prompt), 0,
                             "error", kind, new_prompt_tokens, error=f"{type(exc).__name__}: {exc}")
            if isinstance(exc, ConstraintError):  # the engine cannot compile it: the request asked too much
                raise RequestError(str(exc), param=exc.param, code="unsupported_parameter") from exc
            raise RequestError(f"the policy engine failed: {exc}", status=500, kind="api_error") from exc
        async with self._lock:
            sampled = list(result.token_ids)
            branch.append(sampled, sampled=True, logprobs=list(result.logprobs))
            branch.add_routing(result.routed_experts)
            reply, sampled_text, stop_sequence = self._reply_of(result, sampled, stop, read_reply, parse_tools)
            message = reply.as_message()
            branch.keys.append(message.key())
            branch.checkpoints.append(Checkpoint(len(branch.keys), len(branch.token_ids),
                                                 self.renderer.bridge_after(sampled_text)))
            branch.busy = False
            self._record(plan.thread, branch, conversation, protocol, stream, started_at, clock, len(prompt),
                         len(sampled), result.finish_reason, kind, new_prompt_tokens, reply=message)
        return Completion(reply=reply, finish_reason=result.finish_reason, prompt_tokens=len(prompt),
                          completion_tokens=len(result.token_ids), stop_sequence=stop_sequence)

    def _reply_of(self, result: GenerateResult, sampled: list[int], stop: tuple[str, ...],
                  read_reply: Callable[[str], Reply] | None, parse_tools: bool) -> tuple[Reply, str, str | None]:
        """The reply as the protocols show it (without the end-of-turn token and the request's stop string), the
        text of every sampled token, and the request's stop string that ended it."""
        shown = sampled
        if result.finish_reason == "stop" and sampled and sampled[-1] in self.engine.eos_token_ids:
            shown = sampled[:-1]
        shown_text = self.renderer.decode(shown)
        sampled_text = shown_text if shown is sampled else self.renderer.decode_after(shown_text, shown, sampled)
        stop_sequence = result.stop_sequence if result.stop_sequence in stop else None  # not our CALL_CLOSE
        if stop_sequence and stop_sequence in shown_text:
            # As the protocols define it, the reply ends before the stop string; the stream keeps every
            # sampled token, so the model's next turn continues from exactly what it sampled.
            shown_text = shown_text[: shown_text.index(stop_sequence)]
        if read_reply is not None:
            reply = read_reply(shown_text)
        else:
            reply = parse_reply(shown_text, parse_tools=parse_tools, thinking=self.renderer.thinking)
        return reply, sampled_text, stop_sequence

    def _constraint(self, tools: list[dict], parse_tools: bool, choice: ToolChoice | None,
                    strict_tools: frozenset[str], json_output: JsonOutput | None) -> Constraint | None:
        """The reply's constraint, refused (400) when the engine cannot enforce constraints."""
        constraint = reply_constraint(tools, parse_tools, choice, strict_tools, json_output, self.renderer)
        if constraint is not None and not getattr(self.engine, "constrained_decoding", False):
            raise RequestError(f"'{constraint.param}' asks for {constraint.what}, which needs constrained decoding, "
                               f"and this policy's engine ({type(self.engine).__name__}) does not enforce "
                               "constraints; leave it out, or serve the policy with engine.kind: transformers",
                               param=constraint.param, code="unsupported_parameter")
        return constraint

    def _sampling_params(self, limit: int, stops: tuple[str, ...], constraint: Constraint | None) -> SamplingParams:
        """The engine's parameters for a call (frozen, so calls asking the same share one)."""
        key = (limit, stops, constraint)
        params = self._sampling.get(key)
        if params is None:
            if len(self._sampling) >= 64:
                self._sampling.clear()
            params = self._sampling[key] = SamplingParams(
                temperature=self.sampling.temperature, top_p=self.sampling.top_p, max_tokens=limit,
                stop_token_ids=tuple(self.engine.eos_token_ids), stop=stops, constraint=constraint)
        return params

    async def _plan(self, conversation: Conversation) -> _Plan:
        keys = conversation.keys()
        thread = self._thread_for(conversation, keys)
        for branch, checkpoint in _candidates(thread.branches, keys):
            known = max(0, checkpoint.messages - 1)  # keys[0] is the tools key
            new = await self.renderer.new_tokens(conversation, known, checkpoint.bridge, start=branch is None)
            if new is None:
                continue  # the template renders the known part differently now: try an earlier checkpoint
            new_ids = new.ids
            # the end of the leading system turn, on a branch built from scratch
            header = Checkpoint(2, new.header) if new.header is not None else None
            gen = self.renderer.generation_prompt_ids
            prompt_end = None
            if gen and new_ids[-len(gen):] == gen:
                prompt_end = checkpoint.position + len(new_ids) - len(gen)
            return _Plan(thread, branch, checkpoint, new_ids, header, prompt_end, keys)
        raise AssertionError("the empty checkpoint always matches")  # pragma: no cover

    def _thread_for(self, conversation: Conversation, keys: list[MatchKey]) -> Thread:
        """The request's thread (the rule is in the module docstring)."""
        signature = agent_signature(conversation)
        system = 0
        while system < len(conversation.messages) and conversation.messages[system].role == "system":
            system += 1
        thread = self._signatures.get(signature)
        if thread is None:
            body = keys[1 + system:]
            marked = marked_subagent(conversation)
            held = [(t.continued_by(body), -t.order, t) for t in self._threads
                    if t.marked_subagent == marked] if conversation.tools else []
            best = max(held, key=lambda h: h[:2], default=(0, 0, None))
            thread = best[2] if best[0] else None
            if thread is None:
                thread = Thread(signature, len(self._threads), bool(conversation.tools), marked)
                self._threads.append(thread)
            self._signatures[signature] = thread
        thread.system_keys.update(keys[1:1 + system])
        return thread

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
        keys = plan.keys
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

    def _record(self, thread: Thread, branch: Branch | None, conversation: Conversation, protocol: str,
                stream: bool, started_at: float, clock: float, prompt_tokens: int, completion_tokens: int,
                finish_reason: str, kind: str, new_prompt_tokens: int, error: str | None = None,
                reply: ChatMessage | None = None) -> None:
        index = len(self._calls)
        record = LLMCall(call_index=index, protocol=protocol, started_at=started_at,
                         latency_s=time.perf_counter() - clock, prompt_tokens=prompt_tokens,
                         completion_tokens=completion_tokens, finish_reason=finish_reason, segment_index=-1,
                         kind=kind, new_prompt_tokens=new_prompt_tokens, stream=stream, error=error,
                         request_json=self._requests.encode(thread.order, index, conversation),
                         reply_json=reply_json(reply) if reply is not None else "")
        self._calls.append(_Call(record, branch, thread))

    # ------------------------------------------------------------------------------------------ results

    def _served(self, task: asyncio.Task) -> None:
        with self._inflight_lock:
            self._inflight.discard(task)

    def cancel_inflight(self) -> int:
        """Cancel the requests still being served (the rollout ended: nobody waits for their answers)."""
        with self._inflight_lock:
            pending = [task for task in self._inflight if not task.done()]
        for task in pending:  # close_session may be called from another thread than the proxy's loop
            task.get_loop().call_soon_threadsafe(task.cancel)
        return len(pending)

    def main_thread(self) -> Thread | None:
        threads = self._threads  # in order of their first request
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
            record.thread = "main" if call.thread is main else f"subagent:{call.thread.order}"
            if call.thread is not main:
                record.kind = "subagent"
            calls.append(record)
        return segments, calls
