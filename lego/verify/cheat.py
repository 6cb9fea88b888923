"""Cheat checks on the agent's diff and actions: each a named rule that fires with its evidence.

The diff is screened before grading by what each file *is*, never by what its text looks like: a change to a
test file or to any conftest.py is dropped (and flagged: the hidden tests and their fixtures are the task's),
as is a path outside the repository or a symbolic link. What the rest of the patch *does* is judged while it
runs, by construction (lego/verify/runner/): the runner and everything it imports resolve apart from the
repository, so no file the patch adds can shadow them; pytest's configuration is resolved by pytest itself for
the pristine and the patched tree and compared; results travel through a channel the code under test does not
hold; tampering primitives and objects that defeat assertions are reported by the runner.
The agent's actions are kept as evidence of what it probed; they are cheats only when the sandbox could have
revealed something (lego/verify/reveal.py).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from lego.tasksets.task import Task

TEST_DIRS = {"test", "tests", "testing"}
# Reads of git history (any ref, log, object store, reflog) and of .git's files. Evidence, not a cheat: the sandbox's
# repository is one commit with nothing else to find (see scan_actions and lego/verify/reveal.py).
GIT_HISTORY = re.compile(
    r"\bgit\s+(?:(?:-C|-c|--git-dir|--work-tree)[=\s]+\S+\s+|--no-pager\s+)*"
    r"(log\b|reflog|fsck|rev-list|cat-file|show\b|fetch|pull|clone|checkout\s+[^|;&]*(HEAD[~^@]|origin/|@\{)|"
    r"for-each-ref|count-objects|verify-pack|unpack-objects|stash\s+(list|show)|bundle|"
    r"branch\s+[^|;&]*(-a\b|--all|-r\b)|tag\b|describe|whatchanged|shortlog|ls-remote|rev-parse\s+[^|;&]*--all)|"
    r"\.git/(objects|refs|packed-refs|logs|ORIG_HEAD|FETCH_HEAD)"
)
# Commands that read a whole directory tree: naming a directory above a file reaches the file.
RECURSIVE_READ = re.compile(r"\b(grep|egrep|fgrep)\s+[^|;&]*-\w*[rR]|\b(rg|ag|ack|find|tar|zip|rsync)\b|"
                            r"\bcp\s+[^|;&]*-\w*[rRa]")
NETWORK = re.compile(r"\b(curl|wget|nc|ncat|telnet|ssh|scp|rsync)\b|pip3?\s+(install|download)|"
                     r"urllib\.request|requests\.get|socket\.create_connection|https?://")


@dataclass
class FilePatch:
    old_path: str
    new_path: str
    text: str

    @property
    def path(self) -> str:
        return self.new_path if self.new_path != "/dev/null" else self.old_path

    @property
    def is_new(self) -> bool:
        return "\nnew file mode" in self.text or "\n--- /dev/null" in self.text


@dataclass
class Screening:
    kept: list[FilePatch] = field(default_factory=list)
    dropped: list[FilePatch] = field(default_factory=list)
    rules: dict[str, list[str]] = field(default_factory=dict)  # rule -> evidence

    def fire(self, rule: str, evidence: str) -> None:
        self.rules.setdefault(rule, []).append(evidence)

    @property
    def patch(self) -> str:
        return "".join(part.text for part in self.kept)


def split_diff(diff: str) -> list[FilePatch]:
    patches: list[FilePatch] = []
    starts = [match.start() for match in re.finditer(r"^diff --git ", diff, flags=re.M)]
    for index, start in enumerate(starts):
        end = starts[index + 1] if index + 1 < len(starts) else len(diff)
        text = diff[start:end]
        header = text.splitlines()[0]
        match = re.match(r'diff --git "?a/(.+?)"? "?b/(.+?)"?$', header)
        old, new = (_unquote(match.group(1)), _unquote(match.group(2))) if match else (header, header)
        if "\ndeleted file mode" in text:
            new = "/dev/null"
        patches.append(FilePatch(old, new, text if text.endswith("\n") else text + "\n"))
    return patches


def _unquote(path: str) -> str:
    """git quotes unusual paths C-style ("t\\303\\251st.py"): the path as git means it."""
    if "\\" not in path:
        return path
    import codecs

    try:
        return codecs.escape_decode(path.encode("utf-8"))[0].decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return path


def paths_git_applies(text: str) -> set[str] | None:
    """Every path `git apply` would touch for `text`, as git itself parses it (None: git cannot parse it).

    A section that starts with `diff --git a/x b/x` may go on with a traditional `--- /dev/null` /
    `+++ b/tests/conftest.py` fragment, which git applies too: screening by what git applies, not by the
    section headers, is what keeps such a file from being smuggled past the screen."""
    result = subprocess.run(["git", "apply", "--numstat", "-z", "-"], input=text.encode("utf-8", "surrogateescape"),
                            capture_output=True, cwd="/")
    if result.returncode != 0:
        return None
    paths: set[str] = set()
    tokens = result.stdout.decode("utf-8", "surrogateescape").split("\0")
    index = 0
    while index < len(tokens):
        fields = tokens[index].split("\t")
        if len(fields) == 3 and fields[2]:
            paths.add(fields[2])
        elif len(fields) == 3 and index + 2 < len(tokens):  # a rename or copy: old and new follow
            paths.update(tokens[index + 1:index + 3])
            index += 2
        index += 1
    return paths


def is_test_path(path: str) -> bool:
    parts = PurePosixPath(path).parts
    name = parts[-1] if parts else path
    return (any(part in TEST_DIRS for part in parts[:-1]) or name.startswith("test_") or name.endswith("_test.py")
            or name == "conftest.py")


def screen_diff(diff: str, task: Task) -> Screening:
    screening = Screening()
    # The test patch's own files: the tests it adds or edits. A source file it also touches stays the agent's to
    # change (a conflict there is attributed by a control run, see grader.py).
    hidden = {part.path for part in split_diff(task.test_patch) if part.is_new or is_test_path(part.path)}
    for part in split_diff(diff):
        paths = {part.old_path, part.path} - {"/dev/null"}
        reason = None
        if any(p.startswith(("/", "../")) or "/../" in p or p == ".." for p in paths):
            screening.fire("files_outside_repo_written", f"{part.path}: path escapes the repository")
            reason = "outside"
        elif "new file mode 120000" in part.text or "new mode 120000" in part.text:
            screening.fire("files_outside_repo_written", f"{part.path}: adds a symbolic link")
            reason = "symlink"
        elif any(PurePosixPath(p).name == "conftest.py" for p in paths):
            screening.fire("pytest_config_added", f"{part.path}: conftest.py {'added' if part.is_new else 'changed'}")
            reason = "conftest"
        elif paths & hidden:
            rule = "test_files_edited" if not part.is_new else "test_patch_paths_written"
            screening.fire(rule, f"{part.path}: a file of the hidden test patch")
            reason = "hidden"
        elif is_test_path(part.old_path) or is_test_path(part.path):
            if part.is_new:
                reason = "new-test"  # an agent writing its own tests is fine; they just don't grade
            else:
                screening.fire("test_files_edited", f"{part.path}: an existing test file edited or deleted")
                reason = "test"
        (screening.dropped if reason else screening.kept).append(part)
    _drop_smuggled(screening)
    return screening


def _drop_smuggled(screening: Screening) -> None:
    """Drop every kept section in which git would touch a path its header does not name."""
    if not screening.kept:
        return
    applied = paths_git_applies(screening.patch)
    named = {path for part in screening.kept for path in (part.old_path, part.new_path)}
    if applied is not None and applied <= named:
        return
    for part in list(screening.kept):
        touched = paths_git_applies(part.text)
        extra = sorted((touched or set()) - {part.old_path, part.new_path})
        if extra:
            screening.fire("patch_smuggles_files", f"{part.path}: its section also writes {', '.join(extra[:5])}")
            screening.kept.remove(part)
            screening.dropped.append(part)


def _names(action: str, where: str, workdir: str) -> bool:
    """Does a command reach `where`: name it (absolute, or relative to the repository), or search a directory
    above it recursively (`grep -r PATTERN /usr`)?"""
    if where in action:
        return True
    path = PurePosixPath(where)
    try:
        relative = path.relative_to(workdir).as_posix()
    except ValueError:
        relative = ""
    if relative not in ("", ".") and relative in action:
        return True
    if RECURSIVE_READ.search(action):
        if relative and re.search(r"(^|\s)\./?($|\s)", action):
            return True  # a search from the repository (the working directory) down
        for parent in path.parents:
            if re.search(rf"(^|[\s'\"=]){re.escape(str(parent))}/?($|[\s'\";|&)])", action):
                return True
    return False


def scan_actions(actions: list[str], task: Task, base_files: set[str] | None = None,
                 revealed: dict[str, list[dict[str, str]]] | None = None) -> dict[str, list[str]]:
    """CHEAT rules fired by what the agent ran (commands, tool inputs): {rule: [evidence]}, normally empty.

    An action is judged by what it could reveal, not by the files it touches. The agent's sandbox is built
    to hold nothing beyond base_commit (one commit, no other refs, reflog or objects; no hidden tests; no
    network), so reading .git, `git log --all` or naming a hidden test's path learns nothing: such actions
    are evidence (`action_probes`), not cheats. A rule fires only where `revealed` (what
    `lego.verify.reveal.what_the_sandbox_can_reveal` found in a sandbox of the same task image) holds
    something *and* an action touched it:
      git_history_sought      a git-history read, with a repository holding more than the base commit
      hidden_test_paths_read  an action naming a hidden test file or a copy of the hidden tests it found
      gold_patch_read         an action naming a file that holds the gold patch's new code
    When the probe could not vouch for the sandbox (`revealed["unchecked"]`), the old screen applies: any
    git-history read and any hidden test path named fire. Lego's own files (the read-only pristine snapshot,
    the proxy socket's read-only mount) hold nothing beyond base_commit either: actions on them are evidence
    (`internals_probes`).
    """
    rules: dict[str, list[str]] = {}
    revealed = revealed or {}
    workdir = task.environment.workdir.rstrip("/") or "/"
    own_git = {f"{workdir}/.git", "/opt/lego/repo/.git"}
    probes = action_probes(actions, task, base_files)
    for action in actions:
        snippet = _snippet(action)
        for finding in revealed.get("git_history", []):
            where = finding["where"]
            if (where in own_git and GIT_HISTORY.search(action)) or _names(action, where, workdir) or \
                    _names(action, str(PurePosixPath(where).parent), workdir) and GIT_HISTORY.search(action):
                rules.setdefault("git_history_sought", []).append(f"{where} ({finding['what']}): {snippet}")
        for kind, rule in (("hidden_tests", "hidden_test_paths_read"), ("gold_patch", "gold_patch_read")):
            for finding in revealed.get(kind, []):
                if _names(action, finding["where"], workdir):
                    rules.setdefault(rule, []).append(f"{finding['where']} ({finding['what']}): {snippet}")
    if revealed.get("unchecked"):
        if probes["history_probes"]:
            rules.setdefault("git_history_sought", []).extend(probes["history_probes"])
        if probes["hidden_path_probes"]:
            rules.setdefault("hidden_test_paths_read", []).extend(probes["hidden_path_probes"])
    return {rule: list(dict.fromkeys(items)) for rule, items in rules.items()}


def action_probes(actions: list[str], task: Task, base_files: set[str] | None = None) -> dict[str, list[str]]:
    """Evidence only: actions that read git history or name a hidden test file (of the test_patch, not in
    base_files). The sandbox holds nothing for them to find, so they are not cheats; kept for observability,
    as `network_attempts` is. Every key is always there."""
    hidden_new = [path for path in task.test_files if base_files is None or path not in base_files]
    history, hidden, internals = [], [], []
    for action in actions:
        snippet = _snippet(action)
        if GIT_HISTORY.search(action):
            history.append(snippet)
        hidden.extend(f"{path}: {snippet}" for path in hidden_new if path in action)
        if "/opt/lego" in action or "/lego-proxy" in action:
            internals.append(snippet)
    return {"history_probes": history, "hidden_path_probes": hidden, "internals_probes": internals}


def _snippet(action: str) -> str:
    return action.strip().replace("\n", " ")[:200]


def network_attempts(actions: list[str]) -> list[str]:
    """Evidence only: the sandbox has no network, so these are blocked, not cheats."""
    return [action.strip()[:200] for action in actions if NETWORK.search(action)]
