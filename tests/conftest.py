import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # autograde, and tests.* helpers

# Notebook kernels must pick their own (inline) plotting backend: a forced
# non-interactive backend would drop every figure from the built pages.
os.environ.pop("MPLBACKEND", None)

# Without a GPU, Triton kernels defined in this process run in Triton's interpreter.
# (Set before anything defines a kernel; notebooks' kernels decide for themselves.)
from coursekit.triton_env import triton_device  # noqa: E402

triton_device(quiet=True)


def run(cmd, cwd=REPO, timeout=1800, env=None):
    """Run a command, returning the CompletedProcess; output is kept for messages."""
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="session")
def repo():
    return REPO
