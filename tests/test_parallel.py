"""The suite's own parallel machinery: on several workers, tests that share a
module-scoped fixture run on one worker, so the fixture (a graded batch, a
generation) is made once. pytest 9.2 silently broke pytest-xdist's groups
(pytest-xdist#1386); this test fails if that, or conftest.py's grouping, breaks."""
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
