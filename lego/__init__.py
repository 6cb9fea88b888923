"""Lego: reinforcement learning for coding agents on the harness they are deployed with."""

import os
from pathlib import Path

# MLflow's client starts a telemetry thread that, offline, gives up and removes an environment variable while the
# main thread's requests to the tracking server read the environment: a KeyError that fails the request ("API
# request ... failed with exception '_MLFLOW_TELEMETRY_SESSION_ID'"). Lego sends no telemetry; set before any import
# of mlflow, which reads it once. A user's own setting wins.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

__version__ = "0.1.0"

# configs/ and sql/ live beside the package in the repository (installed editable).
REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS_DIR = REPO_ROOT / "configs"
SQL_DIR = REPO_ROOT / "sql"
