"""lego/sandbox/exec_stream.py for the runner scripts here, which a harness's own venv Python runs without lego on
its path: loaded by the file's path. `from sandbox_exec import exec_stream` (a script's directory is on sys.path)."""

import importlib.util
from pathlib import Path

_LOCATION = Path(__file__).resolve().parents[2] / "sandbox" / "exec_stream.py"
_SPEC = importlib.util.spec_from_file_location("lego_exec_stream", _LOCATION)
exec_stream = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(exec_stream)
