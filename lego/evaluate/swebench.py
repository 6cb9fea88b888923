"""Real SWE-bench (Verified or Lite), where the Hugging Face hub and an image registry are reachable.

Each instance runs on SWE-bench's published evaluation image (the `image` its row names; the harness's naming rule
otherwise), its repository at /testbed, graded with its own test spec: the test command of the eval script its row
carries (swebench >= 5 publishes `eval_script` and `log_parser` with every instance), on FAIL_TO_PASS and
PASS_TO_PASS. The grader runs pytest (lego.verify.grader), so the instances whose spec runs another test runner
(Django's runtests.py, SymPy's bin/test) are left out, each with the reason.

Guarded: nothing here works offline. `unavailable_reason()` says why it cannot run (the tests skip with it);
every entry point raises SWEBenchUnavailable with that reason and what to do.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from lego.errors import LegoError

DATASETS: dict[str, str] = {"verified": "SWE-bench/SWE-bench_Verified", "lite": "SWE-bench/SWE-bench_Lite"}
REGISTRY_HOST = "registry-1.docker.io"  # where docker pulls swebench/sweb.eval.* from
WORKDIR = "/testbed"
# The instance's conda environment first: its eval script activates `testbed` before running the tests.
TESTBED_PATH = "/opt/miniconda3/envs/testbed/bin:/opt/miniconda3/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
START_MARKER = "Start Test Output"  # the eval script echoes it right before its test command


class SWEBenchUnavailable(LegoError):
    """SWE-bench's dataset or images cannot be reached from here."""


class UnsupportedSpec(LegoError):
    """An instance's test spec runs a test runner the grader does not (it runs pytest)."""


def unavailable_reason(registry_host: str = REGISTRY_HOST) -> str | None:
    """Why real SWE-bench cannot run here (the hub or the registry unreachable), or None."""
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        if os.environ.get(name, "").lower() in ("1", "true", "yes", "on"):
            return f"{name} is set: the Hugging Face hub is off"
    hub = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    for role, host in (("the Hugging Face hub", hub), ("the image registry", registry_host)):
        try:
            socket.getaddrinfo(host, 443)
        except OSError as exc:
            return f"{role} ({host}) is unreachable: {exc}"
    return None


def require_reachable() -> None:
    reason = unavailable_reason()
    if reason is not None:
        raise SWEBenchUnavailable(
            f"real SWE-bench needs the Hugging Face hub and an image registry, and {reason}. Run `lego tasks "
            "swebench` where both are reachable (docs/evaluation.md: Real SWE-bench); the task file it writes and the images "
            "it pulls can then be carried to an offline machine (docker save / docker load)")


def spec_test_command(eval_script: str) -> list[str]:
    """The test command of an instance's eval script: the line after the start-of-output marker."""
    lines = [line.strip() for line in eval_script.splitlines()]
    for index, line in enumerate(lines):
        if START_MARKER in line and index + 1 < len(lines):
            return shlex.split(lines[index + 1])
    raise UnsupportedSpec(f"the eval script has no {START_MARKER!r} marker: not a SWE-bench eval script")


def task_row(instance: Mapping[str, Any], split: str = "eval") -> dict[str, Any]:
    """A Lego task row for a SWE-bench instance, or UnsupportedSpec saying why its spec cannot be graded here."""
    from lego.tasksets.load import swebench_image

    instance_id = str(instance["instance_id"])
    eval_script = instance.get("eval_script")
    if eval_script:
        words = spec_test_command(str(eval_script))
        while words and "=" in words[0] and words[0].split("=", 1)[0].isidentifier():
            words.pop(0)  # VAR=value assignments before the command
        if not (words[:1] == ["pytest"] or (words[1:3] == ["-m", "pytest"] and words[0] in ("python", "python3"))):
            raise UnsupportedSpec(f"{instance_id}: its spec runs {' '.join(words[:3])!r}, not pytest; the grader "
                                  "runs pytest")
    row = {key: instance[key] for key in ("instance_id", "repo", "base_commit", "problem_statement", "patch",
                                          "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS") if key in instance}
    row.update({
        "version": str(instance.get("version") or "0"), "split": split,
        "hints_text": instance.get("hints_text") or "", "created_at": str(instance.get("created_at") or ""),
        "environment_setup_commit": instance.get("environment_setup_commit"),
        "environment": {"kind": "image", "image": instance.get("image") or swebench_image(instance_id),
                        "workdir": WORKDIR},
        "test_command": f"PATH={TESTBED_PATH} python -m pytest -rA -p no:cacheprovider",
        "provenance": {"swebench": {"log_parser": instance.get("log_parser"), "eval_type": instance.get("eval_type"),
                                    "eval_script": eval_script}},
    })
    return row


def write_task_set(instances: Iterable[Mapping[str, Any]], out: Path) -> tuple[Path, dict[str, str]]:
    """The gradable instances as a JSONL task set (tasks.source); returns it and instance id -> why left out."""
    skipped: dict[str, str] = {}
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as handle:
        for instance in instances:
            try:
                handle.write(json.dumps(task_row(instance)) + "\n")
            except UnsupportedSpec as exc:
                skipped[str(instance["instance_id"])] = str(exc)
    return out, skipped


def export_swebench(which: Literal["verified", "lite"], out: Path, *, limit: int | None = None,
                    instance_ids: list[str] | None = None) -> tuple[Path, dict[str, str]]:
    """SWE-bench `which` (its test split) from the hub as a task set at `out`."""
    require_reachable()
    import datasets

    try:
        dataset = datasets.load_dataset(DATASETS[which], split="test")
    except Exception as exc:  # datasets raises many types (ConnectionError, FileNotFoundError ...)
        raise SWEBenchUnavailable(f"could not load {DATASETS[which]} from the hub: {type(exc).__name__}: {exc}") \
            from exc
    rows = [row for row in dataset if not instance_ids or row["instance_id"] in instance_ids]
    return write_task_set(rows[:limit] if limit else rows, out)


def pull_images(client, images: Iterable[str]) -> list[str]:
    """Pull SWE-bench's published images (each instance's environment); returns the pulled names."""
    require_reachable()
    from docker.errors import APIError

    pulled = []
    for image in dict.fromkeys(images):
        try:
            client.images.pull(image)
        except APIError as exc:
            raise SWEBenchUnavailable(f"could not pull {image}: {exc}; check the registry and the image name") \
                from exc
        pulled.append(image)
    return pulled
