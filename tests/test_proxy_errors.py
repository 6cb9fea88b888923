"""Bad requests get each protocol's own error shape and status; overflows mark the session overlong."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest
from proxy_doubles import BackgroundProxy, ScriptedEngine

from lego.config import SamplingConfig


@pytest.fixture()
def proxy(tokenizer):
    engine = ScriptedEngine(tokenizer, max_context=400)
    background = BackgroundProxy(engine, tokenizer, SamplingConfig(max_tokens=64))
    background.engine = engine
    yield background
    background.close()


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    return error


def assert_anthropic_error(response: httpx.Response, status: int, kind: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"]


def test_openai_shapes(proxy):
    url = proxy.open_session().base_url
    chat = f"{url}/v1/chat/completions"
    assert_openai_error(httpx.post(chat, content=b"{not json"), 400)
    assert_openai_error(httpx.post(chat, json=["a list"]), 400)
    assert_openai_error(httpx.post(chat, json={"messages": "hi"}), 400, "messages")
    assert_openai_error(httpx.post(chat, json={"messages": []}), 400, "messages")
    assert_openai_error(httpx.post(chat, json={"messages": [{"role": "robot", "content": "x"}]}), 400,
                        "messages[0].role")
    assert_openai_error(httpx.post(chat, json={"messages": [{"role": "user", "content": 5}]}), 400)
    assert_openai_error(httpx.post(chat, json={"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}),
                        400, "max_tokens")
    assert_openai_error(httpx.post(chat, json={"messages": [{"role": "user", "content": "x"}], "tools": [5]}), 400)
    assert_openai_error(httpx.post(f"{url}/v1/responses", json={"input": 7}), 400, "input")
    assert_openai_error(httpx.post(f"{url}/v1/responses", json={"input": [{"type": "function_call"}]}), 400)
    assert_openai_error(httpx.get(chat), 405)
    assert_openai_error(httpx.post(f"{url}/v1/embeddings", json={}), 404)
    assert not proxy.engine.prompts  # nothing reached the engine


def test_anthropic_shapes(proxy):
    url = proxy.open_session().base_url
    messages = f"{url}/v1/messages?beta=true"
    assert_anthropic_error(httpx.post(messages, content=b"]"), 400, "invalid_request_error")
    assert_anthropic_error(httpx.post(messages, json={"messages": {"role": "user"}}), 400, "invalid_request_error")
    assert_anthropic_error(httpx.post(messages, json={"messages": [{"role": "tool", "content": "x"}]}), 400,
                           "invalid_request_error")
    assert_anthropic_error(httpx.post(messages, json={"max_tokens": 1.5, "messages": [{"role": "user", "content": "x"}]}),
                           400, "invalid_request_error")
    assert_anthropic_error(httpx.post(f"{url.rsplit('/', 1)[0]}/nope/v1/messages", json={}), 404, "not_found_error")


def test_unknown_and_closed_sessions_are_404_and_isolated(proxy):
    session = proxy.open_session()
    other = proxy.open_session()
    assert session.id != other.id and len(session.id) >= 32
    assert httpx.head(f"{proxy.server.url}/").status_code == 200
    assert httpx.head(f"{session.base_url}/").status_code == 200
    assert httpx.get(f"{session.base_url}/v1/models").json()["data"][0]["id"] == "lego-policy"
    client = openai.OpenAI(base_url=session.openai_base_url, api_key="x", max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert other.num_calls == 0 and session.num_calls == 1
    proxy.server.close_session(session.id)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert httpx.head(f"{session.base_url}/").status_code == 404
    guessed = f"{proxy.server.url}/s/{session.id[:-1]}x"
    assert_openai_error(httpx.post(f"{guessed}/v1/chat/completions", json={}), 404)
    assert_anthropic_error(httpx.post(f"{guessed}/v1/messages", json={}), 404, "not_found_error")
    with pytest.raises(anthropic.NotFoundError):
        anthropic.Anthropic(base_url=guessed, api_key="x", max_retries=0).messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert session.trajectory_parts()[1][0].finish_reason == "stop"  # records stay readable after close


def test_context_overflow_marks_the_session_overlong(proxy):
    session = proxy.open_session()
    client = openai.OpenAI(base_url=session.openai_base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "word " * 400}])
    assert caught.value.body["code"] == "context_length_exceeded"
    assert session.overlong
    # prompt fits but prompt + max_tokens does not (max_context 400, max_tokens 64)
    other = proxy.open_session()
    with pytest.raises(anthropic.BadRequestError) as caught:
        anthropic.Anthropic(base_url=other.anthropic_base_url, api_key="x", max_retries=0).messages.create(
            model="m", max_tokens=64, messages=[{"role": "user", "content": "word " * 340}])
    assert caught.value.body["error"]["type"] == "invalid_request_error" and other.overlong
    segments, calls = other.trajectory_parts()
    assert segments == [] and calls[0].finish_reason == "overlong" and calls[0].error


def test_max_tokens_is_clamped_and_engine_failure_is_a_500(proxy):
    session = proxy.open_session()
    client = openai.OpenAI(base_url=session.openai_base_url, api_key="x", max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}], max_tokens=100000)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}], max_completion_tokens=3)
    assert [s.max_tokens for s in proxy.engine.samplings] == [64, 3]

    async def broken(prompt_ids, sampling):
        raise RuntimeError("GPU fell off")

    proxy.engine.generate, working = broken, proxy.engine.generate
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}])
    proxy.engine.generate = working
    segments, calls = session.trajectory_parts()
    assert calls[-1].error.startswith("RuntimeError")
    # the failed call left no tokens behind: every segment is prompt + reply of served calls
    assert sum(s.num_sampled for s in segments) == sum(c.completion_tokens for c in calls)


def test_unix_socket_serves_the_same_routes(proxy):
    session = proxy.open_session()
    transport = httpx.HTTPTransport(uds=str(proxy.server.unix_path))
    with httpx.Client(transport=transport, base_url="http://proxy") as client:
        response = client.post(f"/s/{session.id}/v1/chat/completions",
                               json={"messages": [{"role": "user", "content": "hi"}]})
        assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "ok"
        assert client.post("/s/unknown/v1/messages", json={}).status_code == 404


def test_closing_a_session_cancels_its_pending_calls(tokenizer):
    import asyncio
    import threading

    import httpx

    from lego.proxy import ProxyServer

    class Silent:
        policy_version, max_context, eos_token_ids = 0, 4096, (151645,)

        async def generate(self, prompt_ids, sampling):
            await asyncio.Event().wait()

    async def scenario():
        server = await ProxyServer(Silent(), tokenizer).start()
        session = server.open_session()
        async with httpx.AsyncClient(timeout=30) as client:
            call = asyncio.create_task(client.post(f"{session.openai_base_url}/chat/completions",
                                                   json={"messages": [{"role": "user", "content": "hi"}]}))
            while not session._inflight:
                await asyncio.sleep(0.01)
            threading.Thread(target=server.close_session, args=(session.id,)).start()  # from another thread
            outcome = await asyncio.gather(call, return_exceptions=True)
        await server.stop()
        return outcome[0], session

    result, session = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert isinstance(result, httpx.HTTPError) or result.status_code >= 500  # the call ended, it did not hang
    assert session.closed and not [task for task in session._inflight if not task.done()]
