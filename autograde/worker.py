"""The part of grading one student that runs in a worker process: check each
notebook's structure against the release, execute it (student code
sandboxed, tests here), and stage the executed notebook for the single
process that writes the gradebook. Returns plain data only."""
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from autograde.execute import execute_notebook, submitted_passes
from autograde.sandbox import EnvironmentFailure, Limits
from autograde.structure import normalize_file

@dataclass
class Job:
    student: str
    folder: str  # the student's submitted notebooks
    notebooks: list  # names that could be read
    release: dict  # name -> release notebook path
    source: dict  # name -> instructor notebook path
    stage: str  # folder for the executed notebooks
    cell_timeout: float
    notebook_timeout: float
    limits: Limits


@dataclass
class Outcome:
    student: str
    staged: list = field(default_factory=list)  # executed notebook names in the stage folder
    problems: list = field(default_factory=list)  # sentences for the student's row
    flags: list = field(default_factory=list)  # (notebook, cell, reason, detail) for the integrity report
    scores: dict = field(default_factory=dict)  # "notebook:grade_id" -> (score, points)
    environment: str = ""  # the grading environment is broken: nothing here may be recorded
    grader_error: str = ""  # a bug in the grader: reported, not recorded as the student's zero
    seconds: float = 0.0


def _grade_notebook(job, name, outcome):
    normalized = normalize_file(Path(job.folder) / name, job.release[name], job.source[name])
    for a in normalized.anomalies:
        if a.suspicious:
            outcome.flags.append((name, a.cell, f"notebook structure: {a.kind}", a.detail))
    if normalized.ungradable:
        outcome.problems.append(normalized.ungradable)
        return
    changed = [a.detail for a in normalized.anomalies if a.suspicious]
    if changed:
        outcome.problems.append(f"{name}: " + "; ".join(changed))
    run = execute_notebook(normalized.notebook, cell_timeout=job.cell_timeout,
                           notebook_timeout=job.notebook_timeout, limits=job.limits)
    stem = Path(name).stem
    for gid, (score, points) in run.scores.items():
        outcome.scores[f"{stem}:{gid}"] = (score, points)
    for kind, cell, detail in run.events:
        outcome.flags.append((name, cell, f"execution: {kind}", detail))
        outcome.problems.append(f"{name} {cell}: {detail}")
    for what, cell, detail in run.sightings:
        outcome.flags.append((name, cell, f"sandbox: {what}", detail))
    try:
        submitted = nbformat.read(Path(job.folder) / name, as_version=4)
        for gid, passed in submitted_passes(submitted).items():
            score, points = run.scores.get(gid, (None, None))
            if passed and score is not None and score < points:
                outcome.flags.append((name, gid, "passed as submitted, failed when graded",
                                      f"the submitted notebook shows {gid} passing; the grader's run failed it "
                                      f"({run.messages.get(gid, '')[:300]}). Stale outputs, or code that "
                                      "fooled the test in the student's own run"))
    except Exception:  # the comparison is advisory; the normalized notebook was readable
        pass
    path = Path(job.stage) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(run.notebook, path)
    outcome.staged.append(name)


_BOUNDED = False
# What a grading worker may always add to its heap: its tests compute expected
# answers, whatever limit the students' processes get.
WORKER_MEMORY_FLOOR_BYTES = 2 * 2**30


def bound_memory(extra_bytes):
    """Let this worker's heap grow by at most extra_bytes from now on. The
    grader's own side runs code on a student's behalf (callbacks, checks on
    what the student returned); past the bound a MemoryError fails that
    student's call or test, instead of the machine running out of memory."""
    import resource

    global _BOUNDED
    if _BOUNDED or not extra_bytes:
        return
    try:
        with open("/proc/self/status") as fh:
            data = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmData:"))
    except (OSError, StopIteration, ValueError):
        return
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    soft = data + extra_bytes
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
    _BOUNDED = True


def grade_student(job):
    """Worker entry point: an Outcome, whatever the submission does."""
    import time

    # As much room as a student's process gets, and never less than the grader
    # itself needs (none where a GPU needs it unbounded).
    if job.limits.memory_bytes:
        bound_memory(max(job.limits.memory_bytes, WORKER_MEMORY_FLOOR_BYTES))
    started = time.monotonic()
    outcome = Outcome(student=job.student)
    for name in job.notebooks:
        try:
            _grade_notebook(job, name, outcome)
        except EnvironmentFailure as exc:
            outcome.environment = str(exc)
            break
        except Exception:  # the grader's own bug: say so rather than record a zero
            outcome.grader_error = f"{name}: {traceback.format_exc(limit=-3)}"
            break
    outcome.seconds = time.monotonic() - started
    return outcome
