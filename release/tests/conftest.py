import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # bookutils, coursekit, and tests.* helpers

# Notebook kernels must pick their own (inline) plotting backend: a forced
# non-interactive backend would drop every figure from the built pages.
os.environ.pop("MPLBACKEND", None)


def run(cmd, cwd=REPO, timeout=1800, env=None):
    """Run a command, returning the CompletedProcess; output is kept for messages."""
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


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
    # SITE_OUT keeps the build where a caller can read it afterwards (the
    # instructors' suite scans it for answers); by default it is temporary.
    out = Path(os.environ["SITE_OUT"]) if os.environ.get("SITE_OUT") else tmp_path_factory.mktemp("site")
    # SITE_REUSE=1 with SITE_OUT tests the build this fixture left there last time, without building
    # again (for re-running the browser tests after a change to them, not to the book).
    record = out / "build.log"
    if os.environ.get("SITE_REUSE") and os.environ.get("SITE_OUT") and record.is_file():
        return out / "_build", record.read_text()
    proc = run([shutil.which("jupyter-book") or "jupyter-book", "build", str(REPO), "--builder", "html",
                "-W", "-n", "--keep-going", "--path-output", str(out)])
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"jupyter-book build failed:\n{log[-6000:]}"
    record.write_text(log)
    return out / "_build", log
