"""Environment for Prefect, set before prefect is imported (Prefect reads its settings from the environment)."""

from __future__ import annotations

import os

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
    return {key: os.environ[key] for key in defaults}
