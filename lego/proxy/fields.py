"""Which request fields the proxy accepts, and why each one is safe to accept: nothing is ignored silently.

Each protocol parser (anthropic.py, openai_chat.py, responses.py) lists every field of its request body, and of each
option object in it (`stream_options`, `output_config`, `text`, ...), in a table of `Field`s saying how the proxy
treats it:
- `honoured`: the proxy does what it asks (messages, tools, tool_choice, max tokens, stop strings, streaming, ...).
- `checked`: honoured for the values the proxy can serve, answered with the protocol's 400 naming it otherwise
  (e.g. `response_format` of type text, json_object or json_schema is served, any other type is refused; a
  structured output is a constraint the engine enforces, refused where it cannot). The parser does the check.
- `policy`: decided by the policy's configuration, never by the request: sampling parameters (temperature, top_p,
  penalties, seed, ...) and reasoning settings (effort, thinking budget, verbosity). The log-probs the trainer
  compares against must come from the distribution that was sampled, and every harness must be trained on the same
  policy (on-policy RL); a request asking for other settings gets the policy's (see lego/proxy/session.py).
- `harmless`: bookkeeping, caching or delivery hints whose absence changes nothing the model sees or samples nor
  anything the client is told (user ids, metadata, prompt-cache keys, service tiers, `store`).
A field in no table is refused with the protocol's 400 naming it, as the real APIs refuse fields they do not know:
a field the proxy has not decided about could ask for something it would not do.

Inside content (messages, input items, content blocks, tools) the parsers name what they read and refuse the
kinds they cannot serve (images, hosted tools, server-side state); other keys there (ids, status, cache markers,
provider metadata that harnesses attach to replayed history) are not part of what the model sees and are not read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from lego.proxy.messages import RequestError


class Treatment(StrEnum):
    honoured = "honoured"
    checked = "checked"
    policy = "policy"
    harmless = "harmless"


@dataclass(frozen=True)
class Field:
    treatment: Treatment
    why: str  # one line: what the proxy does with it


def honoured(why: str) -> Field:
    return Field(Treatment.honoured, why)


def checked(why: str) -> Field:
    return Field(Treatment.checked, why)


def policy(why: str) -> Field:
    return Field(Treatment.policy, why)


def harmless(why: str) -> Field:
    return Field(Treatment.harmless, why)


def check_fields(body: Mapping[str, Any], fields: Mapping[str, Field], where: str, module: str,
                 prefix: str = "") -> None:
    """Refuse the first key of `body` that `fields` does not list (400, naming it); `prefix` is the path of `body`
    in the request (`stream_options.`), `module` the parser whose table would have to list it."""
    for key in body:
        if key not in fields:
            param = f"{prefix}{key}"
            raise RequestError(f"'{param}' is not a {where} field this server knows, so it could ask for something "
                               f"it would not do; remove it from the request (or, if it changes nothing the model "
                               f"sees or samples, list it in lego/proxy/{module}.py)", param=param,
                               code="unknown_parameter")


def option_object(body: Mapping[str, Any], key: str, fields: Mapping[str, Field], where: str,
                  module: str) -> dict[str, Any]:
    """The option object `body[key]` ({} when absent or null), its keys checked against `fields`."""
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(f"'{key}' must be an object, got {type(value).__name__}", param=key)
    check_fields(value, fields, where, module, prefix=f"{key}.")
    return value


def unsupported(param: str, what: str, instead: str) -> RequestError:
    """The 400 for a feature the proxy cannot serve: it names the field, says why and what to send instead."""
    return RequestError(f"'{param}' {what}, which this server does not support; {instead}", param=param,
                        code="unsupported_parameter")
