"""A rollout runner for the Ray test (selected with pipeline.runner): each shard starts a proxy of its own over a
scripted engine (tests/proxy_doubles.py) and, per request, makes one chat completion through it over HTTP, as a
harness beside the sandbox would; the trajectory holds what the proxy recorded, and which process and proxy ran it.

LEGO_RAY_KILL_MARK=PATH: the first process to store a trajectory creates PATH and SIGKILLs itself right after (a
worker lost mid-shard); later processes find PATH and run to the end.
LEGO_RAY_STOP_MARK=PATH: the same, but the process SIGSTOPs itself: a shard frozen while its node stays up, which
Ray does not see as lost (its raylet still answers).
"""

from __future__ import annotations

import os
import signal
import socket

import httpx

from lego.config import SamplingConfig
from lego.records import Trajectory


class ProxyRunner:
    def rollout(self, ctx, tasks, requests, policy, *, stage, iteration, writer, gold=False) -> None:
        from proxy_doubles import BackgroundProxy, ScriptedEngine

        from lego.engine.tokenizer import load_tokenizer

        tokenizer = load_tokenizer()
        engine = ScriptedEngine(tokenizer)
        proxy = BackgroundProxy(engine, tokenizer, SamplingConfig(max_tokens=16))
        kill_mark = os.environ.get("LEGO_RAY_KILL_MARK", "")
        stop_mark = os.environ.get("LEGO_RAY_STOP_MARK", "")
        try:
            with httpx.Client(timeout=60) as client:
                for request in requests:
                    session = proxy.open_session(label=request.rollout_id)
                    engine.script(f"answer for {request.rollout_id}")
                    reply = client.post(f"{session.base_url}/v1/chat/completions", json={
                        "model": "m", "messages": [{"role": "user", "content": f"solve {request.task_id}"}]})
                    reply.raise_for_status()
                    proxy.server.close_session(session.id)
                    segments, calls = session.trajectory_parts()
                    trajectory = Trajectory(
                        rollout_id=request.rollout_id, task_id=request.task_id, harness=ctx.config.harness.name,
                        policy_version=policy.version, iteration=iteration, sample_index=request.sample_index,
                        segments=segments, calls=calls,
                        metadata={"pid": os.getpid(), "host": socket.gethostname(), "proxy": proxy.server.url,
                                  "reply": reply.json()["choices"][0]["message"]["content"]})
                    writer.append_trajectories([trajectory], stage=stage)
                    if kill_mark and _first_to_mark(kill_mark, request.rollout_id):
                        os.kill(os.getpid(), signal.SIGKILL)
                    if stop_mark and _first_to_mark(stop_mark, request.rollout_id):
                        os.kill(os.getpid(), signal.SIGSTOP)
        finally:
            proxy.close()

    def grader(self, ctx):
        raise NotImplementedError("the Ray test runs the rollout stage only")


def _first_to_mark(path: str, rollout_id: str) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # atomic: one process of all the workers wins
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as mark:
        mark.write(f"{os.getpid()} {rollout_id}\n")
    return True
