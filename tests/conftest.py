import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from filelock import FileLock

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # autograde, and tests.* helpers

# Notebook kernels must pick their own (inline) plotting backend: a forced
# non-interactive backend would drop every figure from the built pages.
os.environ.pop("MPLBACKEND", None)

# The environment as the user's shell gave it, for the commands the tests start:
# they must decide for themselves where Triton runs, as they do for an instructor.
_OUTER_TRITON_INTERPRET = os.environ.get("TRITON_INTERPRET")

# Without a GPU, Triton kernels defined in this process run in Triton's interpreter.
# (Set before anything defines a kernel; notebooks' kernels decide for themselves.)
from coursekit.triton_env import triton_device  # noqa: E402

triton_device(quiet=True)


def outer_environ(**extra):
    """os.environ without what this process set for itself (TRITON_INTERPRET), plus extra."""
    env = dict(os.environ)
    if _OUTER_TRITON_INTERPRET is None:
        env.pop("TRITON_INTERPRET", None)
    else:
        env["TRITON_INTERPRET"] = _OUTER_TRITON_INTERPRET
    env.update(extra)
    return env


def run(cmd, cwd=REPO, timeout=1800, env=None):
    """Run a command as from the user's shell, returning the CompletedProcess; output is kept for messages."""
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=outer_environ(**(env or {})))


@pytest.fixture(scope="session")
def repo():
    return REPO


# ./scripts/test --quick: what a contributor runs while editing, in a few minutes:
# the references, the hidden checks against the planted submissions in-process,
# the notebooks' structure, the leak scans and the documents. Nothing here runs
# nbgrader, the sandbox or a book build; tests that do are marked slow.
QUICK = {"test_reference.py", "test_checks.py", "test_structure.py", "test_exercises.py", "test_not_a_copy.py",
         "test_tripwire.py", "test_docs.py", "test_release.py", "test_cli.py"}


def pytest_addoption(parser):
    parser.addoption("--quick", action="store_true",
                     help="only the quick tests: references, checks in-process, structure, leaks, documents")


def pytest_ignore_collect(collection_path, config):
    if config.getoption("--quick") and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return collection_path.name not in QUICK or None  # not even imported


# Module-scoped fixtures that are cheap to make twice: their tests may spread
# over the workers (each Gradescope run is long, and independent of the others).
SPREAD = {"autograder"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    if config.getoption("--quick"):
        quick = [item for item in items if item.path.name in QUICK and not item.get_closest_marker("slow")]
        kept = set(quick)
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = quick
    for item in items:
        # Tests that share a module-scoped fixture (one grading batch, one
        # generation) run on one worker, so that it is made once.
        shared = sorted(name for name in item.fixturenames if name not in SPREAD
                        and _scope(item, name) == "module")
        if shared and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(f"{item.path.name}:{shared[0]}"))
        # test_grading's tests of one assignment read one graded class: on one worker they
        # run in turn, where on two the second would wait, idle, while the first grades it.
        params = getattr(getattr(item, "callspec", None), "params", {})
        if (item.path.name == "test_grading.py" and "graded" in item.fixturenames and "assignment" in params
                and not item.get_closest_marker("xdist_group")):
            item.add_marker(pytest.mark.xdist_group(f"graded-{params['assignment']}"))
    # Slow files first, so that on several workers none of them starts last.
    # pytest-xdist then hands out the groups with the most tests first (its
    # loadscope reorder), this order among equals: the single slow tests (pages,
    # gradings) before the thousand quick ones, which fill the end. Files keep
    # their own order (a test may leave files in a module fixture's folder that
    # an earlier one must not see).
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (item.path not in slow_files, item.path.name in QUICK))


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")  # after -k and -m have chosen
def pytest_leave_out_what_is_graded_again(config, items):
    """Tests marked graded_again(file, test) check in-process what that test checks through
    nbgrader: where both are to run (the full suite), only the pipeline's does."""
    collected = {(item.path.name, item.originalname) for item in items}
    again = [item for item in items if (m := item.get_closest_marker("graded_again")) and tuple(m.args) in collected]
    if again:
        config.hook.pytest_deselected(items=again)
        left_out = set(again)
        items[:] = [item for item in items if item not in left_out]


def _scope(item, name):
    definitions = item._fixtureinfo.name2fixturedefs.get(name)
    return definitions[-1].scope if definitions else None


@pytest.fixture(scope="session")
def once(tmp_path_factory):
    """once(name, make) -> make(folder), made by one test process of the run and
    read back by the others (pytest-xdist's workers share the parent of their
    temporary folders): an expensive run, such as grading a class, is made once
    however the tests that read it are spread. make returns JSON data."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base

    def get(name, make):
        result = shared / f"{name}.json"
        with FileLock(str(shared / f"{name}.lock")):
            if not result.exists():
                folder = shared / name
                shutil.rmtree(folder, ignore_errors=True)  # what a failed attempt left
                folder.mkdir()
                part = result.with_suffix(".part")
                part.write_text(json.dumps(make(folder)))
                part.replace(result)                        # whole or absent, for ready
        return json.loads(result.read_text())

    def ready(name):
        """Whether some process has made the result: never waits."""
        return (shared / f"{name}.json").exists()

    get.ready = ready
    return get
