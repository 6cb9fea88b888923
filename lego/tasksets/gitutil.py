"""Git plumbing shared by the bundled-task builder and the task synthesizer.

Commits are made with a fixed author, committer and date so that the same files always give the
same commit hashes (a task's base_commit must not change between builds).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from lego.errors import LegoError

AUTHOR_NAME = "Lego Tasks"
AUTHOR_EMAIL = "tasks@lego.invalid"
_CONFIG = [
    "-c", f"user.name={AUTHOR_NAME}", "-c", f"user.email={AUTHOR_EMAIL}", "-c", "commit.gpgsign=false",
    "-c", "core.autocrlf=false", "-c", "core.fileMode=true", "-c", "init.defaultBranch=main",
    "-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false", "-c", "core.hooksPath=/dev/null",
]


class GitError(LegoError):
    """A git command failed while building or reading a task repository."""


def git(repo: Path, *args: str, date: str | None = None, check: bool = True) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null", GIT_TERMINAL_PROMPT="0")
    if date is not None:
        env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date, GIT_AUTHOR_NAME=AUTHOR_NAME,
                   GIT_AUTHOR_EMAIL=AUTHOR_EMAIL, GIT_COMMITTER_NAME=AUTHOR_NAME,
                   GIT_COMMITTER_EMAIL=AUTHOR_EMAIL)
    proc = subprocess.run(["git", *_CONFIG, *args], cwd=repo, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed in {repo} (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def init_repo(repo: Path) -> None:
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", "main")


def commit_all(repo: Path, message: str, date: str) -> str:
    """Stage everything and commit with the fixed identity; return the commit hash."""
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "--no-verify", "-m", message, date=date)
    return git(repo, "rev-parse", "HEAD").strip()


def diff(repo: Path, paths: list[str] | None = None) -> str:
    """Diff of the work tree against HEAD (new files included) in `git apply` form."""
    git(repo, "add", "-N", "--", *(paths or ["."]))
    args = ["diff", "--no-color", "--no-ext-diff", "--binary", "HEAD", "--"]
    return git(repo, *args, *(paths or []))


def bundle(repo: Path, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    git(repo, "bundle", "create", str(out.resolve()), "--all")
    return out


def clone(source: Path | str, dest: Path, commit: str | None = None) -> Path:
    """Clone a repository or bundle to `dest` and check out `commit` (detached) when given."""
    subprocess.run(["git", "clone", "-q", str(source), str(dest)], check=True, capture_output=True,
                   env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    if commit:
        git(dest, "checkout", "-q", "--detach", commit)
    return dest


def apply_patch(repo: Path, patch: str) -> None:
    """`git apply` a patch to the work tree; raise GitError saying which patch did not apply."""
    if not patch.strip():
        return
    patch_file = repo / ".git" / "lego-apply.patch"
    patch_file.write_text(patch)
    try:
        git(repo, "apply", "--whitespace=nowarn", str(patch_file))
    finally:
        patch_file.unlink(missing_ok=True)
