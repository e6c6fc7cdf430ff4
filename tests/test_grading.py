"""The real nbgrader pipeline through the instructors' grading command, for
every assignment: solutions get full marks, untouched exercises get 0, planted
mistakes lose exactly the points they should, correct answers in other styles
get full marks, and broken or hostile submissions cost only their own student.
Planted changes that reach different test cells share a notebook (tests/packing.py)."""
import csv
import sys
from pathlib import Path

import pytest

from tests.conftest import run
from tests.machine_settings import GRADED_CLASS, SETTINGS
from tests.notebooks import filled_submission, hidden_checks, nbgrader_meta, write_submission
from tests.packing import notebook_of, packed, packed_loses, packed_overrides, reached_cells
from tests.submissions import CLASSES, notebook_paths, points_per_cell

ASSIGNMENTS = sorted(CLASSES)


def manual_points(assignment):
    """Points of the written answers graded by hand (markdown solution cells with points)."""
    import nbformat

    cells = nbformat.read(notebook_paths(assignment)[0], as_version=4).cells
    return sum(c.metadata.get("nbgrader", {}).get("points", 0) for c in cells
               if c.cell_type == "markdown" and c.metadata.get("nbgrader", {}).get("solution"))


def cell_timeout(assignment):
    """Seconds per cell: short where a planted submission hangs (Chapter 1's), and room
    elsewhere for Chapter 4's interpreted kernels on a machine busy with other tests."""
    return "15" if assignment == "ch1_principles" else "60"

# Submissions that attack the grading run itself; planted in Chapter 1's class
# (the machinery is the same for every assignment).
HOSTILE = {
    # A top-level infinite loop: that cell is stopped at the timeout.
    "hangs_forever": {"softmax": "while True:\n    pass"},
    # The kernel process exits while running a solution cell.
    "kernel_exits": {"softmax_jvp": "import os\nos._exit(3)"},
}


def grade_class(assignment, root):
    """Plant one class of submissions and grade it with the real command."""
    cases = CLASSES[assignment]
    source, release = notebook_paths(assignment)
    submitted = root / "submitted"
    students = set()

    def plant(student, notebook, name=cases.NOTEBOOK):
        write_submission(submitted, student, assignment, name, notebook)
        students.add(student)

    plant("solutions_as_is", source.read_text())
    plant("untouched", release.read_text())
    plant("all_correct", filled_submission(release, source))
    planted = {name: packed_overrides(assignment, kind, members)
               for kind in ("CORRECT", "BUGGY") for name, members in packed(assignment, kind)}
    if assignment == "ch1_principles":
        plant("broken_json", release.read_text()[:500])
        plant("not_a_notebook", '{"answer": 42}')
        plant("wrong_name", release.read_text(), name="principles (1).ipynb")
        planted.update(HOSTILE)
    for name, overrides in planted.items():
        plant(name, filled_submission(release, source, overrides))

    return {**grade_folder(assignment, submitted, root / "grading"), "students": students}


def grade_folder(assignment, submitted, out):
    """The real grading command on a folder of submissions: grades.csv's rows by student."""
    # Graded under another machine's SIMD kernels (tests/machine_settings.py): no grade may depend on them.
    proc = run([sys.executable, "-m", "autograde", "grade", assignment, str(submitted),
                "--out", str(out), "--timeout", cell_timeout(assignment)], env=SETTINGS[GRADED_CLASS])
    assert proc.returncode == 0, f"grading command failed:\n{proc.stdout}\n{proc.stderr}"
    with (out / "grades.csv").open() as fh:
        rows = {row["student_id"]: row for row in csv.DictReader(fh)}
    return {"rows": rows, "out": out, "stdout": proc.stdout}


_GRADED = {}


@pytest.fixture(scope="session")
def graded(once):
    """assignment -> its graded class; each class is graded once in a test run,
    and test_gradescope compares Gradescope's grades with the same rows."""
    def as_data(result):
        return {**result, "out": str(result["out"]), "students": sorted(result["students"])}

    def get(assignment):
        if assignment not in _GRADED:
            data = once(f"graded-{assignment}", lambda folder: as_data(grade_class(assignment, folder)))
            _GRADED[assignment] = {**data, "out": Path(data["out"]), "students": set(data["students"])}
        return _GRADED[assignment]

    def if_ready(assignment):
        """The graded class if it is graded already (by any worker), else None: never waits."""
        return get(assignment) if assignment in _GRADED or once.ready(f"graded-{assignment}") else None

    get.if_ready = if_ready
    return get


def cell_scores(assignment, row):
    stem = CLASSES[assignment].NOTEBOOK.removesuffix(".ipynb")
    return {gid: float(row[f"{stem}:{gid}"]) for gid in points_per_cell(assignment)}


def cases(kind):
    return [(a, name) for a in ASSIGNMENTS for name in sorted(getattr(CLASSES[a], kind))]


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_submission_has_a_row(graded, assignment):
    result = graded(assignment)
    assert set(result["rows"]) == result["students"]
    packs = packed(assignment, "BUGGY") + packed(assignment, "CORRECT")
    assert {name for name, _ in packs} <= result["students"]
    members = [m for _, ms in packs for m in ms]
    assert sorted(members) == sorted(set(CLASSES[assignment].BUGGY) | set(CLASSES[assignment].CORRECT))


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
@pytest.mark.parametrize("student", ["solutions_as_is", "all_correct"])
def test_solutions_score_full_marks(graded, assignment, student):
    row = graded(assignment)["rows"][student]
    tests = points_per_cell(assignment)
    assert row["status"] == "graded", row
    assert cell_scores(assignment, row) == tests, f"{student} lost points: {cell_scores(assignment, row)}"
    assert manual_points(assignment) >= 2, "each assignment has a written answer graded by hand"
    assert float(row["max_score"]) == sum(tests.values()) + manual_points(assignment)
    assert row["needs_manual_grade"] == "True"


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_report_says_where_kernels_ran(graded, assignment):
    """Chapter 4's kernels run natively or in the interpreter, by the machine: the
    instructor reads which (and the tests cannot tell otherwise what was graded)."""
    import torch

    lines = [line for line in graded(assignment)["stdout"].splitlines() if line.startswith("Triton kernels ran")]
    if assignment != "ch4_flash":
        assert not lines
        return
    where = "natively on the GPU" if torch.cuda.is_available() else "in Triton's interpreter on the CPU"
    assert lines and lines[-1].startswith(f"Triton kernels ran {where}"), lines


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_untouched_exercises_score_zero(graded, assignment):
    row = graded(assignment)["rows"]["untouched"]
    assert row["status"] == "graded"
    assert float(row["score"]) == 0
    assert all(score == 0 for score in cell_scores(assignment, row).values())
    assert row["needs_manual_grade"] == "False"  # an unchanged answer cell is 0, not pending


@pytest.mark.parametrize("assignment, student", cases("CORRECT"))
def test_correct_answers_in_other_styles_score_full_marks(graded, assignment, student):
    tests = points_per_cell(assignment)
    scores = cell_scores(assignment, graded(assignment)["rows"][notebook_of(assignment, student)])
    lost = {gid: s for gid, s in scores.items() if s != tests[gid]}
    assert not lost, f"{student} is correct but lost points in {lost}"


@pytest.mark.parametrize("assignment, student", cases("BUGGY"))
def test_planted_mistakes_lose_exactly_their_points(graded, assignment, student):
    """Among the test cells it reaches (the others belong to its notebook's other changes)."""
    overrides, loses = CLASSES[assignment].BUGGY[student]
    tests = points_per_cell(assignment)
    assert loses <= set(tests), f"unknown test cells {loses - set(tests)}"
    reached = reached_cells(assignment, overrides)
    reached = set(tests) if reached is None else reached
    assert loses <= reached, f"{student} loses cells it cannot reach: {sorted(loses - reached)}"
    scores = cell_scores(assignment, graded(assignment)["rows"][notebook_of(assignment, student)])
    failed = {gid for gid, s in scores.items() if s == 0 and gid in reached}
    partial = {gid for gid, s in scores.items() if 0 < s < tests[gid]}
    assert not partial
    assert failed == loses, f"{student}: expected to lose {sorted(loses)}, lost {sorted(failed)}"


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_packed_mistakes_lose_nothing_else(graded, assignment):
    """A notebook of planted mistakes loses its members' cells and no other."""
    tests = points_per_cell(assignment)
    for name, members in packed(assignment, "BUGGY"):
        scores = cell_scores(assignment, graded(assignment)["rows"][name])
        failed = {gid for gid, s in scores.items() if s != tests[gid]}
        assert failed == packed_loses(assignment, members), f"{name} ({', '.join(members)})"


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_each_failed_hidden_test_names_the_function_it_checks(graded, assignment):
    """What test_checks asserts of each planted mistake in-process, read here from the
    notebooks the real pipeline graded: the message a student gets names the function."""
    import nbformat

    source, _ = notebook_paths(assignment)
    checks = hidden_checks(source)
    autograded = graded(assignment)["out"] / "autograded"
    for name, members in packed(assignment, "BUGGY"):
        cells = nbformat.read(autograded / name / assignment / CLASSES[assignment].NOTEBOOK, as_version=4).cells
        messages = {nbgrader_meta(c).get("grade_id"): "\n".join(o.get("evalue", "") for o in c.get("outputs", [])
                                                                if o.get("output_type") == "error") for c in cells}
        for cell in sorted(packed_loses(assignment, members) & set(checks)):
            function = checks[cell][1]
            assert function in messages.get(cell, ""), f"{name}, {cell}: the message should name {function}: " \
                                                       f"{messages.get(cell)!r}"


@pytest.mark.parametrize("student, reason", [
    ("broken_json", "not valid notebook JSON"),
    ("not_a_notebook", "not a notebook"),
    ("wrong_name", "principles.ipynb is missing"),
])
def test_unreadable_submissions_are_reported_not_fatal(graded, student, reason):
    result = graded("ch1_principles")
    row = result["rows"][student]
    assert row["status"] == "ungradable"
    assert float(row["score"]) == 0
    assert reason in row["problems"]
    assert reason in result["stdout"]


def test_hostile_submissions_cost_only_their_own_points(graded):
    rows, tests = graded("ch1_principles")["rows"], points_per_cell("ch1_principles")
    hang = cell_scores("ch1_principles", rows["hangs_forever"])
    assert hang["test_softmax"] == 0 and hang["test_multi_head_attention"] == 0
    # Cells that do not depend on the hanging cell still score.
    assert hang["test_commuting_permutations"] == tests["test_commuting_permutations"]
    exits = rows["kernel_exits"]
    assert exits["status"] == "graded"
    assert "exited with status 3" in exits["problems"]
    exited = cell_scores("ch1_principles", exits)
    # The cells before the exit score; the function that exits never is defined.
    assert exited["test_softmax"] == tests["test_softmax"] and exited["test_softmax_jvp"] == 0
    # The students graded after them are unaffected.
    assert cell_scores("ch1_principles", rows[notebook_of("ch1_principles", "sdpa_einsum_additive_mask")]) == tests


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_integrity_report_flags_only_the_hostile_code(graded, assignment):
    with (graded(assignment)["out"] / "integrity.csv").open() as fh:
        flagged = {(row["student_id"], row["reason"]) for row in csv.DictReader(fh)}
    expected = {("kernel_exits", "exits its process (os._exit)"), ("kernel_exits", "execution: process-lost"),
                ("hangs_forever", "execution: process-lost")} if assignment == "ch1_principles" else set()
    # Planted mistakes that a check also reports for a person to look at.
    expected |= {(notebook_of(assignment, student), reason)
                 for student, reasons in getattr(CLASSES[assignment], "FLAGGED", {}).items() for reason in reasons}
    may = {(notebook_of(assignment, student), reason)
           for student, reasons in getattr(CLASSES[assignment], "MAY_BE_FLAGGED", {}).items() for reason in reasons}
    assert expected <= flagged <= expected | may, f"missing {expected - flagged}, unexpected {flagged - expected - may}"
    assert "integrity: " in graded(assignment)["stdout"]


@pytest.mark.parametrize("assignment, failing, function", [
    ("ch1_principles", "sdpa_no_scaling", "scaled_dot_product_attention"),
    ("ch2_variants", "padded_nan_on_empty_rows", "left_padded_causal_attention"),
])
def test_feedback_is_written_without_hidden_tests(graded, assignment, failing, function):
    feedback = graded(assignment)["out"] / "feedback"
    html_name = CLASSES[assignment].NOTEBOOK.replace(".ipynb", ".html")
    pages = sorted(feedback.glob(f"*/{assignment}/{html_name}"))
    students = {p.parts[-3] for p in pages}
    failing = notebook_of(assignment, failing)
    assert {"all_correct", "untouched", failing} <= students
    for page in pages:
        html = page.read_text()
        assert "BEGIN HIDDEN TESTS" not in html, page
        assert "autograde.checks" not in html, page
    text = (feedback / failing / assignment / html_name).read_text()
    assert "hidden tests ran here" in text
    assert function in text and "expected" in text


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_grading_folder_works_with_nbgrader_itself(graded, assignment):
    """nbgrader's own export reads the gradebook the command wrote."""
    out = graded(assignment)["out"]
    proc = run([sys.executable, "-m", "nbgrader", "export", "--to", "export.csv"], cwd=out)
    assert proc.returncode == 0, proc.stderr
    text = (out / "export.csv").read_text()
    assert "all_correct" in text and assignment in text
