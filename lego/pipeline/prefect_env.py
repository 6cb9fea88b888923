"""Environment for Prefect, set before prefect is imported (Prefect reads its settings from the environment)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from lego.cache import cache_dir, seed_database_from
from lego.child_process import ends_with_parent
from lego.workdir import WorkDir


def configure_prefect_env(work: WorkDir) -> dict[str, str]:
    """Ephemeral API by default, with its database under the work dir; a server when PREFECT_API_URL is set.

    A fresh PREFECT_HOME's first migration takes ~30 s on a small machine, over Prefect's 20 s start timeout.
    """
    defaults = {
        "PREFECT_HOME": str(work.prefect_home),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "false",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    if not os.environ.get("PREFECT_API_URL"):  # the ephemeral API: its database is PREFECT_HOME's
        seed_prefect_database(Path(os.environ["PREFECT_HOME"]))
    return {key: os.environ[key] for key in defaults}


def seed_prefect_database(prefect_home: Path) -> None:
    """A new PREFECT_HOME's database starts as a copy of an empty migrated one from the machine cache (per Prefect
    version): Prefect otherwise runs its whole chain of schema migrations at the first start of the API in every
    new work dir (seconds of CPU and disk syncs). Nothing to do where the database is configured elsewhere."""
    if os.environ.get("PREFECT_API_DATABASE_CONNECTION_URL"):
        return
    seed_database_from(prefect_home / "prefect.db", _empty_database_template, (OSError, subprocess.SubprocessError))


def _empty_database_template() -> Path:
    from importlib.metadata import version

    template = cache_dir("prefect") / f"empty-database-{version('prefect')}.db"
    if not template.is_file():
        with tempfile.TemporaryDirectory(dir=template.parent) as scratch:
            env = {key: value for key, value in os.environ.items() if not key.startswith("PREFECT_")}
            env.update(PREFECT_HOME=scratch, PREFECT_SERVER_ANALYTICS_ENABLED="false")
            subprocess.run([str(Path(sys.executable).parent / "prefect"), "server", "database", "upgrade", "-y"],
                           env=env, check=True, capture_output=True, timeout=600)
            os.replace(Path(scratch) / "prefect.db", template)  # atomic: concurrent builders each put a whole copy
    return template


def launch_prefect_server(work: WorkDir, port: int):
    """`prefect server start` on loopback (with its scheduler), not waited for, and ended when this process ends;
    its log is <work>/logs/prefect-server.log."""
    env = {**os.environ, "PREFECT_HOME": str(work.prefect_home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    seed_prefect_database(work.prefect_home)
    work.logs.mkdir(parents=True, exist_ok=True)
    log = open(work.logs / "prefect-server.log", "ab")
    return subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start", "--host",
                             "127.0.0.1", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=ends_with_parent())


def start_prefect_server(work: WorkDir, port: int, timeout_s: float = 180.0):
    """`launch_prefect_server`, waited for until it answers; sets PREFECT_API_URL."""
    import time
    import urllib.request

    process = launch_prefect_server(work, port)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the Prefect server exited; see {work.logs / 'prefect-server.log'}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    os.environ["PREFECT_API_URL"] = url
                    return process
        except OSError:
            time.sleep(1)
    process.terminate()
    raise RuntimeError(f"the Prefect server did not answer on {url} within {timeout_s:.0f} s")
