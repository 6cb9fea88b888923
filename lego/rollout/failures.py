"""Whose failure it is: what counts as a failure of the machinery (retried), and the controls that attribute a
harness crash to the policy or to infra (as timeouts and OOM kills are attributed)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import urllib3.exceptions
from docker.errors import DockerException

from lego.engine.base import SamplingParams
from lego.errors import ImageBuildError, LegoError, tail
from lego.records import LLMCall
from lego.sandbox import Sandbox, SandboxError

ENGINE_PROBE_TIMEOUT_S = 60.0


class HarnessFailed(LegoError):
    """The harness crashed for a reason that is not the policy's (before any model reply, or with an engine or
    proxy error): infrastructure, retried with a fresh sandbox and session."""

    def __init__(self, message: str, attribution: dict):
        super().__init__(message)
        self.attribution = attribution


# Failures of the machinery, retried: the sandbox and its engine (a vanished socket or a stopped daemon reaches
# us as FileNotFoundError/ConnectionError, requests' and urllib3's errors: all OSError or urllib3 HTTPError),
# images, and a harness crash that is not the policy's.
INFRA_ERRORS = (SandboxError, ImageBuildError, DockerException, OSError, urllib3.exceptions.HTTPError, HarnessFailed)


def attribute_crash(calls: Sequence[LLMCall], proxy_errors: Sequence[str] = (), engine_probe_error: str | None = None,
                    relay_error: str | None = None) -> dict:
    """Whose failure a harness crash is, from controls.

    The policy's (`by: policy`) only when the model was served at least one main-thread reply and nothing else
    can explain the crash: no call failed in the engine, the proxy had no internal error, a tiny generate on the
    engine works after the crash (`engine_probe_error` None) and the sandbox's relay to the proxy still answers
    (`relay_error` None). Then it was the model's own output (malformed tool calls, a reply the harness cannot
    parse) that crashed it, and crashing must not be free. Anything else is infra (`by: infra`), retried."""
    served = [call for call in calls if call.error is None and call.completion_tokens > 0]
    main_served = [call for call in served if call.kind != "subagent"]
    engine_errors = [call.error for call in calls if call.error and call.finish_reason != "overlong"]
    evidence = {"served_replies": len(served), "main_replies": len(main_served), "engine_errors": engine_errors[:5],
                "proxy_errors": list(proxy_errors)[:5], "engine_probe": engine_probe_error or "ok",
                "relay_probe": relay_error or "ok"}
    if engine_errors:
        return {"by": "infra", "check": "harness_crash_with_engine_error", **evidence}
    if proxy_errors:
        return {"by": "infra", "check": "harness_crash_with_proxy_error", **evidence}
    if not main_served:
        return {"by": "infra", "check": "harness_crash_before_any_reply", **evidence}
    if engine_probe_error is not None:
        return {"by": "infra", "check": "harness_crash_engine_unhealthy", **evidence}
    if relay_error is not None:
        return {"by": "infra", "check": "harness_crash_relay_down", **evidence}
    return {"by": "policy", "check": "harness_crash_caused_by_policy", **evidence}


async def probe_engine(engine, calls: Sequence[LLMCall], segments) -> str | None:
    """None when a one-token generate on the policy engine works; else what went wrong."""
    if not any(call.error is None and call.completion_tokens > 0 for call in calls):
        return None  # nothing to probe for: attribute_crash blames infra already
    prompt = [int(token) for token in segments[0].token_ids[:16]] if segments else []
    prompt = prompt or [int(engine.eos_token_ids[0])]
    try:
        await asyncio.wait_for(engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=1)),
                               ENGINE_PROBE_TIMEOUT_S)
    except Exception as exc:  # any failure of the probe says the engine is not healthy
        return tail(f"{type(exc).__name__}: {exc}")
    return None


async def probe_relay(sandbox: Sandbox, port: int, session_id: str) -> str | None:
    """None when the proxy still answers for the session through the sandbox's relay; else what it said."""
    status, answer = await asyncio.to_thread(sandbox.relay_status, port, session_id)
    return None if status == "200" else f"the proxy relay on port {port} answered {tail(answer) or 'nothing'!r}"
