"""One directory per project: catalog, MLflow store, Prefect home, checkpoints, artifacts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WorkDir:
    root: Path

    @classmethod
    def create(cls, root: str | Path) -> WorkDir:
        work = cls(Path(root).expanduser().resolve())
        for path in (work.root, work.artifacts, work.checkpoints, work.models, work.mlflow_artifacts,
                     work.prefect_home, work.logs, work.data):
            path.mkdir(parents=True, exist_ok=True)
        return work

    @property
    def catalog(self) -> Path:
        return self.root / "catalog.duckdb"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def mlflow_db(self) -> Path:
        return self.root / "mlflow" / "mlflow.db"

    @property
    def mlflow_artifacts(self) -> Path:
        return self.root / "mlflow" / "artifacts"

    @property
    def mlflow_uri(self) -> str:
        return f"sqlite:///{self.mlflow_db}"

    @property
    def prefect_home(self) -> Path:
        return self.root / "prefect"

    @property
    def docker_root(self) -> Path:
        return self.root / "docker"

    @property
    def logs(self) -> Path:
        return self.root / "logs"
