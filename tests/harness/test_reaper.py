"""One stuck test fails alone: it never ends or hangs the whole run (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_timed_out_test_that_leaves_a_stubborn_task_fails_alone_and_the_run_goes_on() -> None:
    # Without the reaper this run never ends: pytest-timeout fails the test, then the event
    # loop's close waits forever for the task that ignores every cancel.
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-W",
            "error",
            str(Path(__file__).with_name("stuck_sample.py")),
        ],
        cwd=ROOT,
        env={**os.environ, "TESSERA_TEST_REAP_S": "1"},
        capture_output=True,
        text=True,
        timeout=45,
        check=False,
    )
    summary = run.stdout.strip().splitlines()[-1]
    assert "1 failed, 1 passed, 1 error" in summary, run.stdout[-3000:]
    assert "Timeout (>2.0s) from pytest-timeout" in run.stdout
    assert "1 task(s) still running 1 s after the test" in run.stdout
    assert "stubborn" in run.stdout, "it says where the task is stuck"
