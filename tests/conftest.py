import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # autograde, and tests.* helpers

# Notebook kernels must pick their own (inline) plotting backend: a forced
# non-interactive backend would drop every figure from the built pages.
os.environ.pop("MPLBACKEND", None)


def run(cmd, cwd=REPO, timeout=1800, env=None):
    """Run a command, returning the CompletedProcess; output is kept for messages."""
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="session")
def repo():
    return REPO
