"""Writing autograder.zip in Gradescope's format: setup.sh and run_autograder
at the root, the settings chosen here in gradescope.json, and under course/
the instructor-only files the grader needs (never handed to students, and
never visible to student code, which runs in the sandbox)."""
import json
import stat
import zipfile
from pathlib import Path

import nbformat

from autograde.course import EXERCISES, REPO, SOLUTIONS, CELL_TIMEOUT_S, CourseError, source_notebooks
from autograde.gradescope import SETTINGS, VISIBILITIES
from autograde.grade import NOTEBOOK_TIMEOUT_S

HERE = Path(__file__).resolve().parent
# The grader and what runs in the student's process; nothing of the book.
PACKAGES = ("autograde", "student_runtime", "coursekit", "bookutils")
FILES = ("requirements.txt", "pyproject.toml")
SKIPPED_PARTS = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache"}
EXECUTABLE = ("setup.sh", "run_autograder")
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the same inputs give the same zip


def points(assignment):
    """(autograded points, hand-graded points) of the assignment's notebooks."""
    auto = manual = 0.0
    for path in source_notebooks(assignment):
        for cell in nbformat.read(path, as_version=4).cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("grade"):
                if meta.get("solution"):
                    manual += float(meta.get("points", 0))
                else:
                    auto += float(meta.get("points", 0))
    return auto, manual


def settings(assignment, *, hidden_visibility="after_published", isolate=True, cell_timeout=None,
             notebook_timeout=None, memory_limit_mib=None):
    if hidden_visibility not in VISIBILITIES:
        raise CourseError(f"unknown visibility '{hidden_visibility}' (Gradescope's are {', '.join(VISIBILITIES)})")
    return {"assignment": assignment, "hidden_visibility": hidden_visibility, "isolate": bool(isolate),
            "cell_timeout": cell_timeout or CELL_TIMEOUT_S, "notebook_timeout": notebook_timeout or NOTEBOOK_TIMEOUT_S,
            "memory_limit_mib": memory_limit_mib}


def _entries(assignment):
    """(path in the zip, file on disk) for everything the zip holds but its settings."""
    yield from ((name, HERE / name) for name in EXECUTABLE)
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*")):
            if path.is_file() and not SKIPPED_PARTS & set(path.parts) and path.suffix != ".pyc":
                yield f"course/{path.relative_to(REPO).as_posix()}", path
    for folder in (SOLUTIONS / assignment, EXERCISES / assignment):
        for path in sorted(folder.glob("*.ipynb")):
            yield f"course/{path.relative_to(REPO).as_posix()}", path
    for name in FILES:
        yield f"course/{name}", REPO / name


def _write(archive, name, data, mode):
    info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = (stat.S_IFREG | mode) << 16
    archive.writestr(info, data)


def build(assignment, out, **options):
    """Write out/autograder.zip for `assignment`; returns its path."""
    source_notebooks(assignment)  # an unknown assignment is the instructor's error, said plainly
    release = sorted((EXERCISES / assignment).glob("*.ipynb"))
    if not release:
        raise CourseError(f"no student notebook in {EXERCISES / assignment}: run ./scripts/generate first")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    target = out / "autograder.zip"
    partial = target.with_suffix(".zip.partial")
    with zipfile.ZipFile(partial, "w") as archive:
        for name, path in _entries(assignment):
            _write(archive, name, path.read_bytes(), 0o755 if name in EXECUTABLE else 0o644)
        _write(archive, SETTINGS, json.dumps(settings(assignment, **options), indent=2) + "\n", 0o644)
    partial.replace(target)
    return target
