"""ManagedProcess: a stopped process leaves no log file behind, and its output stays readable."""

from __future__ import annotations

import sys

import pytest

from gatewayscope.sandbox.processes import ManagedProcess
from tests.helpers import wait_for

#: every test here starts a process (make e2e runs them)
pytestmark = pytest.mark.e2e


def test_stop_removes_the_log_file_and_keeps_the_output() -> None:
    process = ManagedProcess("echo", [sys.executable, "-c",
                                      "import sys, time; print('ready', flush=True); time.sleep(60)"])
    try:
        wait_for("the child's first line", process.output, lambda out: "ready" in out)
        assert process.log_path.exists()
    finally:
        process.stop()
    assert not process.running()
    assert not process.log_path.exists()
    assert process.output().strip() == "ready"
    process.stop()  # twice is fine, and the output stays
    assert process.output().strip() == "ready"


def test_only_the_tail_of_a_long_output_is_kept() -> None:
    process = ManagedProcess("chatty", [sys.executable, "-c", "print('x' * 5000 + 'END')"])
    process.KEPT_OUTPUT_BYTES = 100
    wait_for("the child's exit", process.running, lambda running: not running)
    process.stop()
    assert process.output().rstrip().endswith("END") and len(process.output()) <= 100
