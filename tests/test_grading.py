"""The real nbgrader pipeline through the instructors' grading command:
solutions get full marks, untouched exercises get 0, planted mistakes lose
exactly the points they should, correct answers in other styles get full
marks, and broken or hostile submissions cost only their own student."""
import csv
import sys

import pytest

from tests.conftest import REPO, run
from tests.notebooks import filled_submission, graded_test_cells, write_submission
from tests.submissions import principles as cases

ASSIGNMENT = cases.ASSIGNMENT
NOTEBOOK = "principles.ipynb"
SOURCE = REPO / "solutions" / ASSIGNMENT / NOTEBOOK
RELEASE = REPO / "exercises" / ASSIGNMENT / NOTEBOOK
TESTS = graded_test_cells(SOURCE)
AUTO_MAX = sum(TESTS.values())

HOSTILE = {
    # A top-level infinite loop: that cell is stopped at the timeout.
    "hangs_forever": {"softmax": "while True:\n    pass"},
    # The kernel process exits while running a solution cell.
    "kernel_exits": {"dot_product_variance": "import os\nos._exit(3)"},
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade one class of planted submissions with the real command, once."""
    root = tmp_path_factory.mktemp("class")
    submitted = root / "submitted"
    write_submission(submitted, "solutions_as_is", ASSIGNMENT, NOTEBOOK, SOURCE.read_text())
    write_submission(submitted, "untouched", ASSIGNMENT, NOTEBOOK, RELEASE.read_text())
    write_submission(submitted, "all_correct", ASSIGNMENT, NOTEBOOK, filled_submission(RELEASE, SOURCE))
    write_submission(submitted, "broken_json", ASSIGNMENT, NOTEBOOK, RELEASE.read_text()[:500])
    write_submission(submitted, "not_a_notebook", ASSIGNMENT, NOTEBOOK, '{"answer": 42}')
    write_submission(submitted, "wrong_name", ASSIGNMENT, "principles (1).ipynb", RELEASE.read_text())
    for name, overrides in {**cases.CORRECT, **HOSTILE}.items():
        write_submission(submitted, name, ASSIGNMENT, NOTEBOOK, filled_submission(RELEASE, SOURCE, overrides))
    for name, (overrides, _) in cases.BUGGY.items():
        write_submission(submitted, name, ASSIGNMENT, NOTEBOOK, filled_submission(RELEASE, SOURCE, overrides))

    out = root / "grading"
    proc = run([sys.executable, "-m", "autograde", "grade", ASSIGNMENT, str(submitted),
                "--out", str(out), "--timeout", "15"])
    assert proc.returncode == 0, f"grading command failed:\n{proc.stdout}\n{proc.stderr}"
    with (out / "grades.csv").open() as fh:
        rows = {row["student_id"]: row for row in csv.DictReader(fh)}
    return {"rows": rows, "out": out, "stdout": proc.stdout}


def cell_scores(row):
    return {gid: float(row[f"principles:{gid}"]) for gid in TESTS}


def auto_score(row):
    return sum(cell_scores(row).values())


def test_every_submission_has_a_row(graded):
    expected = ({"solutions_as_is", "untouched", "all_correct", "broken_json", "not_a_notebook", "wrong_name"}
                | set(cases.CORRECT) | set(cases.BUGGY) | set(HOSTILE))
    assert set(graded["rows"]) == expected


@pytest.mark.parametrize("student", ["solutions_as_is", "all_correct"])
def test_solutions_score_full_marks(graded, student):
    row = graded["rows"][student]
    assert row["status"] == "graded", row
    assert cell_scores(row) == TESTS, f"{student} lost points: {cell_scores(row)}"
    assert float(row["max_score"]) == AUTO_MAX + 2  # the written answer is graded by hand
    assert row["needs_manual_grade"] == "True"


def test_untouched_exercises_score_zero(graded):
    row = graded["rows"]["untouched"]
    assert row["status"] == "graded"
    assert float(row["score"]) == 0
    assert all(score == 0 for score in cell_scores(row).values())
    assert row["needs_manual_grade"] == "False"  # an unchanged answer cell is 0, not pending


@pytest.mark.parametrize("student", sorted(cases.CORRECT))
def test_correct_answers_in_other_styles_score_full_marks(graded, student):
    row = graded["rows"][student]
    lost = {gid: s for gid, s in cell_scores(row).items() if s != TESTS[gid]}
    assert not lost, f"{student} is correct but lost points in {lost}"


@pytest.mark.parametrize("student", sorted(cases.BUGGY))
def test_planted_mistakes_lose_exactly_their_points(graded, student):
    _, loses = cases.BUGGY[student]
    assert loses <= set(TESTS), f"unknown test cells {loses - set(TESTS)}"
    scores = cell_scores(graded["rows"][student])
    failed = {gid for gid, s in scores.items() if s == 0}
    partial = {gid for gid, s in scores.items() if 0 < s < TESTS[gid]}
    assert not partial
    assert failed == loses, f"{student}: expected to lose {sorted(loses)}, lost {sorted(failed)}"


@pytest.mark.parametrize("student, reason", [
    ("broken_json", "not valid notebook JSON"),
    ("not_a_notebook", "not a notebook"),
    ("wrong_name", "principles.ipynb is missing"),
])
def test_unreadable_submissions_are_reported_not_fatal(graded, student, reason):
    row = graded["rows"][student]
    assert row["status"] == "ungradable"
    assert float(row["score"]) == 0
    assert reason in row["problems"]
    assert reason in graded["stdout"]


def test_hostile_submissions_cost_only_their_own_points(graded):
    hang = cell_scores(graded["rows"]["hangs_forever"])
    assert hang["test_softmax"] == 0 and hang["test_multi_head_attention"] == 0
    # Cells that do not depend on the hanging cell still score.
    assert hang["test_equivariance_gap"] == TESTS["test_equivariance_gap"]
    exits = graded["rows"]["kernel_exits"]
    assert exits["status"] == "failed"
    assert "died" in exits["problems"]
    assert float(exits["score"]) < AUTO_MAX
    # The students graded after them are unaffected.
    assert cell_scores(graded["rows"]["sdpa_einsum_additive_mask"]) == TESTS


def test_feedback_is_written_without_hidden_tests(graded):
    feedback = graded["out"] / "feedback"
    pages = sorted(feedback.glob(f"*/{ASSIGNMENT}/principles.html"))
    students = {p.parts[-3] for p in pages}
    assert {"all_correct", "untouched", "sdpa_no_scaling"} <= students
    for page in pages:
        html = page.read_text()
        assert "BEGIN HIDDEN TESTS" not in html, page
        assert "autograde.checks" not in html, page
    failing = (feedback / "sdpa_no_scaling" / ASSIGNMENT / "principles.html").read_text()
    assert "hidden tests ran here" in failing
    assert "scaled_dot_product_attention" in failing and "expected" in failing


def test_grading_folder_works_with_nbgrader_itself(graded):
    """nbgrader's own export reads the gradebook the command wrote."""
    out = graded["out"]
    proc = run([sys.executable, "-m", "nbgrader", "export", "--to", "export.csv"], cwd=out)
    assert proc.returncode == 0, proc.stderr
    text = (out / "export.csv").read_text()
    assert "all_correct" in text and ASSIGNMENT in text
