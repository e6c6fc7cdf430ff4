"""The suite's own parallel machinery: on several workers, tests that share a
module-scoped fixture run on one worker, so the fixture (a graded batch, a
generation) is made once. pytest 9.2 silently broke pytest-xdist's groups
(pytest-xdist#1386); this test fails if that, or conftest.py's grouping, breaks.
A session-scoped fixture is made once per worker, so one in a test module must
share its work through conftest's `once` (or a fixture that does)."""
import ast
import sys

from tests.conftest import REPO, run

MODULE = '''
import os
import pytest

@pytest.fixture(scope="module")
def made(tmp_path_factory):
    with open(os.environ["MADE_LOG"], "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
    return True

@pytest.mark.parametrize("i", range(8))
def test_shares_the_fixture(made, i):
    assert made

@pytest.mark.parametrize("i", range(8))
def test_needs_nothing(i):
    pass
'''


def test_tests_sharing_a_module_fixture_run_on_one_worker(tmp_path):
    (tmp_path / "test_shared.py").write_text(MODULE)
    log = tmp_path / "made.log"
    proc = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                "-n", "2", "--dist", "loadgroup", "--rootdir", str(tmp_path), str(tmp_path / "test_shared.py")],
               cwd=tmp_path, env={"PYTHONPATH": str(REPO), "MADE_LOG": str(log)}, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "16 passed" in proc.stdout, proc.stdout
    made_on = log.read_text().split()
    assert len(made_on) == 1, f"the module fixture was made on {made_on}: groups are not kept on one worker"


def _session_fixtures(tree):
    """name -> parameter names of each function decorated @pytest.fixture(scope="session")."""
    found = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for deco in node.decorator_list:
            if (isinstance(deco, ast.Call) and ast.unparse(deco.func) == "pytest.fixture"
                    and any(k.arg == "scope" and getattr(k.value, "value", None) == "session" for k in deco.keywords)):
                found[node.name] = [a.arg for a in node.args.args]
    return found


def test_session_fixtures_in_test_modules_are_made_once_per_run():
    fixtures = {}
    for path in sorted((REPO / "tests").glob("test_*.py")):
        for name, params in _session_fixtures(ast.parse(path.read_text())).items():
            fixtures[name] = (path.name, params)
    shared = {"once"}
    while True:   # a fixture that takes `once`, or a fixture that does, shares its work
        more = {name for name, (_, params) in fixtures.items() if shared & set(params)} - shared
        if not more:
            break
        shared |= more
    alone = [f"{path}: {name}" for name, (path, _) in fixtures.items() if name not in shared]
    assert not alone, ("session-scoped fixtures made again on every worker (make them module-scoped, so their "
                       f"tests share a worker, or build them through `once`): {alone}")
