"""What an agent sandbox could reveal beyond base_commit: checking the construction, not the agent.

A task image is built so that there is nothing to find (lego/sandbox/task_image.py): the repository is a
single commit whose tree is base_commit's, with no other refs, reflog or objects; the hidden tests are not
in it; there is no network. An agent that reads .git, runs `git log`, or names a hidden test's path then
learns nothing, and that must not cost it its reward. What can cost a reward is a sandbox that does hold
something (a leak in the construction) *and* an agent whose actions touched it: `what_the_sandbox_can_reveal`
finds the leaks, and `lego.verify.cheat.scan_actions` turns an action into a cheat only when it touched one.

The probe runs inside the sandbox as the agent's user (so it sees exactly what the agent could read) and is
sent no secret: the gold patch and the hidden tests travel only as CRC-32s of their lines, and files that
match are fetched and compared here.
"""

from __future__ import annotations

import base64
import json
import shlex
import zlib
from dataclasses import dataclass
from typing import Any

from lego.errors import tail
from lego.sandbox import SNAPSHOT
from lego.tasksets.task import Task

KINDS = ("git_history", "hidden_tests", "gold_patch", "unchecked")
_MAX_LINES = 2500  # CRCs sent per patch: the probe's argument stays under Linux's 128 KiB per argument
_MAX_CONFIRM = 40  # candidate files fetched and compared here at most
_MAX_FILE = 4 << 20  # larger files are not read (neither by the probe nor here)


@dataclass
class Hunk:
    """The new side of one hunk of a patch: what a file looks like after it (blank lines left out)."""

    path: str
    lines: list[str]  # stripped, non-blank


def new_side_hunks(patch: str) -> list[Hunk]:
    """The new sides of a patch's hunks that add something, stripped; short lone lines are left out
    (a one-line `return a + b` is in the standard library too)."""
    hunks: list[Hunk] = []
    path = ""
    current: list[str] | None = None
    added = False

    def close() -> None:
        if current is not None and added and current:
            if len(current) >= 2 or len(current[0]) >= 24:
                hunks.append(Hunk(path, list(current)))

    for line in patch.splitlines():
        if line.startswith("diff --git "):
            close()
            current, added = None, False
            parts = line.split()
            path = parts[3][2:] if len(parts) >= 4 and parts[3].startswith("b/") else (parts[-1] if parts else "")
        elif line.startswith("@@"):
            close()
            current, added = [], False
        elif current is None:
            continue  # the file's header: index, mode, ---/+++ lines
        elif line.startswith("+"):
            if line[1:].strip():
                current.append(line[1:].strip())
                added = True
        elif line.startswith(" "):
            if line[1:].strip():
                current.append(line[1:].strip())
        elif line.startswith("\\"):
            continue
        elif not line.startswith("-"):
            close()
            current, added = None, False
    close()
    return hunks


def new_files(patch: str) -> list[str]:
    """Paths a patch creates."""
    files = []
    for part in patch.split("diff --git ")[1:]:
        head = part.split("\n@@", 1)[0]
        if "\nnew file mode" in head or "\n--- /dev/null" in head:
            for line in head.splitlines():
                if line.startswith("+++ "):
                    target = line[4:].strip()
                    files.append(target[2:] if target.startswith("b/") else target)
    return files


def _budget(hunks: list[Hunk]) -> tuple[list[Hunk], int]:
    """The hunks whose lines fit in the probe's argument, and how many were left out."""
    kept, lines = [], 0
    for hunk in hunks:
        if lines + len(hunk.lines) > _MAX_LINES:
            break
        kept.append(hunk)
        lines += len(hunk.lines)
    return kept, len(hunks) - len(kept)


def _crc(line: str) -> int:
    return zlib.crc32(line.encode("utf-8", "surrogateescape"))


# Runs in the sandbox with python3: git facts for every git repository it can see, and the files whose lines
# hold every line of some hunk (by CRC-32). Reads what the agent could read, writes nothing.
PROBE = r'''
import json, os, subprocess, sys, zlib, base64
from itertools import repeat
spec = json.loads(base64.b64decode(sys.argv[1]))
workdir, snapshot, max_file = spec["workdir"].rstrip("/") or "/", spec["snapshot"], spec["max_file"]
blocks = {kind: [set(block) for block in value] for kind, value in spec["blocks"].items()}
wanted = set().union(*[b for value in blocks.values() for b in value]) if any(blocks.values()) else set()
skip = {"/proc", "/sys", "/dev"}
trees = {workdir, snapshot}  # base_commit's tree: its content is no leak; their .git dirs are checked below
out = {"git": {}, "candidates": {}, "files": {}, "stray": [], "errors": []}

def git(gitdir, *args):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": "/dev/null", "LC_ALL": "C", "GIT_OPTIONAL_LOCKS": "0"}
    proc = subprocess.run(["git", "-c", "safe.directory=*", "--git-dir=" + gitdir, *args], capture_output=True,
                          env=env, timeout=120)
    return proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")

def check_git(gitdir):
    facts = {}
    code, text, err = git(gitdir, "rev-list", "--all", "--reflog")
    facts["commits"] = len(text.split()) if code == 0 else None
    if code != 0:
        facts["error"] = tail(err.strip())
    code, text, _ = git(gitdir, "for-each-ref", "--format=%(refname)")
    facts["refs"] = text.split() if code == 0 else None
    reflogs = []
    for root, _, names in os.walk(os.path.join(gitdir, "logs")):
        for name in names:
            path = os.path.join(root, name)
            try:
                if os.path.getsize(path) > 0:
                    reflogs.append(os.path.relpath(path, gitdir))
            except OSError:
                pass
    facts["reflogs"] = reflogs
    code_all, every, _ = git(gitdir, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)")
    code_reach, reachable, _ = git(gitdir, "rev-list", "--objects", "--all", "--reflog", "--indexed-objects")
    if code_all == 0 and code_reach == 0:
        reach = {line.split()[0] for line in reachable.splitlines() if line.strip()}
        facts["extra_objects"] = len(set(every.split()) - reach)
    else:
        facts["extra_objects"] = None
    alternates = os.path.join(gitdir, "objects", "info", "alternates")
    facts["alternates"] = open(alternates, errors="replace").read().split() if os.path.isfile(alternates) else []
    return facts

def is_git_dir(path, names):
    return os.path.basename(path) == ".git" or ("HEAD" in names and "objects" in names and "refs" in names)

def under(path, roots):
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)

gitdirs = []
for root, dirs, files in os.walk("/"):
    if root in skip:
        dirs[:] = []
        continue
    dirs[:] = sorted(d for d in dirs if os.path.join(root, d) not in skip)
    if is_git_dir(root, set(dirs) | set(files)):
        gitdirs.append(root)
    in_git = any(under(root, [g]) for g in gitdirs)
    for name in files:
        path = os.path.join(root, name)
        if not in_git and (name.endswith((".pack", ".bundle")) or name == "packed-refs"):
            out["stray"].append(path)
        if not wanted or (under(path, trees) and not in_git):
            continue
        try:
            if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > max_file:
                continue
            with open(path, "rb") as handle:
                data = handle.read(8192)
                if b"\0" in data:
                    continue  # binary
                data += handle.read()
        except OSError:
            continue
        # C-level maps only (this reads every text file): stripped lines, and the same with a leading "+"
        # dropped, for a copy of the patch itself.
        lines = set(map(bytes.strip, data.split(b"\n")))
        lines |= set(map(bytes.lstrip, lines, repeat(b"+ ")))
        seen = wanted.intersection(map(zlib.crc32, lines))
        if not seen:
            continue
        for kind, value in blocks.items():
            hits = [index for index, block in enumerate(value) if block <= seen]
            if hits:
                out["candidates"].setdefault(path, {})[kind] = hits
for gitdir in gitdirs:
    try:
        out["git"][gitdir] = check_git(gitdir)
    except Exception as exc:
        out["errors"].append(f"{gitdir}: {type(exc).__name__}: {exc}")
for relative in spec["new_test_files"]:
    for tree in sorted(trees):
        path = os.path.join(tree, relative)
        if os.path.lexists(path):
            out["files"][path] = relative
print("LEGO_REVEAL=" + json.dumps(out))
'''


def _sequence_in(needle: list[str], haystack: list[str]) -> bool:
    if not needle:
        return False
    first = needle[0]
    return any(haystack[i:i + len(needle)] == needle
               for i, line in enumerate(haystack[:len(haystack) - len(needle) + 1]) if line == first)


def _git_findings(gitdir: str, facts: dict[str, Any], own: bool) -> list[str]:
    """What a git repository holds beyond one commit (own: the task repository or its snapshot)."""
    found = []
    if facts.get("error"):
        found.append(f"git cannot read it: {facts['error']}")
    if facts.get("commits") not in (None, 1 if own else 0):
        found.append(f"{facts['commits']} commits reachable from its refs and reflog"
                     + (" (the task repository has one)" if own else ""))
    refs = facts.get("refs") or []
    heads = [ref for ref in refs if ref.startswith("refs/heads/")]
    others = [ref for ref in refs if not ref.startswith("refs/heads/")] + (heads[1:] if own else heads)
    if others:
        found.append("refs besides the one branch: " + ", ".join(others[:10]))
    if facts.get("reflogs"):
        found.append("reflog entries: " + ", ".join(facts["reflogs"][:10]))
    if facts.get("extra_objects"):
        found.append(f"{facts['extra_objects']} objects not reachable from the base commit")
    for alternate in facts.get("alternates") or []:
        if not alternate.startswith(f"{SNAPSHOT}/.git/objects"):
            found.append(f"borrows objects from {alternate}")
    return found


def what_the_sandbox_can_reveal(sandbox: Any, task: Task) -> dict[str, list[dict[str, str]]]:
    """Anything the sandbox holds beyond base_commit that its agent could read; {} when there is nothing.

    Keys (present only when something was found), each a list of {"where": path, "what": why}:
      git_history   a git repository with commits, refs, reflog or objects other than the single base commit
                    (where: the git directory; the task repository's own .git and its snapshot's included)
      hidden_tests  a file the hidden test_patch creates, present in the repository; or a file outside
                    base_commit's tree holding the test_patch's new code
      gold_patch    a file outside base_commit's tree holding the gold patch's new code (a copy of the fix)
      unchecked     the probe could not run or read something (what it says), so nothing is vouched for
    Run it on a freshly opened sandbox (the agent's, before the agent starts, or a verifier's from the same
    task image): it reads as the agent's user and writes nothing. Never while an agent runs there: the line
    CRCs on the probe's command line would let it check guesses of the fix.
    """
    workdir = task.environment.workdir.rstrip("/") or "/"
    found: dict[str, list[dict[str, str]]] = {}

    def add(kind: str, where: str, what: str) -> None:
        found.setdefault(kind, []).append({"where": where, "what": what})

    gold, hidden = _budget(new_side_hunks(task.patch)), _budget(new_side_hunks(task.test_patch))
    for label, (_, left_out) in (("gold patch", gold), ("hidden test_patch", hidden)):
        if left_out:
            add("unchecked", "sandbox", f"{left_out} hunk(s) of the {label} not looked for (too large)")
    gold, hidden = gold[0], hidden[0]
    spec = {"workdir": workdir, "snapshot": SNAPSHOT, "max_file": _MAX_FILE,
            "new_test_files": new_files(task.test_patch),
            "blocks": {"gold_patch": [[_crc(line) for line in hunk.lines] for hunk in gold],
                       "hidden_tests": [[_crc(line) for line in hunk.lines] for hunk in hidden]}}
    payload = base64.b64encode(json.dumps(spec).encode()).decode()
    result = sandbox.exec(f"python3 -c {shlex.quote(PROBE)} {payload}", timeout=300, workdir="/",
                          output_limit=16 << 20)
    marker = next((line for line in result.output.splitlines() if line.startswith("LEGO_REVEAL=")), None)
    if result.exit_code != 0 or marker is None:
        add("unchecked", "sandbox", f"the probe failed (exit {result.exit_code}): {tail(result.output.strip())}")
        return found
    probe = json.loads(marker[len("LEGO_REVEAL="):])
    own = {f"{workdir.rstrip('/')}/.git", f"{SNAPSHOT}/.git"}
    for gitdir, facts in sorted(probe["git"].items()):
        for what in _git_findings(gitdir, facts, gitdir in own):
            add("git_history", gitdir, what)
    for path in probe["stray"]:
        add("git_history", path, "git data outside any repository (a pack, bundle or packed-refs)")
    for path, relative in sorted(probe["files"].items()):
        add("hidden_tests", path, f"{relative} is a file the hidden test_patch creates")
    for error in probe["errors"]:
        add("unchecked", "sandbox", error)
    hunks = {"gold_patch": gold, "hidden_tests": hidden}
    for count, (path, kinds) in enumerate(sorted(probe["candidates"].items())):
        if count >= _MAX_CONFIRM:
            add("unchecked", path, f"{len(probe['candidates']) - _MAX_CONFIRM} more candidate files not compared")
            break
        fetched = sandbox.exec(f"base64 -w0 {shlex.quote(path)}", timeout=60, workdir="/", output_limit=_MAX_FILE * 2)
        if fetched.exit_code != 0:
            add("unchecked", path, "matched by CRC but could not be read back")
            continue
        text = base64.b64decode(fetched.output).decode("utf-8", "replace")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        # ... or as a patch: its new side (context and added lines, the removed ones left out).
        new_side = [line[1:].strip() for line in text.splitlines() if line[:1] in ("+", " ") and line[1:].strip()]
        for kind, indexes in sorted(kinds.items()):
            matching = [hunks[kind][index] for index in indexes
                        if _sequence_in(hunks[kind][index].lines, lines)
                        or _sequence_in(hunks[kind][index].lines, new_side)]
            if matching:
                label = "the gold patch's" if kind == "gold_patch" else "the hidden test_patch's"
                files = sorted({hunk.path for hunk in matching})
                add(kind, path, f"holds {label} new code of {', '.join(files)} ({len(matching)} hunk(s))")
    return found



_BY_IMAGE: dict[tuple[str, str, int], dict[str, list[dict[str, str]]]] = {}


def what_the_image_can_reveal(sandbox: Any, task: Task, image: str) -> dict[str, list[dict[str, str]]]:
    """`what_the_sandbox_can_reveal` for a sandbox freshly opened from `image`, probed once per image and task
    in this process (what a fresh sandbox holds depends on nothing else). Probe failures are not kept."""
    key = (image, task.instance_id, zlib.crc32(f"{task.patch}\0{task.test_patch}".encode("utf-8", "surrogateescape")))
    if key not in _BY_IMAGE:
        found = what_the_sandbox_can_reveal(sandbox, task)
        if "unchecked" in found:
            return found
        _BY_IMAGE[key] = found
    return _BY_IMAGE[key]
