"""Lego's bridge to one Harbor environment; runs in Harbor's own Python >= 3.12 venv, never imported by Lego.

Harbor needs Python >= 3.12 and Lego runs on 3.11, so Lego starts this file with the Harbor venv's interpreter
(lego/sandbox/harbor_backend.py). It imports Harbor and the standard library only. Protocol:

    python harbor_bridge.py SPEC.json
    stdout: one line `LEGO_HARBOR {"ok": true, ...}` once the environment is up, or
            `LEGO_HARBOR {"ok": false, "stage": "environment_start", "error_type": ..., "error": ...}`
    stdin:  any line, or end of file (Lego gone), stops and deletes the environment;
            then `LEGO_HARBOR {"stopped": true}` and exit 0.

The environment is created through Harbor's own factory: a built-in type (`EnvironmentType`) or a custom
environment class by import path, Harbor's custom-environment hook, with Harbor's options as keyword arguments.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import traceback
from pathlib import Path

MARKER = "LEGO_HARBOR "


def report(**fields) -> None:
    sys.stdout.write(MARKER + json.dumps(fields) + "\n")
    sys.stdout.flush()


async def main(spec: dict) -> int:
    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.environment_type import EnvironmentType
    from harbor.models.task.config import EnvironmentConfig
    from harbor.models.trial.paths import TrialPaths

    trial_paths = TrialPaths(Path(spec["trial_dir"]))
    trial_paths.mkdir()
    # No network_policy: Harbor's docker environment enforces "no-network" only with its egress-control sidecar
    # (kernel support it probes for); Lego's compose overlay sets network mode none on the container itself.
    kwargs = dict(environment_dir=Path(spec["environment_dir"]), environment_name=spec["name"],
                  session_id=spec["session_id"], trial_paths=trial_paths,
                  task_env_config=EnvironmentConfig.model_validate(spec["task_env"]),
                  logger=logging.getLogger("lego.harbor"),
                  extra_docker_compose=spec.get("extra_docker_compose") or None, auto_mounts=[],
                  **spec.get("options", {}))
    try:
        if spec.get("import_path"):
            env = EnvironmentFactory.create_environment_from_import_path(spec["import_path"], **kwargs)
        else:
            env = EnvironmentFactory.create_environment(EnvironmentType(spec["type"]), **kwargs)
    except Exception as exc:  # noqa: BLE001  (reported to Lego, which raises its own error)
        report(ok=False, stage="environment_create", error_type=type(exc).__name__, error=str(exc)[-4000:],
               traceback=traceback.format_exc()[-4000:])
        return 2
    try:
        await asyncio.wait_for(env.start(force_build=bool(spec.get("force_build"))), spec["start_timeout_s"])
    except BaseException as exc:  # noqa: BLE001
        kind = "EnvironmentStartTimeoutError" if isinstance(exc, TimeoutError) else type(exc).__name__
        report(ok=False, stage="environment_start", error_type=kind, error=str(exc)[-4000:],
               traceback=traceback.format_exc()[-4000:])
        try:
            await env.stop(delete=True)
        except BaseException:  # noqa: BLE001
            pass
        return 3
    report(ok=True, type=env.type() if isinstance(env.type(), str) else env.type().value,
           session_id=spec["session_id"])
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    try:
        await env.stop(delete=True)
    except BaseException as exc:  # noqa: BLE001
        report(stopped=False, error_type=type(exc).__name__, error=str(exc)[-2000:])
        return 4
    report(stopped=True)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sys.exit(asyncio.run(main(json.loads(Path(sys.argv[1]).read_text()))))
