"""Code copying (lego/engine/code_copying.py): its rows are real source with copies the loss is on, what it measures
on is never trained on, and the initial checkpoint's cache keys cover it without redoing the copy pretraining it
starts from. Whether it helps the warm start is measured, not tested: docs/benchmarks.md, Learning bench, item 8."""

from __future__ import annotations

import json
import os
import sysconfig
from pathlib import Path

import pytest
from fixtures_model import TINY

from lego.config import CodeCopyingSpec, CopyPretrainingSpec, TinyModelSpec
from lego.engine import checkpoint
from lego.engine.checkpoint import (
    MARKER,
    copy_pretrained_fingerprint,
    init_tiny_model,
    tiny_model_fingerprint,
)
from lego.engine.code_copying import (
    MEASURED_FILE_EVERY,
    CodeCorpusError,
    CodeRows,
    corpus_digest,
    standard_library_files,
)
from lego.engine.tokenizer import load_tokenizer

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def _small_corpus() -> list[Path]:
    return standard_library_files()[:40]


def test_the_corpus_is_the_standard_librarys_own_modules():
    files = standard_library_files()
    parts = {part for path in files for part in path.relative_to(STDLIB).parts[:-1]}
    assert STDLIB / "json" / "decoder.py" in files and STDLIB / "functools.py" in files
    assert not parts & {"test", "site-packages", "idlelib"}  # library code, not its tests or installed packages
    assert corpus_digest(files[:5]) == corpus_digest(files[:5]) != corpus_digest(files[1:6])


def test_a_python_without_its_source_is_told_what_to_do(tmp_path):
    (tmp_path / "only.py").write_text("x = 1\n")
    with pytest.raises(CodeCorpusError, match="model.init.code_copying"):
        standard_library_files(tmp_path)


def test_every_target_is_a_copy_and_measured_files_are_never_trained_on():
    files = _small_corpus()
    tokenizer = load_tokenizer()
    rows = CodeRows(files, tokenizer, seed=0)
    measured = [token for index, path in enumerate(files) if index % MEASURED_FILE_EVERY == 0
                for token in tokenizer.encode(path.read_text(encoding="utf-8", errors="replace"))]
    assert rows.measured == measured and len(rows.train) > 5 * len(rows.measured)
    for ids, targets in (rows.spans(3, 400, 4), rows.spans(2, 256, 3, measured=True)):
        assert targets and ids.shape[1] in (400, 256)
        for row, position in targets:
            tokens = ids[row].tolist()
            # the token a copy predicts: the same (previous, next) pair occurs earlier in the row
            assert any(tokens[index - 1:index + 1] == tokens[position - 1:position + 1] for index in range(1, position))
    again = CodeRows(files, tokenizer, seed=0)
    assert again.spans(2, 300, 3)[0].tolist() == CodeRows(files, tokenizer, seed=0).spans(2, 300, 3)[0].tolist()


def test_code_copying_needs_copy_pretraining():
    with pytest.raises(ValueError, match="enable model.init.copy_pretraining"):
        TinyModelSpec(code_copying=CodeCopyingSpec(enabled=True))
    with pytest.raises(ValueError, match="min_steps"):
        TinyModelSpec(copy_pretraining=CopyPretrainingSpec(enabled=True),
                      code_copying=CodeCopyingSpec(enabled=True, min_steps=10, max_steps=5))


@pytest.fixture
def pretraining_calls(tmp_path, monkeypatch) -> list[int]:
    """Copy pretraining stands in (a test double beside the real run in test_copy_pretraining), the machine's cache
    is under tmp_path and code copying reads a small corpus; the seeds copy pretraining was called with."""
    import lego.engine.code_copying as code_module
    import lego.engine.copy_pretraining as copy_module

    monkeypatch.setattr(checkpoint, "copy_pretrained_cache", lambda fingerprint: tmp_path / "machine" / fingerprint)
    monkeypatch.setattr(code_module, "standard_library_files", lambda root=None: _small_corpus())
    calls: list[int] = []

    def pretend(model, settings, seed, on_progress=None, resume=None):
        calls.append(seed)
        return {"copy_accuracy_long": 0.9}

    monkeypatch.setattr(copy_module, "pretrain_copying", pretend)
    return calls


def test_the_copy_pretrained_model_is_kept_for_the_machine_and_code_copying_keys_only_the_final_one(
        tmp_path, pretraining_calls):
    calls = pretraining_calls
    copied = TinyModelSpec(**TINY, copy_pretraining=CopyPretrainingSpec(enabled=True))
    # before code copying existed, this was the copy-pretrained checkpoint's key: those checkpoints stay valid
    assert copy_pretrained_fingerprint(copied, 0) == tiny_model_fingerprint(copied, 0)
    code = CodeCopyingSpec(enabled=True, min_steps=2, max_steps=3, max_length=256)
    spec = copied.model_copy(update={"code_copying": code})
    other = copied.model_copy(update={"code_copying": code.model_copy(update={"lr": 3e-4})})
    assert copy_pretrained_fingerprint(spec, 0) == copy_pretrained_fingerprint(other, 0) == tiny_model_fingerprint(
        copied, 0)
    assert len({tiny_model_fingerprint(copied, 0), tiny_model_fingerprint(spec, 0), tiny_model_fingerprint(other, 0)}) == 3

    lines: list[str] = []
    first = init_tiny_model(spec, tmp_path / "a" / "model", seed=0, on_progress=lines.append)
    marker = json.loads((first / MARKER).read_text())
    assert marker["fingerprint"] == tiny_model_fingerprint(spec, 0) and marker["copy_accuracy_long"] == 0.9
    assert marker["code_copying_steps"] == 3 and 0 <= marker["code_copying_accuracy"] <= 1
    assert any("code copying done" in line for line in lines)
    cached = tmp_path / "machine" / copy_pretrained_fingerprint(spec, 0)
    assert json.loads((cached / MARKER).read_text())["fingerprint"] == copy_pretrained_fingerprint(spec, 0)
    # another work directory, another code-copying setting: the copy pretraining is not redone
    init_tiny_model(other, tmp_path / "b" / "model", seed=0, on_progress=lines.append)
    assert calls == [0] and any(str(cached) in line for line in lines)
    init_tiny_model(spec, tmp_path / "a" / "model", seed=0)  # its own marker matches: nothing runs
    assert calls == [0]
    # another work directory, the same spec: the code-copied weights come from the machine's copy, not from training
    lines.clear()
    third = init_tiny_model(spec, tmp_path / "c" / "model", seed=0, on_progress=lines.append)
    assert calls == [0] and any("code copying: cached" in line for line in lines)
    assert json.loads((third / MARKER).read_text()) == marker


def test_a_base_shared_by_the_seeds_of_a_bench_is_made_once(tmp_path, pretraining_calls):
    """model.init.seed fixes the initial weights whatever project.seed is: a bench's seeds differ in the warm start
    and RL, and the hour of pretraining runs once."""
    calls = pretraining_calls
    code = CodeCopyingSpec(enabled=True, min_steps=2, max_steps=2, max_length=256)
    own = TinyModelSpec(**TINY, copy_pretraining=CopyPretrainingSpec(enabled=True), code_copying=code)
    shared = own.model_copy(update={"seed": 0})
    assert tiny_model_fingerprint(shared, 1) == tiny_model_fingerprint(shared, 2) == tiny_model_fingerprint(own, 0)
    assert tiny_model_fingerprint(own, 1) != tiny_model_fingerprint(own, 0)
    for project_seed in (1, 2):
        model = init_tiny_model(shared, tmp_path / f"seed-{project_seed}" / "model", seed=project_seed)
        assert json.loads((model / MARKER).read_text())["seed"] == 0
    assert calls == [0]
    weights = [(tmp_path / f"seed-{seed}" / "model" / "model.safetensors").read_bytes() for seed in (1, 2)]
    assert weights[0] == weights[1]


def test_a_base_needed_by_two_processes_at_once_is_made_by_one_while_the_other_waits(tmp_path, pretraining_calls,
                                                                                      monkeypatch):
    """Two makers of one base would train it twice and write one resume point from both: the second waits for the
    first's lock, then reads the machine's copy."""
    import threading

    import lego.engine.copy_pretraining as copy_module

    calls = pretraining_calls
    stand_in = copy_module.pretrain_copying
    entered, release = threading.Event(), threading.Event()

    def slow(*args, **kwargs):
        entered.set()
        assert release.wait(60)
        return stand_in(*args, **kwargs)

    monkeypatch.setattr(copy_module, "pretrain_copying", slow)
    spec = TinyModelSpec(**TINY, copy_pretraining=CopyPretrainingSpec(enabled=True),
                         code_copying=CodeCopyingSpec(enabled=True, min_steps=2, max_steps=2, max_length=256))
    lines = {"first": [], "second": []}
    makers = {name: threading.Thread(target=init_tiny_model, args=(spec, tmp_path / name / "model"),
                                     kwargs={"seed": 0, "on_progress": lines[name].append}) for name in lines}
    makers["first"].start()
    assert entered.wait(60)
    makers["second"].start()
    try:
        _wait_for_the_second(makers, lines, tmp_path)
    finally:
        release.set()
    for maker in makers.values():
        maker.join(120)
        assert not maker.is_alive()
    assert calls == [0]  # trained once
    assert any("code copying: cached" in line for line in lines["second"]), lines["second"]
    assert ((tmp_path / "first" / "model" / "model.safetensors").read_bytes()
            == (tmp_path / "second" / "model" / "model.safetensors").read_bytes())


def _wait_for_the_second(makers, lines, tmp_path) -> None:
    import time

    for _ in range(600):  # up to 30 s for the second maker to reach the lock
        if any("waiting for it" in line for line in lines["second"]) or not makers["second"].is_alive():
            break
        time.sleep(0.05)
    waiting = [line for line in lines["second"] if "waiting for it" in line]
    assert waiting and f"process {os.getpid()} is making {tmp_path / 'machine'}" in waiting[0], lines["second"]
    assert makers["second"].is_alive() and not (tmp_path / "second" / "model").exists()


def test_a_killed_maker_leaves_no_lock_behind(tmp_path):
    """The kernel releases the lock with its process: a maker killed mid-way never blocks the next one."""
    import signal
    import subprocess
    import sys

    cached = tmp_path / "machine" / "base"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom pathlib import Path\nfrom lego.engine.checkpoint import making\n"
        f"with making(Path({str(cached)!r}), None):\n    print('held', flush=True)\n    time.sleep(600)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    finally:
        holder.kill()
    lines: list[str] = []
    with checkpoint.making(cached, lines.append):
        assert (cached.parent / "base.lock").read_text() == f"process {os.getpid()}"
    assert lines == []  # taken at once: no wait said
