"""The student release: generated into a temporary folder, it holds only
public files, no answer, hidden test or reference body in any file, and it
passes its own test command (its book build, its site in a real browser and
its answer scan), whose built site is then scanned for answers too."""
import shutil

import nbformat
import pytest

from autograde.course import CourseError
from autograde.release import write_release
from tests.conftest import REPO, run
from tests.machine_settings import RELEASE_BUILD, SETTINGS
from tests.leaks import MARKERS, find_leaks, secret_fragments

INSTRUCTOR_ONLY = ["solutions", "autograde", "student_runtime", "tests/submissions", "tests/attacks.py",
                   "tests/leaks.py", "tests/README.md", "CONTRIBUTING.md", "docs", "grading"]


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return write_release(tmp_path_factory.mktemp("release") / "attention-course")


def _answers_in(folder):
    """Leaks, less the release's own tests naming the markers they look for."""
    tests = folder / "tests"
    return [(p, what) for p, what in find_leaks(folder)
            if not (tests in p.parents and what in MARKERS) and ".venv" not in p.parts]


def test_release_holds_only_public_files(release):
    assert not [name for name in INSTRUCTOR_ONLY if (release / name).exists()]
    assert (release / "README.md").read_text().startswith("# Attention")
    assert "solutions" not in (release / "README.md").read_text()
    for needed in ["book/intro.md", "exercises/ch4_flash/flash.ipynb", "bookutils/triton_kernels.py",
                   "coursekit/triton_trace.py", "scripts/build", "scripts/test", ".github/workflows/pages.yml",
                   "bookutils/stepper.js", "bookutils/stepper.css", "tests/test_figures.py"]:
        assert (release / needed).is_file(), needed


def test_release_carries_no_answer_hidden_test_or_reference(release):
    leaks = _answers_in(release)
    assert not leaks, "\n".join(f"{p.relative_to(release)}: {what!r}" for p, what in leaks[:20])


def test_a_planted_leak_is_found(release, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(release, copy)
    fragment = sorted(secret_fragments())[0]
    (copy / "bookutils" / "helpers_extra.py").write_text(f"# notes\n{fragment}\n")
    solved = nbformat.read(REPO / "solutions" / "ch1_principles" / "principles.ipynb", as_version=4)
    nbformat.write(solved, copy / "exercises" / "ch1_principles" / "principles.ipynb")
    found = {(p.relative_to(copy).as_posix()) for p, _ in _answers_in(copy)}
    assert "bookutils/helpers_extra.py" in found
    assert "exercises/ch1_principles/principles.ipynb" in found


def test_release_is_refused_inside_the_repository():
    with pytest.raises(CourseError, match="outside"):
        write_release(REPO / "release-here")


@pytest.mark.slow
def test_release_passes_its_own_tests_and_its_site_carries_no_answer(release):
    (release / ".venv").symlink_to(REPO / ".venv")  # the same pinned packages, installed once
    site = release / "_site"
    # The whole book, executed under another machine's SIMD kernels (tests/machine_settings.py).
    proc = run(["./scripts/test", "-q"], cwd=release, timeout=3600,
               env={"SITE_OUT": str(site), "PYTHONPATH": "", **SETTINGS[RELEASE_BUILD]})
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    assert " passed" in log and " failed" not in log, log[-3000:]
    html = site / "_build" / "html"
    assert (html / "exercises" / "ch1_principles" / "principles.html").is_file()
    leaks = find_leaks(html)
    assert not leaks, "\n".join(f"{p.relative_to(html)}: {what!r}" for p, what in leaks[:20])
