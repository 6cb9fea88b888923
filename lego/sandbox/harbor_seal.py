"""The sealed reward channel of Harbor grading: a reward that test.sh's own process wrote, and nothing after it.

test.sh runs the graded code as its own user, so whatever test.sh can write, the graded code can write too; what
differs is *which process* writes and *when*. Harbor reads the reward file after test.sh exits, so a process the
tests left behind can write it after test.sh's check and before test.sh's exit (a background writer won 3 of 15
races against a test.sh that exits at once, and every race against one that does anything after its write). The
seal makes such a write impossible, instead of hard to time:

- The keeper (the sandbox's second uid: the graded code can neither signal, trace nor impersonate it) holds a
  kernel lease on each sealed reward file from a process of its own inside test.sh's PID namespace
  (lego/sandbox/harbor_seal_keeper.py). The kernel makes every open of the file for writing wait until the
  keeper lets it go, whoever opens it and however (a path, a link, /proc/<pid>/fd): the lease is on the inode.
- At each such open (a round) the keeper first moves the inode being opened to its own directory and puts a
  fresh leased one at the path, so only the openers already waiting can ever reach the old inode. Then Lego kills
  every process of the sandbox but test.sh, which is the namespace's init and cannot be killed from inside it,
  and the keeper checks in /proc that none is left. Only then does it let the open through.
- When the open goes through, the only process alive is test.sh, and the old inode can be written only by an
  opener that was waiting for it and is still alive: test.sh, which, blocked in that open, cannot have started
  anything since. Everything that was alive before test.sh's write is dead, so its verdict can be replaced only
  by what test.sh itself runs after it. The reward is the last-written of the inodes, and it counts only if its
  round was clean; a round that could not end with test.sh alone (a kill that did not take, the kernel's lease
  timeout, a keeper that died) leaves the run without a reward (lego.verify.harbor_grading: attributed by a
  control run).

What it cannot seal, stated where it applies (`lego tasks validate`, the evidence, the run summary):
- a test.sh that writes its reward from a process it starts (`python3 grade.py`, `jq ... > reward.json`,
  `tee`): that opener cannot be told from the graded code's; or one that keeps processes of its own running
  across a reward write before its last (the seal would kill them mid-check). A control run, which runs no
  graded code, tells (observe mode: the keeper records who opens and what runs, and kills nothing); such tasks
  keep the channel of before;
- a graded program that makes test.sh's own check pass (an exit hook forcing exit 0, a plugin rewriting the
  report, anything test.sh's user can do to test.sh's own process): test.sh is opaque, its verdict is what it
  computes, and a test.sh that runs the graded code in its own process (`source`, `python3 -c 'import app'` as
  test.sh itself) is that code. Lego's own pytest runner (lego/verify/runner/) closes this for SWE-bench-format
  tasks, not for a foreign test.sh;
- what test.sh itself starts after its verdict (it may run anything, and it is the last word).

Needs from the host kernel: file leases (fs.leases-enable, on by default) and an fs.lease-break-time longer than
a round (45 s by default; a round is given half of it). A round with only test.sh alive costs no kill.
"""

from __future__ import annotations

import json
import threading
import time
from enum import StrEnum
from pathlib import Path

from docker.errors import APIError, DockerException
from pydantic import BaseModel, Field

from lego.errors import LegoError, tail
from lego.sandbox.docker_sandbox import AGENT_USER, KEEPER_USER, DockerSandbox
from lego.sandbox.exec_stream import ExecStream

SEAL_STORE = ".lego-seal"  # in the reward volume's root: the keeper's alone (mode 700): session inodes, manifest
SEAL_MARKER = "LEGO-HARBOR-SEAL:"
MANIFEST = "manifest.jsonl"
KILL_ARGV = ["sh", "-c", "kill -9 -1; kill -9 -1"]  # as the agent: every process it may signal but itself and init
KEEPER_SOURCE = (Path(__file__).parent / "harbor_seal_keeper.py").read_text()


class SealMode(StrEnum):
    seal = "seal"  # kill everything but test.sh at each round (grading)
    observe = "observe"  # record who opens the reward files, kill nothing (a control run: no graded code)


class SealUnavailable(LegoError):
    """The keeper could not start guarding the reward files (no python3 in the image, no file leases)."""


class SealRound(BaseModel):
    """One open (or several at once) of a guarded reward file for writing, as the keeper recorded it."""

    name: str
    round: int
    breakers: list[dict] = Field(default_factory=list)  # who was opening it: pid (1 = test.sh), ppid, cmd
    clean: bool | None = None  # seal mode: only test.sh was alive when the open went through
    reason: str | None = None  # why not clean
    writer: bool | None = None  # seal mode: test.sh was the opener let through
    alive: int | None = None  # observe mode: processes test.sh kept running at this open (the seal kills them)
    alive_sample: list[dict] = Field(default_factory=list)


class SessionFile(BaseModel):
    """One inode a reward path had: a round's (`round` >= 1) or the one at the path at the end (`round` 0)."""

    name: str
    round: int
    written: bool
    mtime_ns: int = 0
    size: int = 0
    data: bytes = b""


class SealedRead(BaseModel):
    """What a sealed reward file resolves to: the data of its last write, or why it cannot be trusted."""

    written: SessionFile | None = None
    untrusted: str | None = None


def parse_manifest(text: str) -> list[SealRound]:
    rounds = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("event") == "round":
            rounds.append(SealRound.model_validate({k: v for k, v in entry.items() if k != "event"}))
    return rounds


def resolve_sealed(name: str, sessions: list[SessionFile], rounds: list[SealRound]) -> SealedRead:
    """The last write of sealed reward file `name`, by modification time: trusted when it is a round's inode and
    that round was clean; a write to the inode left at the path means the lease was gone (the keeper died)."""
    written = [session for session in sessions if session.name == name and session.written]
    if not written:
        return SealedRead()
    last = max(written, key=lambda session: (session.mtime_ns, session.round or 1 << 30))
    if last.round == 0:
        return SealedRead(written=last, untrusted=f"{name} was written outside a round: the keeper's lease on it "
                                                 "was gone (the keeper died) when it was written")
    entry = next((r for r in rounds if r.name == name and r.round == last.round), None)
    if entry is None:
        return SealedRead(written=last, untrusted=f"{name} round {last.round} was written but never recorded "
                                                 "(the keeper died during the round)")
    if not entry.clean:
        return SealedRead(written=last, untrusted=f"{name} round {last.round} was not clean: {entry.reason}")
    return SealedRead(written=last)


class RewardSeal:
    """Lego's side of the seal for one grading sandbox: starts the keeper there before test.sh, kills on its
    requests while test.sh runs, and keeps what it said. The record that counts is the manifest in the volume,
    which the reward holder reads afterwards; this is the keeper's channel to Lego."""

    def __init__(self, sandbox: DockerSandbox, names: list[str], mode: SealMode, logs_mount: str,
                 round_s: float = 20.0):
        self.sandbox = sandbox
        self.config = {"directory": f"{logs_mount}/verifier", "store": f"{logs_mount}/{SEAL_STORE}",
                       "names": list(names), "mode": str(mode), "marker": SEAL_MARKER, "round_s": round_s,
                       "manifest": MANIFEST}
        self.events: list[dict] = []
        self.noise: list[str] = []
        self.kills = 0
        self.kill_errors: list[str] = []
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the keeper and wait until it guards every file; SealUnavailable when it does not."""
        api = self.sandbox.client.api
        try:
            exec_id = api.exec_create(self.sandbox.container.id, ["python3", "-I", "-c", KEEPER_SOURCE,
                                                                  json.dumps(self.config)],
                                      user=KEEPER_USER, workdir="/", stdout=True, stderr=True)["Id"]
            stream = ExecStream(api, exec_id).output()
        except (APIError, DockerException) as exc:
            raise SealUnavailable(f"starting the reward keeper in {self.sandbox.name} failed: {exc}") from exc
        self._thread = threading.Thread(target=self._serve, args=(stream,), daemon=True,
                                        name=f"reward-seal-{self.sandbox.name}")
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.1):
            if not self._thread.is_alive() or time.monotonic() > deadline:
                break
        ready = next((event for event in self.events if event.get("event") == "ready"), None)
        if ready is None:
            said = next((event.get("reason") for event in self.events if event.get("event") == "unavailable"), None)
            raise SealUnavailable(f"the reward keeper in {self.sandbox.name} did not start guarding "
                                  f"{', '.join(self.config['names'])}: "
                                  f"{said or tail(' | '.join(self.noise), 600) or 'no word from it'}")

    def _serve(self, stream) -> None:
        buffer = b""
        try:
            for chunk in stream:
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    self._line(line.decode("utf-8", errors="replace"))
        except Exception as exc:  # the stream breaks when the container goes; nothing is lost that counts
            self.noise.append(f"stream: {type(exc).__name__}: {exc}")
        finally:
            if buffer:
                self._line(buffer.decode("utf-8", errors="replace"))
            self._ready.set()

    def _line(self, line: str) -> None:
        if not line.startswith(SEAL_MARKER):
            if line.strip():
                self.noise.append(line[:500])
            return
        try:
            event = json.loads(line[len(SEAL_MARKER):])
        except ValueError:
            self.noise.append(line[:500])
            return
        self.events.append(event)
        if event.get("event") == "ready":
            self._ready.set()
        elif event.get("event") == "kill":
            self._kill()

    def _kill(self) -> None:
        api = self.sandbox.client.api
        try:
            kill = api.exec_create(self.sandbox.container.id, KILL_ARGV, user=AGENT_USER, workdir="/")["Id"]
            api.exec_start(kill, detach=True)
            self.kills += 1
        except (APIError, DockerException) as exc:  # the keeper asks again, and the round is unclean if none takes
            self.kill_errors.append(tail(str(exc), 300))

    def finish(self, timeout_s: float = 15.0) -> None:
        """After test.sh: the keeper died with it; let its last words arrive."""
        if self._thread is not None:
            self._thread.join(timeout_s)
