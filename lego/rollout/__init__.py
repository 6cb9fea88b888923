"""Rollouts: the configured harness, unmodified, on a task in a sandbox, every LLM call through the proxy.

One rollout attempt: the task's sandbox (from the clean task image) -> a proxy session (its id is the only key to its
data) with a unix socket of its own -> a relay on the sandbox's loopback (a sandbox can reach its own session and
no other) -> the harness, under its wall-clock limit and a turn guard -> the final diff -> everything closed,
always (also on exceptions and cancellation). Infrastructure failures (daemon, image, container, relay, an engine
whose socket vanished) are retried with a fresh sandbox and session up to rollout.infra_retries times; when they
persist the rollout ends `env_setup_failed` (or `harness_failed`), never as a model failure.

A harness crash is attributed with controls (`failures.attribute_crash`): after at least one model reply, with every
call served without an engine error, a healthy engine (a one-token generate after the crash) and the relay up, the
model's own output provoked it: `harness_crash`, the policy's failure (reward 0). Otherwise it is infra: retried,
then `harness_failed`. The final diff is capped (verify.max_patch_bytes): over it the rollout ends
`patch_too_large` without the diff being transferred; a diff the agent's tree made impossible to take (the same
procedure works on the pristine snapshot) ends `diff_broken`. Both are the policy's failures, never infra.

The turn guard wraps the session's engine: the call after max_turns (plus the harness's side calls) is not
served; the harness is killed and the rollout ends `max_turns`. Harnesses with their own limit (mini's step_limit,
Claude Code's --max-turns, OpenCode's steps) normally stop before it.

The files, in the order a rollout meets them:
- `requests.py`: what to run (RolloutRequest) and the one rollout id format (deterministic, so reruns skip).
- `resources.py`: what a worker's rollouts share (proxy, sandbox factory, harness install).
- `attempt.py`: one rollout of one task (`run_rollout`), with its infra retries.
- `guard.py`: the turn guard; `harness_process.py`: running the harness in or beside the sandbox;
  `failures.py`: what counts as infra and whose failure a crash is.
- `batch.py`: many requests at `rollout.concurrency`, each trajectory persisted as it ends (the pipeline's
  rollout, filter and evaluate stages are its callers).
- `verl.py`: the single-attempt entry of verl's agent loop.

Nothing is imported here, so that a module needing only `requests` does not pull Docker and the proxy in.
"""
