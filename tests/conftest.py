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


def toc_files():
    """The pages of _toc.yml, in order, as paths without suffix."""
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                files.append(entry["file"])
            walk(entry.get("sections"))
            walk(entry.get("chapters"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    return files


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """The real `jupyter-book build` (warnings are errors), once per test run:
    (the _build folder, the build log)."""
    out = tmp_path_factory.mktemp("site")
    proc = run([shutil.which("jupyter-book") or "jupyter-book", "build", str(REPO), "--builder", "html",
                "-W", "-n", "--keep-going", "--path-output", str(out)])
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"jupyter-book build failed:\n{log[-6000:]}"
    return out / "_build", log
