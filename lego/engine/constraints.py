"""Constraints on what a generation may be, enforced by the engine token by token (constrained decoding).

A request that asks for a shape of reply (a forced tool call, a JSON schema or JSON mode, tools with `strict: true`)
gets a `Constraint`: a grammar the engine applies as a mask on the logits at every sampling step, so that no
model, however untrained, can answer in another shape. The grammar is an xgrammar *structural tag* (JSON text), the
format vLLM's structured outputs take as they are (`StructuredOutputsParams(structural_tag=...)`, xgrammar backend),
so every engine enforces the same grammar; built here, in one place, from the request's tools and schemas.

The grammars write the reply the way the chat template reads it (Qwen3, lego/proxy/reply.py):
- A tool call is the `<tool_call>` token, `\\n{"name": "<name>", "arguments": ` followed by arguments that follow the
  tool's JSON schema, then `}\\n` and the `</tool_call>` token; several calls are separated by `\\n`. A tool without a
  schema (no properties and nothing said of other properties) takes any JSON object. Object properties come in the
  schema's order, and properties a schema does not declare are not written unless its `additionalProperties` allows
  them (xgrammar's strict mode, as OpenAI's strict tools).
- A thinking template (its generation prompt opens a `<think>` block): a forced call or a structured output comes
  after an empty think block (`\\n</think>\\n\\n`, what Qwen3 writes when it does not think), so the constrained part
  is reached within any token budget; where the reply is free text with constrained tool calls (strict tools under
  `tool_choice: auto`), the model reasons freely and closes its think block with the `</think>` token first.
- The reply ends with the engine's stop token once the grammar is complete (the engine allows nothing else there).
- Given the tokenizer's `encode`, the fixed text of a call's opening and of an empty think block is required as the
  tokens the tokenizer makes of it (what the template's render of the call would hold): the model samples them
  with probability 1 (log-prob 0) rather than spelling the same text in tokens of its choosing.

Importing this module needs neither xgrammar nor torch (the proxy's process builds constraints without an engine);
lego/engine/grammar_mask.py compiles and applies them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lego.errors import LegoError

Encode = Callable[[str], Sequence[int]]  # text -> the tokenizer's token ids (no special tokens added)

THINK_CLOSE = "</think>"
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
CALL_SEPARATOR = "\n"
# Consecutive whitespace characters JSON may hold between its tokens: a model that keeps choosing whitespace (an
# untrained one does) is soon made to write the value itself. A structured output has room for pretty-printing a
# few levels deep; a tool call's arguments, which the template writes on one line (`{"a": 1, "b": 2}`), for that.
JSON_WHITESPACE = 16
ARGUMENTS_WHITESPACE = 2
_NATIVE_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")  # "[08:27:43] /project/cpp/file.cc:4950: " of a C++ error


class ConstraintError(LegoError):
    """A constraint the engine cannot enforce (a schema its grammar library cannot compile, a tool-call token the
    tokenizer lacks). The proxy answers it with the protocol's 400 naming `param`."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Constraint:
    """What a generation must be: `structural_tag` is xgrammar's structural tag as JSON text
    (`{"type": "structural_tag", "format": {...}}`); `param` the request field that asked for it, `what` the
    reply it stands for, both for messages."""

    structural_tag: str
    param: str
    what: str

    @property
    def format(self) -> dict[str, Any]:
        return json.loads(self.structural_tag)["format"]


def unenforceable(constraint: Constraint, error: str) -> ConstraintError:
    """The error for a constraint an engine's grammar library refused; `error` is the library's message, whose
    last line says why."""
    lines = error.strip().splitlines()
    reason = _NATIVE_PREFIX.sub("", lines[-1]) if lines else "its grammar library refused it"
    return ConstraintError(f"'{constraint.param}' asks for {constraint.what}, which the engine cannot enforce "
                           f"({reason}); simplify the JSON schema (or leave the constraint out)", constraint.param)


def _constraint(elements: list[dict[str, Any]], param: str, what: str) -> Constraint:
    body = elements[0] if len(elements) == 1 else {"type": "sequence", "elements": elements}
    tag = {"type": "structural_tag", "format": body}
    return Constraint(json.dumps(tag, ensure_ascii=False, sort_keys=True), param, what)


def _token(text: str) -> dict[str, Any]:
    return {"type": "token", "token": text}


def _const(text: str) -> dict[str, Any]:
    return {"type": "const_string", "value": text}


def _text(text: str, encode: Encode | None) -> dict[str, Any]:
    """Fixed text: as the tokens `encode` makes of it, or (no `encode`) in any tokens that spell it."""
    if encode is None:
        return _const(text)
    tokens = [_token(int(token)) for token in encode(text)]
    return tokens[0] if len(tokens) == 1 else {"type": "sequence", "elements": tokens}


def _empty_think_block(encode: Encode | None) -> list[dict[str, Any]]:
    return [_text("\n", encode), _token(THINK_CLOSE), _text("\n\n", encode)]


def json_value(schema: Any, whitespace: int = JSON_WHITESPACE) -> dict[str, Any]:
    """The format of a JSON value following `schema` (None: any JSON object), with at most `whitespace`
    whitespace characters in a row."""
    return {"type": "json_schema", "json_schema": arguments_schema(schema), "max_whitespace_cnt": whitespace}


def arguments_schema(schema: Any) -> dict[str, Any] | bool:
    """`schema` as the grammar reads it: an object schema that declares no properties and says nothing of other
    properties takes any JSON object (xgrammar's strict mode would allow only `{}`; JSON Schema allows any)."""
    if schema is None:
        return {"type": "object"}
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        raise TypeError(f"a JSON schema is an object or a boolean, not {type(schema).__name__}")
    if (schema.get("type") == "object" and not schema.get("properties") and "additionalProperties" not in schema
            and not any(key in schema for key in ("anyOf", "oneOf", "allOf", "$ref", "enum", "const"))):
        return {key: value for key, value in schema.items() if key != "properties"}
    return schema


def tool_call_tag(name: str, schema: Any, encode: Encode | None = None) -> dict[str, Any]:
    """One call of the tool `name`, its arguments following `schema`, as the template writes it. The space before
    the arguments is left to them (a tokenizer joins it with their first character)."""
    opening = '\n{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments":'
    arguments = json_value(schema, ARGUMENTS_WHITESPACE)
    content = {"type": "sequence", "elements": [_text(opening, encode), _const(" "), arguments, _const("}\n")]}
    return {"type": "tag", "begin": _token(CALL_OPEN), "content": content, "end": _token(CALL_CLOSE)}


def _tool_schemas(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """Each tool's name and argument schema (the template's tool definitions: {"type": "function", "function":
    {"name", "parameters"}})."""
    return {tool["function"]["name"]: tool["function"].get("parameters") for tool in tools}


def _calls(tools: list[dict[str, Any]], names: list[str] | None, at_least_one: bool, parallel: bool,
           encode: Encode | None, schemaless: frozenset[str] = frozenset()) -> dict:
    """Calls of `tools` (only `names`, when given) separated as the template separates them; the tools in
    `schemaless` take any JSON object."""
    schemas = _tool_schemas(tools)
    tags = [tool_call_tag(name, None if name in schemaless else schema, encode) for name, schema in schemas.items()
            if names is None or name in names]
    return {"type": "tags_with_separator", "tags": tags, "separator": CALL_SEPARATOR, "at_least_one": at_least_one,
            "stop_after_first": not parallel}


def forced_call_constraint(tools: list[dict[str, Any]], name: str | None, parallel: bool, thinking: bool,
                           encode: Encode | None = None, param: str = "tool_choice") -> Constraint:
    """A reply that is tool calls only: one call of `name`, or (None) one or more calls (one when not `parallel`)
    of any of `tools`."""
    names = None if name is None else [name]
    calls = _calls(tools, names, at_least_one=True, parallel=parallel and name is None, encode=encode)
    what = f"a call of {name}" if name is not None else "a tool call"
    return _constraint([*(_empty_think_block(encode) if thinking else []), calls], param, what)


def json_output_constraint(schema: Any, thinking: bool, tools: list[dict[str, Any]] | None = None,
                           parallel: bool = True, encode: Encode | None = None,
                           param: str = "response_format") -> Constraint:
    """A reply that is one JSON value following `schema` (None: any JSON object, JSON mode), or, where `tools`
    may be called, tool calls instead (the structured answer is the final one; calls come before it)."""
    value = json_value(schema)
    if tools:
        calls = _calls(tools, None, at_least_one=True, parallel=parallel, encode=encode)
        value = {"type": "or", "elements": [value, calls]}
    return _constraint([*(_empty_think_block(encode) if thinking else []), value], param,
                       "JSON following the schema" if schema is not None else "a JSON object")


def strict_tools_constraint(tools: list[dict[str, Any]], strict: frozenset[str], parallel: bool, thinking: bool,
                            encode: Encode | None = None, param: str = "tools") -> Constraint:
    """Free text (and reasoning), where every tool call the model opens with the `<tool_call>` token is a call of
    one of `tools`: the arguments of the `strict` ones follow their schemas, the others' are any JSON object."""
    schemaless = frozenset(_tool_schemas(tools)) - strict
    tags = _calls(tools, None, at_least_one=False, parallel=parallel, encode=encode, schemaless=schemaless)["tags"]
    calls = {"type": "token_triggered_tags", "trigger_tokens": [CALL_OPEN], "tags": tags,
             "stop_after_first": not parallel}
    reasoning = [{"type": "any_text", "excludes": [THINK_CLOSE]}, _token(THINK_CLOSE)] if thinking else []
    return _constraint([*reasoning, calls], param, "tool calls following their schemas")
