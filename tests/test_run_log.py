"""`lego run`'s log file: what child processes write raw to the run's stdout and stderr reaches it as plain lines,
in order with the lines the run echoes."""

from __future__ import annotations

import subprocess
import sys

from lego_cli.run_output import run_output

CHILD = r"""
import sys, time
sys.stdout.write("\x1b[32mgreen\x1b[0m text\n")
for percent in (0, 50, 100):
    sys.stdout.write(f"\rdownloading {percent}%")
    sys.stdout.flush()
sys.stdout.write("\n\x1b[1")  # an escape sequence split between two writes
sys.stdout.flush()
time.sleep(0.2)
sys.stdout.write("mbold\x1b[0m\n")
sys.stderr.write("a warning\x07 on stderr\n")
"""


def test_child_output_reaches_the_log_plain_and_before_the_next_echoed_line(tmp_path):
    log_path = tmp_path / "run.log"
    with run_output(log_path, "lego.test-run-log") as output:
        output.echo("stage one")
        subprocess.run([sys.executable, "-c", CHILD], check=True)
        print("a library's print", flush=True)
        output.echo("summary: done")
    text = log_path.read_text()
    assert "\x1b" not in text and "\r" not in text and "\x07" not in text and "\x00" not in text
    lines = text.splitlines()
    for line in ("stage one", "green text", "downloading 0%", "downloading 50%", "downloading 100%", "bold",
                 "a warning on stderr", "a library's print"):
        assert line in lines, (line, lines)
    assert lines[-1] == "summary: done"
    assert lines.index("stage one") < lines.index("green text") < lines.index("summary: done")
