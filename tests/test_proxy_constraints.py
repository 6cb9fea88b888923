"""Constraints enforced by the engine: through the real HTTP proxy, the real transformers engine samples a forced
tool call or a structured output under its grammar (lego/engine/constraints.py), so even the tiny random model,
which ignores its prompt, answers in the shape asked for; the tokens and log-probs recorded are exactly those sampled,
each log-prob the token's under the masked distribution it was drawn from. tests/test_vllm_engine.py asks the same
of the vLLM engine.
"""

from __future__ import annotations

import functools

import pytest
import torch
from constraint_asks import (
    BASH,
    READ,
    any_call_streamed,
    ask_at_once,
    json_answer,
    json_answer_streamed,
    masked_logprobs_check,
    named_call,
    refused_schema,
    required_calls,
)
from fixtures_model import fp32_engine, tiny_model_path  # noqa: F401  (session fixtures)
from proxy_doubles import BackgroundProxy, RecordingEngine

from lego.config import SamplingConfig


@pytest.fixture(scope="module")
def constrained(fp32_engine, tokenizer):  # noqa: F811
    engine = RecordingEngine(fp32_engine)
    background = BackgroundProxy(engine, tokenizer, SamplingConfig(max_tokens=160))
    background.engine = engine
    yield background
    background.close()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_forced_calls_are_valid_calls_whatever_the_model(constrained, seed):
    """A named function, `required` and Anthropic's `any` (streamed): every reply is tool calls of the request's
    tools with arguments that follow their schemas, and the record holds exactly what the engine sampled."""
    torch.manual_seed(seed)  # the engine samples from torch's default generator (the proxy sets no seed)
    sessions = ask_at_once(constrained, [named_call, functools.partial(required_calls, parallel=seed == 0),
                                         any_call_streamed])
    if not seed:
        masked_logprobs_check(constrained, sessions[0], constrained.engine.inner.tokenizer,
                              lambda ids: constrained.run(constrained.engine.inner.score(ids)))


@pytest.mark.parametrize("seed", [0, 1])
def test_json_schema_output_is_valid_json_whatever_the_model(constrained, seed):
    torch.manual_seed(seed)
    ask_at_once(constrained, [json_answer, json_answer_streamed])


def test_a_schema_the_engine_cannot_compile_is_refused(constrained):
    refused_schema(constrained)


def test_a_thinking_template_keeps_its_think_block(tokenizer):
    """Where the generation prompt opens a think block: a forced call follows an empty one, written in the
    template's tokens; with strict tools the model reasons first and closes the block itself."""
    from proxy_doubles import follows_constraint, tool_call_text

    from lego.engine.constraints import forced_call_constraint, strict_tools_constraint

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    def allows(constraint, text: str) -> bool:
        return follows_constraint(tokenizer, constraint, encode(text) + [tokenizer.convert_tokens_to_ids("<|im_end|>")])

    call = tool_call_text("read", {"path": "a.py"})
    forced = forced_call_constraint([BASH, READ], "read", True, thinking=True, encode=encode)
    assert allows(forced, "\n</think>\n\n" + call)
    assert not allows(forced, call) and not allows(forced, "Let me look.\n</think>\n\n" + call)
    strict = strict_tools_constraint([BASH, READ], frozenset({"read"}), True, thinking=True, encode=encode)
    assert allows(strict, "Let me look.\n</think>\n\nSure.\n" + call)
    assert allows(strict, "Let me look.\n</think>\n\n" + tool_call_text("bash", {"anything": [1]}))
    assert not allows(strict, "Let me look.\n</think>\n\n" + tool_call_text("read", {"path": "b.py"}))


def test_constraints_that_differ_in_token_ids_get_their_own_grammars(tokenizer):
    """Calls of two tools whose openings have as many tokens: each constraint gets its own token masks, which agree
    with its matcher (xgrammar's own cache gave a named call of `read` the masks of a grammar allowing `bash`)."""
    from proxy_doubles import follows_constraint, tool_call_text

    from lego.engine.constraints import forced_call_constraint

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    end = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    read, bash = tool_call_text("read", {"path": "a.py"}), tool_call_text("bash", {"command": "ls"})
    either = forced_call_constraint([BASH, READ], None, False, False, encode)
    assert follows_constraint(tokenizer, either, encode(read) + end)
    assert follows_constraint(tokenizer, either, encode(bash) + end)
    named = forced_call_constraint([BASH, READ], "read", True, False, encode)
    assert follows_constraint(tokenizer, named, encode(read) + end)
    assert not follows_constraint(tokenizer, named, encode(bash) + end)
