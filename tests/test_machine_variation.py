"""The same course on other machines, imitated here (tests/machine_settings.py):

- every page that trains a model or times something runs, with its asserts (the
  claims its prose makes), under another machine's SIMD kernels; the student
  release's book build runs the whole book under a third (test_release.py);
- the instructor's solutions and every correct style keep every autograded point
  through the real grading command under another machine's kernels; the planted
  class of test_grading.py is graded under a third.

A claim, an assertion or a tolerance that held only on the machine that wrote it
fails here."""
import csv
import re
from pathlib import Path

import pytest

from tests.conftest import REPO, run
from tests.machine_settings import GRADED_CLASS, RELEASE_BUILD, SETTINGS
from tests.notebooks import filled_submission, write_submission
from tests.packing import packed, packed_overrides
from tests.submissions import CLASSES, notebook_paths, points_per_cell

# The settings not already exercised by the release's build and test_grading's class
# ("native" is the machine's own, which ./scripts/build runs).
PAGE_SETTINGS = sorted(set(SETTINGS) - {RELEASE_BUILD, "native"})
GRADING_SETTINGS = sorted(set(SETTINGS) - {GRADED_CLASS, "native"}) or [RELEASE_BUILD]
# What a page does when it trains a model or times code: its numbers are the ones that
# another machine's rounding, or another machine's clock, changes.
TRAINS_OR_TIMES = re.compile(r"\btrain\(|\bbest_times\(|perf_counter|\.backward\(\)|\boptim\.")


def pages_that_train_or_time():
    return [str(path.relative_to(REPO)) for path in sorted((REPO / "book").rglob("*.md"))
            if TRAINS_OR_TIMES.search(path.read_text())]


def test_the_pages_that_train_or_time_are_found():
    pages = pages_that_train_or_time()
    for page in ("book/principles/why_scale.md", "book/variants/trained_model.md", "book/variants/real_text.md",
                 "book/complexity/measured.md"):
        assert page in pages


@pytest.mark.slow
@pytest.mark.parametrize("setting", PAGE_SETTINGS)
@pytest.mark.parametrize("page", pages_that_train_or_time())
def test_page_holds_its_claims_on_another_machine(page, setting):
    from tests.run_page import execute_page

    seconds, error = execute_page(REPO / page, setting)
    assert error is None, f"{page} under '{setting}' ({SETTINGS[setting]}), {seconds:.0f} s:\n{error[-4000:]}"


def grade_correct_class(assignment, root, setting):
    """The solutions as they are, filled into the student notebook, and every packed
    correct style, graded by the real command under `setting`; grades.csv's rows."""
    cases = CLASSES[assignment]
    source, release = notebook_paths(assignment)
    submitted = root / "submitted"
    write_submission(submitted, "solutions_as_is", assignment, cases.NOTEBOOK, source.read_text())
    write_submission(submitted, "all_correct", assignment, cases.NOTEBOOK, filled_submission(release, source))
    for name, members in packed(assignment, "CORRECT"):
        write_submission(submitted, name, assignment, cases.NOTEBOOK,
                         filled_submission(release, source, packed_overrides(assignment, "CORRECT", members)))
    out = root / "grading"
    # The instructors' command itself, from their shell (no TRITON_INTERPRET: it decides).
    proc = run([str(REPO / "scripts" / "grade"), assignment, str(submitted), "--out", str(out), "--timeout", "60"],
               env=SETTINGS[setting])
    assert proc.returncode == 0, f"grading command failed:\n{proc.stdout}\n{proc.stderr}"
    with (out / "grades.csv").open() as fh:
        return {row["student_id"]: row for row in csv.DictReader(fh)}


@pytest.mark.slow
@pytest.mark.parametrize("setting", GRADING_SETTINGS)
@pytest.mark.parametrize("assignment", sorted(CLASSES))
def test_correct_work_keeps_every_point_on_another_machine(tmp_path, assignment, setting):
    rows = grade_correct_class(assignment, tmp_path, setting)
    stem = Path(CLASSES[assignment].NOTEBOOK).stem
    tests = points_per_cell(assignment)
    assert len(rows) >= 2
    for student, row in rows.items():
        assert row["status"] == "graded", (student, row)
        lost = {cell: float(row[f"{stem}:{cell}"]) for cell, points in tests.items()
                if float(row[f"{stem}:{cell}"]) != points}
        assert not lost, f"{assignment} under '{setting}': {student} lost points in {lost}"
