"""Runs mini-swe-agent beside a Lego sandbox (executed by mini's own venv Python, so it imports no lego code).

Usage: python mini_swe_agent_runner.py SPEC.json
SPEC: {"task", "container_id", "workdir", "api_base", "model", "step_limit", "exec_timeout_s", "output_path", "user"}.
The agent is mini's DefaultAgent with its default config (mini.yaml) and its LiteLLM tool-call model; the only
change is the environment: every command runs inside the sandbox container through the Docker API (the container
has no network; the agent's model calls go to the proxy on the host), as the spec's unprivileged `user` (a Docker
exec names its user, or it runs as the container's own, which the agent must not be). Prints one line
`LEGO_RESULT {json}`.
"""

import json
import sys
from pathlib import Path

import docker
import yaml
from minisweagent.agents.default import DefaultAgent
from minisweagent.config import builtin_config_dir
from minisweagent.environments.docker import DockerEnvironment, DockerEnvironmentConfig
from minisweagent.models.litellm_model import LitellmModel
from sandbox_exec import exec_stream


class SandboxEnvironmentConfig(DockerEnvironmentConfig):
    container_id: str
    user: str  # "uid:gid" every command runs as


class SandboxEnvironment(DockerEnvironment):
    """mini's DockerEnvironment over a container that already exists (the rollout owns its lifetime)."""

    def __init__(self, **kwargs):
        self.api = docker.from_env(timeout=600).api
        super().__init__(config_class=SandboxEnvironmentConfig, **kwargs)

    def _start_container(self):
        self.container_id = self.config.container_id

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict:
        command = action.get("command", "")
        limit = timeout or self.config.timeout
        argv = ["timeout", "-k", "2", str(limit), "bash", "-c", command]
        try:
            exec_id = self.api.exec_create(self.container_id, argv, workdir=cwd or self.config.cwd,
                                           environment=self.config.env, user=self.config.user)["Id"]
            raw = exec_stream.run_exec(self.api, exec_id)
            code = self.api.exec_inspect(exec_id).get("ExitCode")
            output = {"output": raw.decode("utf-8", errors="replace"), "returncode": code, "exception_info": ""}
            if code == 124:
                output["exception_info"] = f"the command timed out after {limit} seconds"
        except docker.errors.DockerException as exc:
            output = {"output": "", "returncode": -1,
                      "exception_info": f"An error occurred while executing the command: {exc}"}
        self._check_finished(output)
        return output

    def cleanup(self):
        pass

    def __del__(self):
        pass


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    config = yaml.safe_load((builtin_config_dir / "mini.yaml").read_text())
    env = SandboxEnvironment(image="lego-sandbox", container_id=spec["container_id"], user=spec["user"],
                             cwd=spec["workdir"], timeout=int(spec["exec_timeout_s"]),
                             **config.get("environment", {}))
    model_config = dict(config.get("model", {}))
    model_kwargs = {**model_config.pop("model_kwargs", {}), "api_base": spec["api_base"], "api_key": "lego"}
    model = LitellmModel(model_name=f"openai/{spec['model']}", model_kwargs=model_kwargs,
                         cost_tracking="ignore_errors", **model_config)
    agent_config = {**config["agent"], "step_limit": spec["step_limit"], "cost_limit": 0.0,
                    "output_path": spec["output_path"]}
    agent = DefaultAgent(model, env, **agent_config)
    try:
        info = agent.run(spec["task"])
    except Exception as exc:  # the trajectory is saved by run(); report the crash
        print("LEGO_RESULT " + json.dumps({"exit_status": type(exc).__name__, "error": str(exc)[-2000:],
                                           "n_calls": agent.n_calls}), flush=True)
        return 1
    print("LEGO_RESULT " + json.dumps({"exit_status": info.get("exit_status"), "n_calls": agent.n_calls}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
