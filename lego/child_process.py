"""Servers a command starts for as long as it runs (the Prefect and MLflow servers of `lego deploy` and
`lego server`) and the harnesses a rollout runs beside its sandbox end when that command ends, however it ends.

A command's own cleanup (a `finally` that stops its servers) does not run when it is killed; a server left behind
keeps its port and its scheduler, and keeps launching scheduled runs with nobody serving them. On Linux the child
asks the kernel for SIGTERM when its parent dies (PR_SET_PDEATHSIG), which holds for SIGKILL too.
"""

from __future__ import annotations

import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1
# Looked up in the parent: the function that runs in the child between fork and exec must not import or allocate
# (another thread of the parent may hold a lock the child would wait on forever).
_prctl = None
if sys.platform == "linux":
    try:
        _prctl = ctypes.CDLL(None, use_errno=True).prctl  # the C library the interpreter is linked with
    except (OSError, AttributeError):
        _prctl = None


def _ask_for_sigterm_when_the_parent_dies() -> None:
    _prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def ends_with_parent():
    """`preexec_fn` for subprocess.Popen: the child gets SIGTERM when the thread that started it ends (start it
    from the main thread). None where the kernel has no such request (the child then outlives a killed parent)."""
    return _ask_for_sigterm_when_the_parent_dies if _prctl is not None else None
