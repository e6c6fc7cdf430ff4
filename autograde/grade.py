"""The instructors' grading command.

    python -m autograde grade ch1_principles path/to/submitted --out grading/ch1

`path/to/submitted` is in nbgrader's layout, `<student>/<assignment>/*.ipynb`.
The output folder is an nbgrader course directory of its own (source/,
submitted/, autograded/, feedback/, gradebook.db and an nbgrader_config.py, so
that `nbgrader formgrader` and `nbgrader export` work inside it), plus
grades.csv. Each student is graded on their own: a broken notebook or a
crashing submission costs only that student's points, with the reason
recorded."""
import csv
import warnings
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.apps import NbGraderAPI

from autograde.course import (
    CELL_TIMEOUT_S,
    CourseError,
    config_file_text,
    nbgrader_config,
    source_notebooks,
)
from autograde.submissions import find_submissions
from autograde.tripwire import release_sources, scan_notebook, write_report
from autograde.zip_input import unpack_zip


@dataclass
class StudentResult:
    student: str
    status: str  # graded | ungradable (unreadable notebooks) | failed (nbgrader could not run it)
    score: float = 0.0
    max_score: float = 0.0
    needs_manual_grade: bool = False
    problems: list = field(default_factory=list)
    cells: dict = field(default_factory=dict)  # "notebook:grade_id" -> score


@dataclass
class Summary:
    results: list
    grades_csv: Path
    seconds: float

    def count(self, status):
        return sum(r.status == status for r in self.results)


@dataclass
class Course:
    """An nbgrader course directory set up for grading one assignment."""
    api: NbGraderAPI
    db_url: str
    max_score: float
    grade_cells: list  # "notebook:grade_id", in notebook order


def _grade_cells(notebooks):
    cells = []
    for path in notebooks:
        for cell in nbformat.read(path, as_version=4).cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("grade"):
                cells.append(f"{path.stem}:{meta['grade_id']}")
    return cells


def _prepare_course(assignment, out, cell_timeout):
    """Make `out` an nbgrader course directory with the assignment released
    into its gradebook (the gradebook stores the test cells' true source)."""
    out.mkdir(parents=True, exist_ok=True)
    source = out / "source" / assignment
    if source.exists():
        shutil.rmtree(source)
    source.mkdir(parents=True)
    notebooks = source_notebooks(assignment)
    for nb in notebooks:
        shutil.copy2(nb, source / nb.name)
    db_url = f"sqlite:///{(out / 'gradebook.db').resolve()}"
    config = nbgrader_config(out.resolve(), db_url=db_url, cell_timeout=cell_timeout)
    (out / "nbgrader_config.py").write_text(config_file_text(config))
    api = NbGraderAPI(config=config)
    result = api.generate_assignment(assignment, force=True, create=True)
    if not result["success"]:
        raise CourseError(f"nbgrader could not prepare '{assignment}':\n{result.get('error') or result.get('log')}")
    with Gradebook(db_url) as gb:
        max_score = float(gb.find_assignment(assignment).max_score)
    return Course(api=api, db_url=db_url, max_score=max_score, grade_cells=_grade_cells(notebooks))


def _copy_submission(sub, course_submitted, assignment):
    """Copy only the readable notebooks (and nothing else) into the course."""
    dest = course_submitted / sub.student / assignment
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name in sub.notebooks:
        shutil.copy2(sub.folder / name, dest / name)


KNOWN_FAILURES = {
    "DeadKernelError": "the notebook's Python process died while running it (the code exited the process, "
                       "crashed, or ran out of memory), so no score could be computed",
    "UnresponsiveKernelError": "the notebook's Python process stopped responding, so no score could be computed",
}


def _explain_failure(outcome):
    """A sentence for the instructor from nbgrader's log of a failed run."""
    text = "\n".join(filter(None, (outcome.get("log"), outcome.get("error"))))
    for marker, sentence in KNOWN_FAILURES.items():
        if marker in text:
            return sentence
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return f"nbgrader could not grade it: {lines[-1] if lines else 'unknown error'}"


def _record_scores(result, gradebook, assignment):
    try:
        submission = gradebook.find_submission(assignment, result.student)
    except MissingEntry:
        result.status = "failed"
        result.problems.append("nbgrader recorded no submission")
        return
    result.score = float(submission.score)
    result.max_score = float(submission.max_score)
    result.needs_manual_grade = bool(submission.needs_manual_grade)
    for notebook in submission.notebooks:
        for grade in notebook.grades:
            score = grade.score if grade.score is not None else ""
            result.cells[f"{notebook.name}:{grade.name}"] = score


def _write_csv(path, results, cell_columns):
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["student_id", "status", "score", "max_score", "needs_manual_grade", *cell_columns, "problems"])
        for r in results:
            writer.writerow([r.student, r.status, f"{r.score:g}", f"{r.max_score:g}", r.needs_manual_grade,
                             *[r.cells.get(c, "") for c in cell_columns], "; ".join(r.problems)])


def grade(assignment, submissions, out=None, *, cell_timeout=None, log=print):
    # nbgrader's own gradebook code emits SQLAlchemy warnings that say nothing
    # to an instructor.
    warnings.filterwarnings("ignore", module="nbgrader")
    warnings.filterwarnings("ignore", message=".*not in session.*")
    started = time.monotonic()
    submissions = Path(submissions)
    out = Path(out) if out else Path("grading") / assignment
    expected = [nb.name for nb in source_notebooks(assignment)]
    zip_problems = {}
    if submissions.is_file() and submissions.suffix.lower() == ".zip":
        unzipped = out / "unzipped"
        if unzipped.exists():
            shutil.rmtree(unzipped)
        unpacked = unpack_zip(submissions, assignment, expected, unzipped)
        for entry in unpacked.skipped:
            log(f"skipped {entry} in {submissions.name}: not a notebook of '{assignment}'")
        submissions, zip_problems = unzipped, unpacked.problems
    elif not submissions.is_dir():
        raise CourseError(f"submissions folder not found: {submissions}")
    subs = find_submissions(submissions, assignment, expected)
    for sub in subs:
        sub.problems[:0] = zip_problems.get(sub.student, [])
    if not subs:
        raise CourseError(f"no submissions for '{assignment}' in {submissions} "
                          f"(expected folders like {submissions}/<student>/{assignment}/)")

    course = _prepare_course(assignment, out, cell_timeout or CELL_TIMEOUT_S)
    released = {name: release_sources(out / "release" / assignment / name) for name in expected}
    flags = []
    results = []
    for i, sub in enumerate(subs, 1):
        result = StudentResult(student=sub.student, status="graded", max_score=course.max_score,
                               problems=list(sub.problems))
        for name in sub.notebooks:
            flags += scan_notebook(sub.student, sub.folder / name, released[name])
        if not sub.notebooks:
            result.status = "ungradable"
        else:
            if sub.folder.resolve() != (out / "submitted" / sub.student / assignment).resolve():
                _copy_submission(sub, out / "submitted", assignment)
            outcome = course.api.autograde(assignment, sub.student, force=True, create=True)
            if not outcome["success"]:
                result.status = "failed"
                result.problems.append(_explain_failure(outcome))
            else:
                fb = course.api.generate_feedback(assignment, sub.student, force=True)
                if not fb["success"]:
                    result.problems.append(f"feedback not written: {_explain_failure(fb)}")
        if result.status == "graded":
            with Gradebook(course.db_url) as gb:
                _record_scores(result, gb, assignment)
        results.append(result)
        note = f" ({'; '.join(result.problems)})" if result.problems else ""
        manual = " + manual grading pending" if result.needs_manual_grade else ""
        log(f"[{i}/{len(subs)}] {sub.student}: {result.status} {result.score:g}/{result.max_score:g}{manual}{note}")

    grades_csv = out / "grades.csv"
    _write_csv(grades_csv, results, course.grade_cells)
    summary = Summary(results=results, grades_csv=grades_csv, seconds=time.monotonic() - started)
    log(f"graded {summary.count('graded')}, ungradable {summary.count('ungradable')}, "
        f"failed {summary.count('failed')} of {len(results)} submissions in {summary.seconds:.0f} s")
    flagged = write_report(out, flags)
    log(f"grades: {grades_csv}")
    log(f"integrity: {len(flagged)} student(s) flagged for review; see {out / 'integrity.txt'}")
    log(f"feedback: {out / 'feedback'}/<student>/{assignment}/")
    return summary

