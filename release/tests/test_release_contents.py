"""The student release holds the book, the exercises and what they import,
and nothing of the instructor's: no solutions, references, hidden checks,
grading engine or planted submissions, and no answer left in a notebook."""
from tests.answers import answer_leaks
from tests.conftest import REPO

INSTRUCTOR_ONLY = ("solutions", "autograde", "student_runtime", "tests/submissions", "tests/attacks.py",
                   "CONTRIBUTING.md")


def test_no_instructor_files():
    present = [name for name in INSTRUCTOR_ONLY if (REPO / name).exists()]
    assert not present, f"instructor-only files in the student release: {present}"


def test_exercises_are_stubs_and_nothing_carries_answer_markers():
    leaks = [(p, what) for p, what in answer_leaks(REPO) if "_build" not in p.parts and ".venv" not in p.parts]
    assert not leaks, "\n".join(f"{p.relative_to(REPO)}: {what}" for p, what in leaks[:20])


def test_every_assignment_has_its_notebook():
    notebooks = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "exercises").glob("*/*.ipynb"))
    assert len(notebooks) >= 4, notebooks
