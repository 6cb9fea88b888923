"""Red team: sabotage that used to escape as infra, on the real Docker engine.

An infra failure is retried and left out of the loss, so anything the policy can provoke that ends as infra is
a free retry for it (and no penalty). Each attack here used to end as infra (or as a silently wrong diff):
- the diff: .gitattributes tricks (filters, encodings, eol, binary, diff drivers), the agent's git config in its
  home (external diff, textconv, fsmonitor, noprefix, colours, an attributes file), a working tree that makes
  git fail (then a control on the pristine snapshot blames the agent), a diff over the cap (70 MiB, and one byte
  over a cap: never transferred, never cut);
- the sandbox: an agent that signals PID 1 and every process it can;
- the harness: a crash that the model's reply provokes is the policy's (`harness_crash`, reward 0); one before any
  reply or with an engine error is infra (`harness_failed`), retried;
- the engine: a socket that vanished is infra, retried; a private dockerd lives as long as a lego process holds a
  lease on it (two processes, the first exits, the second still runs containers; SIGKILLed holders do not keep it
  forever; `lego docker up` pins it until `lego docker down`).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import tarfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker

FIX = "sed -i 's/a - b/a + b/' calc.py"  # the real fix, as an agent would type it
RESET = "cd / && find /repo -mindepth 1 -delete && cp -a /opt/lego/repo/. /repo/ && rm -rf \"$HOME\"/.gitconfig " \
        "\"$HOME\"/.config /tmp/lego-evil*"


@pytest.fixture(scope="module")
def agent_sandbox(factory, calc_image):
    with factory.open(calc_image, purpose="agent") as sandbox:
        yield sandbox


def act(sandbox, commands: list[str]) -> None:
    """The agent's commands, from a pristine repository and an empty git config."""
    reset = sandbox.exec(RESET, workdir="/")
    assert reset.exit_code == 0, reset.output
    for command in commands:
        sandbox.exec(command)


@pytest.fixture(scope="module")
def reference_diff(agent_sandbox):
    act(agent_sandbox, [FIX])
    diff = agent_sandbox.diff()
    assert "+    return a + b" in diff and "-    return a - b" in diff
    return diff


def calc_section(diff: str) -> str:
    """The calc.py part of a patch."""
    parts = re.split(r"(?m)^(?=diff --git )", diff)
    return next(part for part in parts if part.startswith("diff --git a/calc.py b/calc.py"))


def gitconfig(*lines: str, path: str = '"$HOME/.gitconfig"') -> str:
    body = "\n".join(lines)
    return f'mkdir -p "$(dirname {path})" && cat > {path} <<\'LEGO_EOF\'\n{body}\nLEGO_EOF'


EVIL = "/tmp/lego-evil.sh"
MAKE_EVIL = (f"printf '#!/bin/sh\\necho pwned > /tmp/lego-evil-ran\\necho \"diff --git a/x b/x\"\\nexit 0\\n' > {EVIL} "
             f"&& chmod +x {EVIL}")

# Each: the agent's commands (after its fix), meant to break or falsify the diff Lego takes.
DIFF_ATTACKS = {
    # .gitattributes in the working tree
    "gitattributes_required_filter_fails": [
        "printf '* filter=evil\\n' > .gitattributes",
        gitconfig('[filter "evil"]', "\tclean = false", "\tsmudge = cat", "\trequired = true")],
    "gitattributes_filter_hides_the_fix": [
        "printf 'calc.py filter=hide\\n' > .gitattributes",
        gitconfig('[filter "hide"]', "\tclean = sed 's/a + b/a - b/'", "\tsmudge = cat")],
    "gitattributes_working_tree_encoding": ["printf '*.py working-tree-encoding=UTF-16\\n' > .gitattributes"],
    "gitattributes_binary": ["printf '* binary\\n' > .gitattributes"],
    "gitattributes_crlf_and_ident": [
        "printf '* text eol=crlf ident\\n' > .gitattributes", "sed -i 's/$/\\r/' calc.py"],
    "gitattributes_macro_and_external_diff_driver": [
        MAKE_EVIL, "printf '[attr]evil diff=evil -text\\n* evil\\n' > .gitattributes",
        gitconfig('[diff "evil"]', f"\tcommand = {EVIL}", f"\ttextconv = {EVIL}")],
    # the agent's git config in its home
    "gitconfig_external_diff": [MAKE_EVIL, gitconfig("[diff]", f"\texternal = {EVIL}")],
    "gitconfig_fsmonitor_runs_code": [MAKE_EVIL, gitconfig("[core]", f"\tfsmonitor = {EVIL}")],
    "gitconfig_noprefix_and_colours": [gitconfig("[diff]", "\tnoprefix = true", "[color]", "\tui = always",
                                                 "\tdiff = always")],
    "xdg_gitconfig_attributes_file": [
        "printf '* binary\\n' > /tmp/lego-evil-attributes",
        gitconfig("[core]", "\tattributesFile = /tmp/lego-evil-attributes",
                  path='"${XDG_CONFIG_HOME:-$HOME/.config}/git/config"')],
    "gitconfig_includes_and_hooks": [
        MAKE_EVIL, "printf '[diff]\\n\\texternal = %s\\n' " + EVIL + " > /tmp/lego-evil-include",
        gitconfig("[include]", "\tpath = /tmp/lego-evil-include", "[core]", "\thooksPath = /tmp",
                  "\tpager = " + EVIL)],
}


@pytest.mark.parametrize("attack", sorted(DIFF_ATTACKS))
def test_nothing_in_the_tree_or_home_breaks_or_falsifies_the_diff(attack, agent_sandbox, reference_diff):
    act(agent_sandbox, [FIX, *DIFF_ATTACKS[attack]])
    diff = agent_sandbox.diff()
    assert "\x1b[" not in diff, "colour codes in the patch"
    assert "pwned" not in diff
    if attack == "gitattributes_crlf_and_ident":
        # The agent turned every line of calc.py to CRLF: the patch says so, byte for byte (no eol conversion).
        assert "+    return a + b\r" in calc_section(diff)
    else:
        assert calc_section(diff) == calc_section(reference_diff), diff[:3000]
    # Lego's git never ran the agent's code (external diff, textconv, fsmonitor, pager).
    assert "No such file" in agent_sandbox.exec("cat /tmp/lego-evil-ran").output


def test_a_diff_the_agents_tree_breaks_is_the_policys_not_infra(agent_sandbox):
    from lego.sandbox import DiffBrokenByAgent

    # An embedded repository without a commit makes `git add` fail; on the pristine snapshot the same works.
    act(agent_sandbox, [FIX, "mkdir -p vendored && git -C vendored init -q"])
    with pytest.raises(DiffBrokenByAgent, match="pristine snapshot works"):
        agent_sandbox.diff()


def test_an_agent_that_fills_the_scratch_space_still_gets_its_diff(agent_sandbox, reference_diff):
    # A full /tmp used to make taking the diff fail on the agent's tree and on the pristine snapshot alike:
    # infra, a free retry. Its files are not needed any more, so they are freed and the diff is taken.
    act(agent_sandbox, [FIX, "head -c 600M /dev/zero > /tmp/fill 2>/dev/null; "
                             "for i in $(seq 1 2000); do : > /tmp/f$i 2>/dev/null || break; done; true"])
    assert agent_sandbox.exec("df --output=avail /tmp | tail -1").output.strip() in ("0", "")
    assert agent_sandbox.diff() == reference_diff


# ---------------------------------------------------------------------------------------------- patch size


def test_a_70_mib_diff_is_refused_at_the_cap(agent_sandbox, lego_config):
    from lego.sandbox import PatchTooLarge

    cap = lego_config.verify.max_patch_bytes
    assert cap <= 8 << 20
    act(agent_sandbox, [FIX, "head -c $((70 << 20)) /dev/urandom > blob.bin"])
    with pytest.raises(PatchTooLarge) as raised:
        agent_sandbox.diff(cap)
    assert raised.value.cap == cap


def test_a_diff_one_byte_over_the_cap_is_refused_and_one_at_the_cap_is_whole(agent_sandbox):
    from lego.sandbox import PatchTooLarge

    # ~4.5 MiB of text lines: a text patch just around the default cap.
    act(agent_sandbox, [FIX, "python3 -c \"import sys; sys.stdout.write(''.join(f'line {i} ' + 'x' * 40 + "
                             "chr(10) for i in range(100000)))\" > data.txt"])
    whole = agent_sandbox.diff(64 << 20)
    size = len(whole.encode())
    assert size > 4 << 20 and whole.endswith("\n") and "+line 99999 " in whole
    assert agent_sandbox.diff(size) == whole  # exactly at the cap: the whole patch
    with pytest.raises(PatchTooLarge):
        agent_sandbox.diff(size - 1)  # one byte over: refused, never cut


# ---------------------------------------------------------------------------------------------- PID 1


KILL_EVERYTHING = "kill -9 1; kill -TERM 1; kill -INT 1; kill -HUP 1; kill -9 -1; kill -TERM -1"


def test_an_agent_killing_pid_1_and_everything_leaves_the_sandbox_alive(factory, calc_image):
    with factory.open(calc_image, purpose="agent") as sandbox:
        assert sandbox.exec(FIX).exit_code == 0
        sandbox.exec(KILL_EVERYTHING, timeout=20)
        sandbox.exec(f"setsid sh -c '{KILL_EVERYTHING}'", timeout=20)
        time.sleep(1.0)
        assert sandbox.is_running()
        assert sandbox.exec("echo alive").output.strip() == "alive"
        assert "+    return a + b" in sandbox.diff()


# ---------------------------------------------------------------------------------------------- rollouts


@dataclass(frozen=True)
class _Spec:
    name: str = "redteam-harness"
    protocol: str = "openai_chat"
    runs: str = "beside"
    side_calls: int = 0


class ScriptHarness:
    """A minimal harness (a shell or Python command) for driving real rollouts: `runs` beside or in the sandbox."""

    def __init__(self, command: str, runs: str = "beside", tolerant: bool = False):
        self.spec = _Spec(runs=runs)
        self.command = command
        self.tolerant = tolerant

    def launch(self, context):
        from lego.harness.base import HarnessLaunch

        return HarnessLaunch(command=self.command, env={"LEGO_BASE": context.base_url, "PYTHON": sys.executable})

    def termination(self, result):
        from lego.records import TerminationReason

        if result.exit_code == 0 or self.tolerant:
            return TerminationReason.completed
        return TerminationReason.harness_crash


# The harness asks the model once and parses its reply as JSON, as harnesses parse tool calls: a reply it
# cannot parse crashes it (a traceback, exit 1).
PARSING_HARNESS = textwrap.dedent("""
    import json, os, urllib.request
    body = {"model": "m", "messages": [{"role": "user", "content": "Answer in JSON."}]}
    request = urllib.request.Request(os.environ["LEGO_BASE"] + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    reply = json.load(urllib.request.urlopen(request, timeout=60))
    print(json.loads(reply["choices"][0]["message"]["content"]))
""")


class FixedEngine:
    """Replies `text` to every call (or fails, when `fail`): a policy whose output the test chooses."""

    def __init__(self, tokenizer, text: str, fail: bool = False):
        self.tokenizer = tokenizer
        self.text = text
        self.fail = fail
        self.calls = 0
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    policy_version = 0
    max_context = 32768

    @property
    def eos_token_ids(self):
        return (self.end,)

    async def generate(self, prompt_ids, sampling):
        from lego.engine.base import GenerateResult

        self.calls += 1
        if self.fail:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        ids = self.tokenizer.encode(self.text, add_special_tokens=False) + [self.end]
        return GenerateResult(token_ids=ids, logprobs=[-0.5] * len(ids), routed_experts=None, finish_reason="stop",
                              prompt_tokens=len(prompt_ids))

    async def score(self, token_ids):
        return [0.0] * len(token_ids)


def rollout(harness, engine, lego_config, docker_engine, base_image, calc_task, tmp_path, retries: int = 1):
    from rollout_helpers import with_overrides

    from lego.proxy.server import ProxyServer
    from lego.rollout.attempt import run_rollout
    from lego.rollout.resources import RolloutResources
    from lego.sandbox.docker_sandbox import DockerSandboxFactory

    config = with_overrides(lego_config, rollout={"infra_retries": retries}, harness={"timeout_s": 120})
    (tmp_path / "install").mkdir(exist_ok=True)
    sockets = tmp_path / "proxy"
    sockets.mkdir(exist_ok=True)
    os.chmod(sockets, 0o755)

    async def go():
        proxy = ProxyServer(engine, engine.tokenizer, config.sampling, unix_path=sockets / "proxy.sock")
        await proxy.start()
        try:
            resources = RolloutResources(proxy=proxy, factory=DockerSandboxFactory(docker_engine.client, config.sandbox,
                                                                                   reap=False, base_image=base_image),
                                         docker_host=docker_engine.base_url,
                                         install_dir=tmp_path)
            return await run_rollout(calc_task, harness, resources=resources, config=config,
                                     rollout_id=f"redteam-{os.getpid()}-{time.monotonic_ns()}")
        finally:
            await proxy.stop()

    return asyncio.run(go())


def test_a_crash_the_models_reply_provokes_is_the_policys(tokenizer, lego_config, docker_engine, base_image,
                                                          calc_task, tmp_path):
    from lego.records import REWARD, OutcomeKind, TerminationReason
    from lego.verify.grader import TERMINATION_OUTCOME

    (tmp_path / "h.py").write_text(PARSING_HARNESS)
    harness = ScriptHarness(f'"$PYTHON" {tmp_path / "h.py"}')
    engine = FixedEngine(tokenizer, "this is not JSON {")
    trajectory = rollout(harness, engine, lego_config, docker_engine, base_image, calc_task, tmp_path)
    assert trajectory.termination == TerminationReason.harness_crash, (trajectory.error, trajectory.harness_log)
    assert trajectory.metadata["attempts"] == 1  # not retried: the policy's failure
    attribution = trajectory.metadata["failure_attribution"]
    assert attribution["by"] == "policy" and attribution["check"] == "harness_crash_caused_by_policy"
    assert attribution["main_replies"] == 1 and attribution["engine_probe"] == "ok"
    assert "JSONDecodeError" in trajectory.harness_log
    assert trajectory.segments and trajectory.calls  # trained on, with reward 0
    assert REWARD[TERMINATION_OUTCOME[trajectory.termination]] == 0.0
    assert TERMINATION_OUTCOME[trajectory.termination] == OutcomeKind.unresolved

    # The same harness on a reply it can parse completes: the crash was the reply's doing.
    good = rollout(harness, FixedEngine(tokenizer, '{"answer": 1}'), lego_config, docker_engine, base_image,
                   calc_task, tmp_path)
    assert good.termination == TerminationReason.completed, good.harness_log


def test_a_crash_before_any_reply_or_with_an_engine_error_is_infra_and_retried(tokenizer, lego_config,
                                                                                docker_engine, base_image,
                                                                                calc_task, tmp_path):
    from lego.records import REWARD, TerminationReason
    from lego.verify.grader import TERMINATION_OUTCOME

    before = rollout(ScriptHarness("echo 'harness: cannot start' >&2; exit 3"), FixedEngine(tokenizer, "{}"),
                     lego_config, docker_engine, base_image, calc_task, tmp_path, retries=1)
    assert before.termination == TerminationReason.harness_failed, before.error
    assert before.metadata["attempts"] == 2 and len(before.metadata["infra_errors"]) == 2
    assert before.metadata["failure_attribution"]["check"] == "harness_crash_before_any_reply"
    assert REWARD[TERMINATION_OUTCOME[before.termination]] is None

    (tmp_path / "h.py").write_text(PARSING_HARNESS)
    broken = FixedEngine(tokenizer, "{}", fail=True)
    engine_error = rollout(ScriptHarness(f'"$PYTHON" {tmp_path / "h.py"}'), broken, lego_config, docker_engine,
                           base_image, calc_task, tmp_path, retries=1)
    assert engine_error.termination == TerminationReason.harness_failed, engine_error.error
    assert engine_error.metadata["failure_attribution"]["check"] == "harness_crash_with_engine_error"
    assert broken.calls == 2  # served once per attempt: retried


def test_a_rollout_with_a_70_mib_diff_ends_patch_too_large(tokenizer, lego_config, docker_engine, base_image,
                                                            calc_task, tmp_path):
    from lego.records import REWARD, TerminationReason
    from lego.verify.grader import TERMINATION_OUTCOME

    harness = ScriptHarness(f"{FIX} && head -c $((70 << 20)) /dev/urandom > blob.bin", runs="sandbox")
    trajectory = rollout(harness, FixedEngine(tokenizer, "{}"), lego_config, docker_engine, base_image, calc_task,
                         tmp_path)
    assert trajectory.termination == TerminationReason.patch_too_large, (trajectory.error, trajectory.harness_log)
    assert trajectory.final_diff == "" and trajectory.metadata["attempts"] == 1
    attribution = trajectory.metadata["failure_attribution"]
    assert attribution["check"] == "patch_too_large"
    assert attribution["max_patch_bytes"] == lego_config.verify.max_patch_bytes
    assert REWARD[TERMINATION_OUTCOME[trajectory.termination]] == 0.0


def test_a_rollout_whose_agent_kills_pid_1_keeps_its_sandbox_and_diff(tokenizer, lego_config, docker_engine,
                                                                       base_image, calc_task, tmp_path):
    from lego.records import TerminationReason

    harness = ScriptHarness(f"{FIX}; {KILL_EVERYTHING}; setsid sh -c '{KILL_EVERYTHING}'; sleep 1",
                            runs="sandbox", tolerant=True)
    trajectory = rollout(harness, FixedEngine(tokenizer, "{}"), lego_config, docker_engine, base_image, calc_task,
                         tmp_path)
    assert trajectory.termination == TerminationReason.completed, (trajectory.error, trajectory.metadata)
    assert trajectory.metadata["attempts"] == 1 and not trajectory.metadata["infra_errors"]
    assert "+    return a + b" in trajectory.final_diff


def test_an_engine_whose_socket_vanished_is_infra_and_retried(tokenizer, lego_config, base_image, calc_task,
                                                              tmp_path):
    import docker

    from lego.records import TerminationReason

    gone = docker.DockerClient(base_url=f"unix://{tmp_path}/vanished.sock", version="1.41", timeout=5)

    @dataclass
    class Gone:
        client: object
        base_url: str = f"unix://{tmp_path}/vanished.sock"

    trajectory = rollout(ScriptHarness("true"), FixedEngine(tokenizer, "{}"), lego_config, Gone(gone), base_image,
                         calc_task, tmp_path, retries=1)
    assert trajectory.termination == TerminationReason.env_setup_failed
    assert trajectory.metadata["attempts"] == 2
    assert "ConnectionError" in trajectory.error or "FileNotFoundError" in trajectory.error, trajectory.error


# ---------------------------------------------------------------------------------------------- crash attribution


def call(index: int, *, error: str | None = None, tokens: int = 5, kind: str = "extend", finish: str = "stop"):
    from lego.records import LLMCall

    return LLMCall(call_index=index, protocol="openai_chat", started_at=0.0, latency_s=0.1, prompt_tokens=10,
                   completion_tokens=0 if error else tokens, finish_reason="error" if error else finish,
                   segment_index=0, kind=kind, error=error)


@pytest.mark.parametrize(("calls", "proxy_errors", "probe", "relay", "by", "check"), [
    ([], [], None, None, "infra", "harness_crash_before_any_reply"),
    ([call(0, kind="subagent")], [], None, None, "infra", "harness_crash_before_any_reply"),
    ([call(0), call(1, error="RuntimeError: CUDA error")], [], None, None, "infra", "harness_crash_with_engine_error"),
    ([call(0)], ["KeyError: 'x'"], None, None, "infra", "harness_crash_with_proxy_error"),
    ([call(0)], [], "TimeoutError: ", None, "infra", "harness_crash_engine_unhealthy"),
    ([call(0)], [], None, "the proxy relay does not answer", "infra", "harness_crash_relay_down"),
    ([call(0, kind="start"), call(1)], [], None, None, "policy", "harness_crash_caused_by_policy"),
])
def test_harness_crash_attribution(calls, proxy_errors, probe, relay, by, check):
    from lego.rollout.failures import attribute_crash

    attribution = attribute_crash(calls, proxy_errors, probe, relay)
    assert (attribution["by"], attribution["check"]) == (by, check)


def test_termination_outcomes_blame_the_right_side():
    from lego.records import REWARD, TerminationReason
    from lego.verify.grader import TERMINATION_OUTCOME

    policy = {TerminationReason.harness_crash, TerminationReason.patch_too_large, TerminationReason.diff_broken}
    infra = {TerminationReason.harness_failed, TerminationReason.env_setup_failed}
    assert all(REWARD[TERMINATION_OUTCOME[reason]] == 0.0 for reason in policy)
    assert all(REWARD[TERMINATION_OUTCOME[reason]] is None for reason in infra)


# ---------------------------------------------------------------------------------------------- engine leases

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not sys.platform.startswith("linux"),
                                reason="a private dockerd needs root on Linux")

HOLDER = textwrap.dedent("""
    # A lego command holding the work dir's engine: connect, say so, wait for orders, run a container on order.
    import sys, time
    from pathlib import Path
    from lego.sandbox import daemon

    daemon.DEFAULT_SOCKETS = ()
    root, orders, tarball = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    with daemon.docker_engine(root, host="unix:///nonexistent-lego.sock") as engine:
        print("ready", engine.private, engine.owned, flush=True)
        done = set()
        while True:
            for order in sorted(orders.glob("*")):
                if order.name in done:
                    continue
                done.add(order.name)
                if order.name.startswith("run"):
                    try:
                        with open(tarball, "rb") as data:
                            engine.client.api.import_image_from_data(data, repository="lego-lease-probe", tag="t")
                        out = engine.client.containers.run("lego-lease-probe:t", ["/bin/sh", "-c", "echo ran-ok"],
                                                           network_mode="none", remove=True)
                        print(out.decode().strip(), flush=True)
                    except Exception as exc:
                        print("run-failed", type(exc).__name__, exc, flush=True)
                if order.name.startswith("exit"):
                    sys.exit(0)
            time.sleep(0.1)
""")


def tiny_image(path: Path) -> Path:
    """A rootfs with only /bin/sh (dash) and its libraries: enough to run a container, imported in a second."""
    listing = subprocess.run(["ldd", "/bin/dash"], capture_output=True, text=True, check=True).stdout
    libraries = sorted(set(re.findall(r"(/\S+)\s+\(0x", listing)))
    with tarfile.open(path, "w") as tar:
        tar.add(os.path.realpath("/bin/dash"), arcname="bin/sh")
        for library in libraries:
            tar.add(os.path.realpath(library), arcname=library.lstrip("/"))
    return path


class Holder:
    def __init__(self, root: Path, tmp: Path, name: str):
        self.orders = tmp / f"orders-{name}"
        self.orders.mkdir()
        self.output = tmp / f"out-{name}.log"
        script = tmp / "holder.py"
        if not script.exists():
            script.write_text(HOLDER)
        env = {key: value for key, value in os.environ.items() if key != "DOCKER_HOST"}
        self.process = subprocess.Popen([sys.executable, str(script), str(root), str(self.orders),
                                         str(tmp / "tiny.tar")], stdout=open(self.output, "w"),
                                        stderr=subprocess.STDOUT, env=env, cwd=str(tmp))
        self.wait_for("ready")

    def text(self) -> str:
        return self.output.read_text()

    def wait_for(self, word: str, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if word in self.text():
                return self.text()
            if self.process.poll() is not None and word not in self.text():
                break
            time.sleep(0.2)
        raise AssertionError(f"no {word!r} from the holder: {self.text()}")

    def order(self, name: str) -> None:
        (self.orders / name).write_text("")

    def run_container(self) -> str:
        runs = len(re.findall(r"ran-ok|run-failed", self.text()))
        self.order(f"run-{runs}")
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(re.findall(r"ran-ok|run-failed", self.text())) == runs:
            time.sleep(0.2)
        return self.text().strip().splitlines()[-1]

    def exit(self) -> int:
        self.order("exit")
        return self.process.wait(60)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)


def engine_stops(root: Path, within: float) -> bool:
    from lego.sandbox.daemon import PrivateDockerd, ping

    private = PrivateDockerd(root)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if private.running_pid() is None and ping(private.base_url, timeout=1) is None:
            return True
        time.sleep(0.5)
    return False


@pytest.fixture
def lease_root(tmp_path):
    """A work dir's docker root of its own (its own private dockerd), stopped and cleaned up at the end."""
    from lego.sandbox.daemon import PrivateDockerd

    root = tmp_path / "docker"
    tiny_image(tmp_path / "tiny.tar")
    holders: list[Holder] = []
    yield root, holders
    for holder in holders:
        holder.kill()
    PrivateDockerd(root).stop()


@needs_root
def test_a_private_engine_outlives_the_command_that_started_it_while_another_uses_it(lease_root, tmp_path):
    root, holders = lease_root
    first = Holder(root, tmp_path, "first")
    holders.append(first)
    assert "ready True True" in first.text()  # it started the engine
    second = Holder(root, tmp_path, "second")
    holders.append(second)
    assert "ready True False" in second.text()  # it found it running
    assert first.exit() == 0
    assert second.run_container() == "ran-ok", second.text()  # the starter is gone, the engine is not
    assert second.exit() == 0
    assert engine_stops(root, within=40)  # the last holder out stopped it


@needs_root
def test_holders_killed_with_sigkill_do_not_keep_the_engine(lease_root, tmp_path):
    root, holders = lease_root
    first = Holder(root, tmp_path, "first")
    second = Holder(root, tmp_path, "second")
    holders.extend([first, second])
    first.kill()  # SIGKILL: no release, no atexit
    assert second.run_container() == "ran-ok", second.text()
    second.kill()
    assert engine_stops(root, within=45)  # the watchdog found no live holder


@needs_root
def test_docker_up_pins_the_engine_until_docker_down(lease_root, tmp_path):
    root, holders = lease_root
    work = root.parent
    env = {key: value for key, value in os.environ.items() if key != "DOCKER_HOST"}
    lego = [sys.executable, "-m", "lego_cli"] if not Path(sys.executable).with_name("lego").exists() \
        else [str(Path(sys.executable).with_name("lego"))]
    overrides = [f"project.work_dir={work}", "docker.host=unix:///nonexistent-lego.sock"]

    def cli(*args: str) -> str:
        result = subprocess.run([*lego, "docker", *args, "-c", "test", *overrides], capture_output=True, text=True,
                                env=env, timeout=180)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout + result.stderr

    from lego.sandbox.daemon import PrivateDockerd, ping

    cli("up")
    assert PrivateDockerd(root).pinned and PrivateDockerd(root).running_pid()
    holder = Holder(root, tmp_path, "user")
    holders.append(holder)
    assert holder.exit() == 0
    time.sleep(3)  # longer than the watchdog's interval
    assert ping(PrivateDockerd(root).base_url) is not None  # pinned: the last holder out left it up
    holder = Holder(root, tmp_path, "late")
    holders.append(holder)
    said = cli("down")
    assert "still used" in said and ping(PrivateDockerd(root).base_url) is not None  # down leaves it to the user
    assert holder.run_container() == "ran-ok", holder.text()
    assert holder.exit() == 0
    assert engine_stops(root, within=40)
    assert "no private dockerd" in cli("down")


def test_lease_files_of_dead_or_reused_pids_are_pruned(tmp_path):
    from lego.sandbox.daemon import PrivateDockerd

    private = PrivateDockerd(tmp_path / "docker")
    with private.locked():
        mine = private.add_lease()
        dead = subprocess.Popen(["true"])
        dead.wait()
        (private.lease_dir / f"{dead.pid}.0000").write_text(f"{dead.pid} 1\n")
        (private.lease_dir / f"{os.getpid()}.reused").write_text(f"{os.getpid()} 1\n")  # same pid, another process
        (private.lease_dir / "garbage").write_text("not a lease")
        assert private.live_leases() == [mine]
    assert sorted(p.name for p in private.lease_dir.iterdir()) == [mine.name]
    assert private.release(mine) is False and not mine.exists()

