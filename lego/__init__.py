"""Lego: reinforcement learning for coding agents on the harness they are deployed with."""

from pathlib import Path

__version__ = "0.1.0"

# configs/ and sql/ live beside the package in the repository (installed editable).
REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS_DIR = REPO_ROOT / "configs"
SQL_DIR = REPO_ROOT / "sql"
