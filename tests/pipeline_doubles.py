"""A stand-in rollout/grading runner for the pipeline wiring tests (selected with pipeline.runner).

It sits beside the end-to-end test of the real stages (tests/test_pipeline_e2e.py). Trajectories are synthetic
(lego.data.synthetic) with the tiny policy's routing shape, so the real dataset and train stages consume them;
grades are a deterministic function of the rollout id, so groups have reward variance.
Set LEGO_DOUBLE_KILL_AFTER=N to SIGKILL the process once N trajectories have been stored in this process
(a crash in the middle of the rollout stage).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal

import numpy as np

from lego.data.synthetic import synthetic_segment, synthetic_trajectory
from lego.records import Outcome, OutcomeKind

_stored = 0


class DoubleRunner:
    def rollout(self, ctx, tasks, requests, policy, *, stage, iteration, writer, gold=False) -> None:
        global _stored
        kill_after = int(os.environ.get("LEGO_DOUBLE_KILL_AFTER", "0") or 0)
        spec = ctx.config.model.init
        for request in requests:
            seed = int(hashlib.sha256(request.rollout_id.encode()).hexdigest()[:8], 16)
            trajectory = synthetic_trajectory(
                np.random.default_rng(seed), request.rollout_id, request.task_id, iteration=iteration,
                sample_index=request.sample_index, tokens_per_segment=48, layers=spec.num_hidden_layers,
                top_k=spec.num_experts_per_tok, num_experts=spec.num_experts)
            rng = np.random.default_rng(seed + 1)
            trajectory.segments = [synthetic_segment(rng, 48, spec.num_hidden_layers, spec.num_experts_per_tok,
                                                     spec.num_experts, mean_prompt_span=8, mean_response_span=8)]
            trajectory.policy_version = policy.version
            trajectory.harness = ctx.config.harness.name
            trajectory.metadata["temperature"] = ctx.config.sampling.temperature
            trajectory.metadata["gold"] = gold  # a demonstration of the gold solution: graded resolved
            for segment in trajectory.segments:
                segment.token_ids[0] = 151644  # a real first token; the rest is noise
            # what the rollout stage counts of the (two) calls: an odd sample's second call rewrote the history, the
            # second call of samples 0, 4, 8 ... was a sub-agent's
            if request.sample_index % 2:
                trajectory.calls[1].kind = "rewrite"
            elif request.sample_index % 4 == 0:
                trajectory.calls[1].kind, trajectory.calls[1].thread = "start", "subagent:1"
            writer.append_trajectories([trajectory], stage=stage)
            _stored += 1
            if kill_after and _stored >= kill_after:
                os.kill(os.getpid(), signal.SIGKILL)

    @contextlib.contextmanager
    def grader(self, ctx):
        def grade(task, trajectory) -> Outcome:
            # Every GRPO group of two or more samples gets both rewards (its even samples solve the task), so a
            # train step always has signal; a gold demonstration is always resolved.
            solved = trajectory.sample_index % 2 == 0 or trajectory.metadata.get("gold")
            kind = OutcomeKind.resolved if solved else OutcomeKind.unresolved
            return Outcome(trajectory.rollout_id, trajectory.task_id, kind, evidence={"check": "double"})

        yield grade
