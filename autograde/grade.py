"""The instructors' grading command.

    python -m autograde grade ch1_principles path/to/submitted --out grading/ch1

`path/to/submitted` is in nbgrader's layout, `<student>/<assignment>/*.ipynb`.
The output folder is an nbgrader course directory of its own (source/,
submitted/, autograded/, feedback/, gradebook.db and an nbgrader_config.py, so
that `nbgrader formgrader` and `nbgrader export` work inside it), plus
grades.csv. Each student is graded on their own: a broken notebook or a
crashing submission costs only that student's points, with the reason
recorded.

Students are graded in parallel worker processes (autograde.worker), each
running its student's code in a sandbox (autograde.sandbox) and the tests in
the worker itself; this process alone writes the gradebook (autograde.record).
"""
import csv
import multiprocessing
import os
import shutil
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
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
    uses_triton,
)
from autograde import cgroups, nbgrader_revision
from autograde.memory import OUTSIDE_SLACK_BYTES
from autograde.progress import Progress
from autograde.record import (
    backup_gradebook,
    manual_conflicts,
    manual_grades,
    place_submission,
    scoring_config,
    zero_automatic_grades,
)
from autograde.sandbox import Limits, namespaces_available
from autograde.submissions import find_submissions
from autograde.tripwire import Flag, release_sources, scan_notebook, write_report
from autograde.worker import Job, Outcome, grade_student
from autograde.zip_input import unpack_zip

NOTEBOOK_TIMEOUT_S = 1800


class EnvironmentProblem(Exception):
    """The grading machine cannot grade (a library missing, a process that
    cannot start): nothing is recorded as a student's score."""


@dataclass
class StudentResult:
    student: str
    status: str  # graded | ungradable (nothing readable) | failed (nbgrader could not store it) | error (grader bug)
    score: float = 0.0
    max_score: float = 0.0
    needs_manual_grade: bool = False
    problems: list = field(default_factory=list)
    cells: dict = field(default_factory=dict)  # "notebook:grade_id" -> score
    flagged: bool = False


@dataclass
class Summary:
    results: list
    grades_csv: Path
    seconds: float
    flagged: list = field(default_factory=list)
    conflicts: list = field(default_factory=list)
    kernels: str = ""      # where Triton kernels ran, for assignments that have them

    def count(self, status):
        return sum(r.status == status for r in self.results)


@dataclass
class Course:
    """An nbgrader course directory set up for grading one assignment."""
    api: NbGraderAPI  # configured to score executed notebooks, not to run them
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
    nbgrader_revision.install()
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
    result = NbGraderAPI(config=config).generate_assignment(assignment, force=True, create=True)
    if not result["success"]:
        raise CourseError(f"nbgrader could not prepare '{assignment}':\n{result.get('error') or result.get('log')}")
    with Gradebook(db_url) as gb:
        max_score = float(gb.find_assignment(assignment).max_score)
    return Course(api=NbGraderAPI(config=scoring_config(config)), db_url=db_url, max_score=max_score, grade_cells=_grade_cells(notebooks))


def _record_scores(result, gradebook, assignment, required=True):
    try:
        submission = gradebook.find_submission(assignment, result.student)
    except MissingEntry:
        if required:
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


def _outcome_of_nbgrader(outcome):
    text = "\n".join(filter(None, (outcome.get("log"), outcome.get("error"))))
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return f"nbgrader could not store the grades: {lines[-1] if lines else 'unknown error'}"


def _record(course, assignment, out, sub, outcome, stage):
    """This process only: place the executed notebooks, let nbgrader score and
    store them, write feedback, and read the grades back."""
    result = StudentResult(student=sub.student, status="graded", max_score=course.max_score,
                           problems=list(sub.problems) + outcome.problems)
    if outcome.grader_error:
        result.status = "error"
        result.problems.append(f"the grader failed on this submission (a bug to report, not the student's "
                               f"score): {outcome.grader_error.strip().splitlines()[-1]}")
        return result, []
    before = manual_grades(course.db_url, assignment, sub.student)
    place_submission(out, assignment, sub.student, stage, outcome.staged, sub.folder)
    if outcome.staged:
        stored = course.api.autograde(assignment, sub.student, force=True, create=True)
        if not stored["success"]:
            result.status = "failed"
            result.problems.append(_outcome_of_nbgrader(stored))
            return result, []
        feedback = course.api.generate_feedback(assignment, sub.student, force=True)
        if not feedback["success"]:
            result.problems.append(f"feedback not written: {_outcome_of_nbgrader(feedback)}")
    else:
        result.status = "ungradable"
        zero_automatic_grades(course.db_url, assignment, sub.student)
    with Gradebook(course.db_url) as gb:
        # With nothing gradable, a student never graded before has no entry.
        _record_scores(result, gb, assignment, required=bool(outcome.staged))
    for key, (score, _) in outcome.scores.items():
        stored = result.cells.get(key)
        if stored not in ("", None) and float(stored) != score and not before:
            result.problems.append(f"internal: {key} scored {score:g} but nbgrader stored {stored}")
    conflicts = manual_conflicts(course.db_url, assignment, sub.student, before) if result.status == "graded" else []
    result.problems += conflicts
    return result, conflicts


def _unpack(submissions, assignment, expected, out, log):
    zip_problems = {}
    if submissions.is_file() and submissions.suffix.lower() == ".zip":
        unzipped = out / "unzipped"
        if unzipped.exists():
            shutil.rmtree(unzipped)
        unpacked = unpack_zip(submissions, assignment, expected, unzipped)
        for entry in unpacked.skipped:
            log(f"skipped {entry} in {submissions.name}: not a notebook of '{assignment}'")
        return unzipped, unpacked.problems
    if not submissions.is_dir():
        raise CourseError(f"submissions folder not found: {submissions}")
    return submissions, zip_problems


def grade(assignment, submissions, out=None, *, cell_timeout=None, notebook_timeout=None, workers=None,
          limits=None, log=print):
    # nbgrader's own gradebook code emits SQLAlchemy warnings that say nothing
    # to an instructor.
    warnings.filterwarnings("ignore", module="nbgrader")
    warnings.filterwarnings("ignore", message=".*not in session.*")
    started = time.monotonic()
    # nbgrader and Jupyter start their tools by name: find them beside this
    # interpreter even when its bin/ folder is not on PATH.
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    limits = limits or Limits(call_timeout_s=cell_timeout or CELL_TIMEOUT_S)
    if limits.isolate:
        why = namespaces_available()
        if why:
            raise EnvironmentProblem(f"student code cannot be isolated on this machine: {why}. Grading with "
                                     "process limits only is possible with --no-namespaces (student code could "
                                     "then read what this user can read, the course included).")
    else:
        log("warning: --no-namespaces: student code runs with process limits only; it can read what this user "
            "can read, the course and its hidden tests included")
    unmetered = cgroups.unavailable()
    if unmetered:
        log(f"warning: memory is measured without cgroups ({unmetered}): memory hidden from the in-process "
            f"measurement (threads, children, mappings, reused buffers) is seen only above "
            f"{OUTSIDE_SLACK_BYTES // 2**20} MiB. Grade as root with a writable /sys/fs/cgroup to measure it exactly.")
    out = Path(out) if out else Path("grading") / assignment
    expected = [nb.name for nb in source_notebooks(assignment)]
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o700)  # student processes run as other users and must not see in
    submissions, zip_problems = _unpack(Path(submissions), assignment, expected, out, log)
    subs = find_submissions(submissions, assignment, expected)
    for sub in subs:
        sub.problems[:0] = zip_problems.get(sub.student, [])
    if not subs:
        raise CourseError(f"no submissions for '{assignment}' in {submissions} "
                          f"(expected folders like {submissions}/<student>/{assignment}/)")

    backup = backup_gradebook(out)
    if backup:
        log(f"gradebook backed up to {backup}")
    cell_timeout = cell_timeout or CELL_TIMEOUT_S
    course = _prepare_course(assignment, out, cell_timeout)
    release = {name: str(out / "release" / assignment / name) for name in expected}
    source = {name: str(out / "source" / assignment / name) for name in expected}
    released = {name: release_sources(release[name]) for name in expected}
    if limits.memory_bytes and os.path.exists("/dev/nvidiactl"):
        # CUDA reserves far more virtual memory than any address-space limit would allow.
        log("a GPU driver is present: student processes get no address-space limit (CUDA needs the room)")
        limits.memory_bytes = 0
    kernels = ""
    if uses_triton(assignment):
        # Decided here, before any worker starts: the workers and the students' processes
        # inherit the choice (coursekit.triton_env).
        from coursekit import triton_env

        kernels = triton_env.where_kernels_run()
        log(f"Triton kernels run {kernels}")
        problem = triton_env.interpreter_problem() if triton_env.interpreting() else None
        if problem:   # every student's kernel with a loop would fail: their zeros, not theirs to own
            raise EnvironmentProblem(f"{problem} Under it every kernel that loops would fail, the students' "
                                     "and the grader's alike.")
    workers = max(1, workers or os.cpu_count() or 1)
    stage_root = out / "work"
    if stage_root.exists():
        shutil.rmtree(stage_root)

    flags = []
    for sub in subs:
        for name in sub.notebooks:
            flags += scan_notebook(sub.student, sub.folder / name, released[name])
    jobs = {sub.student: Job(student=sub.student, folder=str(sub.folder), notebooks=list(sub.notebooks),
                             release=release, source=source, stage=str(stage_root / sub.student),
                             cell_timeout=cell_timeout, notebook_timeout=notebook_timeout or NOTEBOOK_TIMEOUT_S,
                             limits=limits) for sub in subs}
    by_student = {sub.student: sub for sub in subs}
    results, conflicts = {}, []
    progress = Progress(len(subs), log)
    log(f"grading {len(subs)} submission(s) of '{assignment}' with {min(workers, len(subs))} worker(s)")
    # Workers start as fresh interpreters: forking a process that has threads
    # (PyTorch's, a test runner's) can leave a lock held forever in the child.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(subs)), mp_context=context) as pool:
        futures = {pool.submit(grade_student, job): job.student for job in jobs.values()}
        for future in as_completed(futures):
            try:
                outcome = future.result()
            except Exception as exc:  # a worker died (BrokenProcessPool) or the grader has a bug
                outcome = Outcome(student=futures[future], grader_error=f"{type(exc).__name__}: {exc}")
            if outcome.environment:
                for f in futures:
                    f.cancel()
                raise EnvironmentProblem(outcome.environment)
            sub = by_student[outcome.student]
            result, notes = _record(course, assignment, out, sub, outcome, jobs[sub.student].stage)
            flags += [Flag(sub.student, nb, cell, "", reason, detail) for nb, cell, reason, detail in outcome.flags]
            result.flagged = any(f.student == sub.student for f in flags)
            conflicts += [(sub.student, n) for n in notes]
            results[sub.student] = result
            progress.step(result)

    shutil.rmtree(stage_root, ignore_errors=True)  # the executed notebooks are in submitted/ now
    ordered = [results[sub.student] for sub in subs]
    grades_csv = out / "grades.csv"
    partial = grades_csv.with_suffix(".csv.partial")
    _write_csv(partial, ordered, course.grade_cells)
    partial.replace(grades_csv)  # never a half-written grades.csv, even if the run is killed
    flagged = write_report(out, flags)
    summary = Summary(results=ordered, grades_csv=grades_csv, seconds=time.monotonic() - started,
                      flagged=flagged, conflicts=conflicts, kernels=kernels)
    log(f"graded {summary.count('graded')}, ungradable {summary.count('ungradable')}, "
        f"failed {summary.count('failed') + summary.count('error')}, flagged {len(flagged)} "
        f"of {len(ordered)} submissions in {summary.seconds:.0f} s")
    for student, note in conflicts:
        log(f"manual grade kept for {student}: {note}")
    log(f"grades: {grades_csv}")
    log(f"integrity: {len(flagged)} student(s) flagged for review; see {out / 'integrity.txt'}")
    log(f"feedback: {out / 'feedback'}/<student>/{assignment}/")
    if kernels:
        log(f"Triton kernels ran {kernels}")
    if summary.count("error"):
        log("error: the grader itself failed on some submissions (status 'error' in grades.csv); their scores "
            "were not recorded. Please report it with the submission.")
    return summary
