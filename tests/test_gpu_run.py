"""scripts/gpu-run, the one command a GPU machine that cannot install anything
runs: it refuses without a GPU, runs every step with a time cap inside its
budget and records each step's outcome; and the profiler recipe it shares with
book/flash/measured_io.md names the tuned kernel that really launches."""
import os
import re
import subprocess
import sys

import pytest
import torch

from bookutils.flash_tuned import _tuned_forward_kernel
from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "gpu-run"

# Stands in for the GPU machine's python3: a GPU is "seen", the tests take PYTEST_S
# seconds, and the benchmark writes the file it is asked to save.
STUB = """#!/usr/bin/env bash
case "$*" in
  *"-m pytest"*) sleep "$PYTEST_S"; echo "3 passed";;
  *"-m bookutils.benchmark"*) echo '{}' > "${@: -1}"; echo "the benchmark's table";;
  *) echo "python 3.12 torch x triton y";;
esac
"""


def _run(tmp_path, budget, pytest_s):
    stub = tmp_path / "python3"
    stub.write_text(STUB)
    stub.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": str(stub), "PYTEST_S": str(pytest_s), "COURSE_COMMIT": "abc1234",
           "PATH": "/usr/bin:/bin"}                                    # no ncu
    proc = subprocess.run(["bash", str(SCRIPT), str(out), str(budget)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    return proc, out


def test_every_step_runs_and_says_how_it_ended(tmp_path):
    proc, out = _run(tmp_path, 540, 0)
    assert proc.returncode == 0, proc.stderr
    log = (out / "run.txt").read_text()
    assert "commit: abc1234" in log and "python 3.12 torch x triton y" in log
    ended = re.findall(r"^== (.+): exit status 0 after \d+s$", log, flags=re.M)
    assert ended == ["tuned kernels' tests", "benchmark d64-noncausal", "benchmark d64-causal",
                     "benchmark d128-noncausal", "benchmark d128-causal"]
    assert sorted(p.name for p in out.iterdir()) == [
        "bench-d128-causal.json", "bench-d128-noncausal.json", "bench-d64-causal.json", "bench-d64-noncausal.json",
        "pytest.txt", "run.txt"]                                   # at most 8 files come back from a lent machine
    assert "3 passed" in (out / "pytest.txt").read_text() and "ncu not found" in log


def test_a_step_past_the_budget_is_stopped_and_the_rest_skipped(tmp_path):
    proc, out = _run(tmp_path, 20, 60)
    assert proc.returncode == 0, proc.stderr
    log = (out / "run.txt").read_text()
    stopped = re.search(r"^== tuned kernels' tests: exit status 124 after (\d+)s, stopped at its limit$", log, re.M)
    # the budget less the seconds the start-up took (bash counts whole seconds), never past it
    assert stopped and 14 <= int(stopped.group(1)) <= 20, log
    assert len(re.findall(r"^== benchmark.*: skipped", log, flags=re.M)) == 4
    assert not list(out.glob("*.json"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_without_a_gpu_it_measures_nothing(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable}, timeout=120)
    assert proc.returncode == 2 and "sees no CUDA GPU" in proc.stderr
    assert list((tmp_path / "out").iterdir()) == [tmp_path / "out" / "run.txt"]


def test_the_profiler_recipe_names_the_kernel_that_launches():
    """A renamed kernel would leave ncu's filter matching nothing: no profile, no error."""
    from bookutils import profile_tuned

    kernel = _tuned_forward_kernel
    while hasattr(kernel, "fn"):                 # autotuner, heuristics, jit: down to the Python function
        kernel = kernel.fn
    for text in (SCRIPT.read_text(), (REPO / "book" / "flash" / "measured_io.md").read_text(), profile_tuned.__doc__):
        assert re.findall(r"--kernel-name regex:(\w+)", text) == [kernel.__name__]
        assert "-m bookutils.profile_tuned" in text
