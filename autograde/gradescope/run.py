"""Grading one Gradescope submission: `python -m autograde.gradescope.run`.

The submission is graded by autograde.grade.grade, the function behind
`./scripts/grade`, as a class of one; its grades, the executed notebook and the
integrity report are then written as Gradescope's results.json:

- one test per autograded test cell, named after its exercise and what the cell
  checks (from the student notebook, so no hidden code), with the message of the
  student's feedback page (hidden tests: the check's message only);
- visible tests `visible`, hidden tests as chosen when the zip was built;
- written answers are left to Gradescope's manual grading;
- the grading log and the integrity report go to standard output, which
  results.json marks as hidden from students;
- a submission that cannot be graded (no notebook, a wrong name, several
  notebooks, another assignment's notebook, unreadable JSON) scores 0 with the
  reason; a failure of the grader or its environment writes no score at all,
  so that the instructor re-runs it instead of recording a zero."""
import csv
import json
import os
import re
import shutil
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograde.feedback import RedactHiddenTests
from autograde.gradescope import DEFAULT_ROOT, ROOT_VARIABLE, SETTINGS

STUDENT = "submission"  # the one student of the class graded here
HIDDEN_BEGIN = RedactHiddenTests.begin.default_value
EXERCISE_HEADING = re.compile(r"^#+\s*(Exercise\s+(\d+)\s*:\s*.*?)\s*(\([^()]*\))?\s*$", re.M)
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
MAX_OUTPUT_CHARS = 20_000  # one test's message; longer ones are cut (arrays printed in full can be huge)
ENVIRONMENT_STATUS, GRADER_STATUS = 3, 4  # as `./scripts/grade`


class GradingFailed(Exception):
    """Not the student's doing: no score may be recorded."""

    def __init__(self, message, status=GRADER_STATUS):
        super().__init__(message)
        self.status = status


@dataclass
class TestCell:
    notebook: str  # file name
    grade_id: str
    points: float
    hidden: bool
    name: str  # the exercise and what the cell checks
    number: str

    @property
    def cell(self):
        """The grades CSV's column for this cell: notebook:grade_id."""
        return f"{Path(self.notebook).stem}:{self.grade_id}"


def log(*parts):
    print(*parts, flush=True)


# ---------------------------------------------------------------- the assignment
def _comment(source):
    """The leading comment of a test cell, as one sentence-like line."""
    words = []
    for line in source.splitlines():
        if not line.startswith("#") or line.startswith("###"):
            break
        words.append(line.lstrip("#").strip())
    text = " ".join(w for w in words if w)
    return text.replace(" (run by the grader)", "")  # every test runs in the grader here


def test_cells(assignment):
    """The autograded test cells and the hand-graded answers, in notebook order.
    Names come from the student notebook; hidden-ness from the instructor's."""
    from autograde.course import EXERCISES, source_notebooks

    tests, written = [], []
    for source_path in source_notebooks(assignment):
        source = {c.metadata.get("nbgrader", {}).get("grade_id"): c
                  for c in nbformat.read(source_path, as_version=4).cells}
        release = nbformat.read(EXERCISES / assignment / source_path.name, as_version=4)
        exercise, number, count = "", "", 0
        for cell in release.cells:
            meta = cell.metadata.get("nbgrader", {})
            heading = EXERCISE_HEADING.search(cell.source) if cell.cell_type == "markdown" else None
            if heading and not meta.get("grade"):
                exercise, number, count = heading.group(1), heading.group(2), 0
            if not meta.get("grade"):
                continue
            points = float(meta.get("points", 0))
            if meta.get("solution"):
                written.append((exercise or meta["grade_id"], points))
                continue
            count += 1
            what = _comment(cell.source) or meta["grade_id"]
            instructor = source.get(meta["grade_id"])
            tests.append(TestCell(notebook=source_path.name, grade_id=meta["grade_id"], points=points,
                                  hidden=instructor is not None and HIDDEN_BEGIN in instructor.source,
                                  name=f"{exercise} | {what}" if exercise else what,
                                  number=f"{number}.{count}" if number else str(len(tests) + 1)))
    return tests, written


# ---------------------------------------------------------------- the submission
def submission_problem(folder, expected):
    """Why the files in `folder` are not a submission of the assignment's
    notebooks (a sentence for the student), or None."""
    files = sorted(p for p in Path(folder).rglob("*") if p.is_file()
                   and not any(part.startswith(".") or part == "__MACOSX" for part in p.relative_to(folder).parts))
    notebooks = [p for p in files if p.suffix.lower() == ".ipynb"]
    wanted = " and ".join(expected)
    names = ", ".join(p.relative_to(folder).as_posix() for p in (notebooks or files))
    if not files:
        return f"Nothing was submitted. Submit {wanted}."
    if not notebooks:
        return f"No Jupyter notebook was submitted (you submitted {names}). Submit {wanted}, the notebook " \
               "handed out with the assignment, with your answers in it."
    if len(notebooks) > len(expected):
        return f"Several notebooks were submitted ({names}). Submit only {wanted}."
    wrong = [p.name for p in notebooks if p.name not in expected]
    if wrong:
        return f"The notebook must be named {wanted}, the name it was handed out with; you submitted {names}. " \
               "Rename it and submit again."
    return None


def _place(folder, expected, target):
    target.mkdir(parents=True)
    for path in Path(folder).rglob("*.ipynb"):
        if path.name in expected and path.is_file() and not path.is_symlink():
            shutil.copyfile(path, target / path.name)


# ---------------------------------------------------------------- results
def _clip(text):
    text = ANSI.sub("", text).strip()
    return text if len(text) <= MAX_OUTPUT_CHARS else text[:MAX_OUTPUT_CHARS] + "\n... (cut)"


def _messages(executed):
    """grade_id -> what the student's feedback page says for that test cell."""
    found = {}
    redact = RedactHiddenTests()
    for index, cell in enumerate(executed.cells):
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.cell_type != "code" or not gid:
            continue
        cell, _ = redact.preprocess_cell(cell, {}, index)  # hidden tests: the check's message, no code
        errors = ["\n".join(o.get("traceback") or [f"{o.get('ename')}: {o.get('evalue')}"])
                  for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        printed = "".join(o.get("text", "") for o in cell.get("outputs", [])
                          if o.get("output_type") == "stream" and o.get("name") == "stdout")
        found[gid] = (errors, printed)
    return found


def _test_entry(test, score, messages, visibility):
    errors, printed = messages.get(test.grade_id, ([], ""))
    if score >= test.points:
        text = "Passed." + (f"\n{printed}" if printed.strip() and not test.hidden else "")
    else:
        text = "Failed.\n" + ("\n".join(errors) or "This test did not pass (it printed no message).")
    return {"name": test.name, "number": test.number, "score": score, "max_score": test.points,
            "output": _clip(text), "visibility": visibility, "extra_data": {"cell": test.cell}}


def _visibility(test, settings):
    return settings["hidden_visibility"] if test.hidden else "visible"


def rejected(reason, tests, written):
    """A submission that cannot be graded: 0 with the reason, every test at 0."""
    return {"score": 0.0, "output": reason + _written_note(written), "stdout_visibility": "hidden",
            "tests": [{"name": t.name, "number": t.number, "score": 0.0, "max_score": t.points,
                       "output": f"Not graded: {reason}", "visibility": "visible", "extra_data": {"cell": t.cell}}
                      for t in tests]}


def _written_note(written):
    if not written:
        return ""
    listed = "; ".join(f"{name} ({points:g} points)" for name, points in written)
    return f"\n\nGraded by hand in Gradescope, not by this autograder: {listed}."


def failed():
    """No score anywhere: Gradescope cannot record a zero from it. (run_autograder
    writes the same when Python itself cannot start.) The reason is in stdout."""
    return {"output": "Your submission could not be graded because of a problem with the autograder, not with "
                      "your work, and no score was recorded. Your instructor will grade it again.",
            "stdout_visibility": "hidden", "tests": []}


def _integrity(out):
    path = out / "integrity.csv"
    if not path.exists():
        return []
    with path.open() as fh:
        return list(csv.DictReader(fh))


def grade_submission(root, settings):
    """The results for root/submission (a dict for results.json) and the exit status."""
    from autograde.course import CourseError, source_notebooks
    from autograde.grade import EnvironmentProblem, grade
    from autograde.sandbox import Limits

    assignment = settings["assignment"]
    expected = [p.name for p in source_notebooks(assignment)]
    tests, written = test_cells(assignment)
    problem = submission_problem(root / "submission", expected)
    if problem:
        log(f"not graded: {problem}")
        return rejected(problem, tests, written), 0

    work = root / "grading"
    if work.exists():
        shutil.rmtree(work)
    _place(root / "submission", expected, work / "input" / STUDENT / assignment)
    out = work / "out"
    limits = Limits(call_timeout_s=settings["cell_timeout"])
    limits.isolate = settings["isolate"]
    if settings.get("memory_limit_mib"):
        limits.memory_bytes = int(settings["memory_limit_mib"]) * 2**20
    try:
        summary = grade(assignment, work / "input", out, cell_timeout=settings["cell_timeout"],
                        notebook_timeout=settings["notebook_timeout"], workers=1, limits=limits, log=log)
    except EnvironmentProblem as exc:
        raise GradingFailed(f"the grading environment is broken: {exc}", ENVIRONMENT_STATUS) from None
    except CourseError as exc:
        raise GradingFailed(f"the autograder is misconfigured: {exc}", ENVIRONMENT_STATUS) from None
    result = summary.results[0]
    flags = _integrity(out)
    log("integrity report (instructor only):")
    for row in flags:
        log(f"  {row['notebook']} {row['cell']}: {row['reason']}: {row['code']}")
    if not flags:
        log("  nothing flagged")
    if result.problems:
        log("problems: " + "; ".join(result.problems))
    if result.status in ("error", "failed"):
        raise GradingFailed(f"grading ended with status '{result.status}': {'; '.join(result.problems)}")
    if result.status == "ungradable":
        reason = "Your notebook could not be graded: " + " ".join(result.problems)
        return rejected(reason, tests, written), 0

    messages = {}
    for name in expected:
        executed = out / "autograded" / STUDENT / assignment / name
        if executed.exists():
            messages[Path(name).stem] = _messages(nbformat.read(executed, as_version=4))
    entries, total = [], 0.0
    for test in tests:
        stem = Path(test.notebook).stem
        score = result.cells.get(test.cell, "")
        score = float(score) if score not in ("", None) else 0.0
        total += score
        entries.append(_test_entry(test, score, messages.get(stem, {}), _visibility(test, settings)))
    return {"score": total, "output": _summary(tests, entries, written, flags, settings, summary.kernels),
            "stdout_visibility": "hidden", "tests": entries}, 0


def _summary(tests, entries, written, flags, settings, kernels=""):
    visible = [(t, e) for t, e in zip(tests, entries) if e["visibility"] == "visible"]
    lines = [f"Visible tests: {sum(e['score'] for _, e in visible):g} of {sum(t.points for t, _ in visible):g} "
             "points."]
    if kernels:
        lines.append(f"Your Triton kernels ran {kernels}.")
    if len(visible) < len(tests):
        when = {"after_due_date": "after the due date", "after_published": "when grades are published",
                "hidden": "to your instructor only"}[settings["hidden_visibility"]]
        lines.append(f"Hidden tests: {len(tests) - len(visible)}, worth "
                     f"{sum(t.points for t in tests) - sum(t.points for t, _ in visible):g} points; their results "
                     f"are shown {when}.")
    # What happened to the student's own cells (a cell that never finished, a process that exited) is
    # theirs to fix; everything else in the integrity report is for the instructor.
    test_ids = {t.grade_id for t in tests}
    for row in flags:
        if row["reason"].startswith("execution:") and row["cell"] not in test_ids:
            lines.append(f"When your cell {row['cell']} ran: {row['code']}")
    return "\n".join(lines) + _written_note(written)


def main(root=None):
    started = time.monotonic()
    root = Path(root or os.environ.get(ROOT_VARIABLE) or DEFAULT_ROOT)
    import autograde

    log(f"grader: {Path(autograde.__file__).parent}")
    status = 0
    try:
        settings = json.loads((root / "source" / SETTINGS).read_text())
        log(f"grading {settings['assignment']} with {json.dumps(settings)}")
        results, status = grade_submission(root, settings)
    except GradingFailed as exc:
        log(f"error: {exc}\nNo score was recorded; fix the autograder and regrade this submission.")
        results, status = failed(), exc.status
    except Exception:  # a bug in the grader: never the student's zero
        log("error: the grader failed:\n" + traceback.format_exc())
        results, status = failed(), GRADER_STATUS
    results["execution_time"] = round(time.monotonic() - started)
    target = root / "results" / "results.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".json.partial")
    partial.write_text(json.dumps(results, indent=2) + "\n")
    partial.replace(target)
    log(f"score: {results.get('score', 'none (not recorded)')}; results: {target}")
    return status


if __name__ == "__main__":
    sys.exit(main())
