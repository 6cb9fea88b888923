

from lego.harness.base import HarnessAdapter, HarnessSpec, get_harness, harness_names
from lego.harness.install import ensure_installed, is_installed

__all__ = ["HarnessAdapter", "HarnessSpec", "ensure_installed", "get_harness", "harness_names", "is_installed"]
