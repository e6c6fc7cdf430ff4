"""Looking for the marks an answer or a hidden test leaves in what students
receive. This tree holds no answers to compare with, so it checks what the
instructor's tools leave behind: nbgrader's solution and hidden-test markers,
rubric blocks, imports of the grader's checks and references, and graded
cells that are anything but the stub a student fills in."""
import re
from pathlib import Path

import nbformat

MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS", "BEGIN MARK SCHEME",
           "autograde.checks", "autograde.reference")
TEXT_SUFFIXES = {".html", ".txt", ".js", ".json", ".ipynb", ".md", ".py", ".css", ".inv", ".xml", ".yml", ".toml"}
STUB = re.compile(r"(raise NotImplementedError\(\)|YOUR CODE HERE|YOUR ANSWER HERE)")


def marker_leaks(folder):
    """(file, marker) for every instructor marker found in a text file under folder."""
    found = []
    tests = Path(folder) / "tests"  # this suite's own code names the markers it looks for
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file() and path.suffix in TEXT_SUFFIXES and tests not in path.parents:
            text = path.read_text(encoding="utf-8", errors="replace")
            found += [(path, marker) for marker in MARKERS if marker in text]
    return found


def unstubbed_cells(notebook):
    """grade_ids of the notebook's answer cells that hold more than a stub."""
    nb = nbformat.read(notebook, as_version=4)
    bad = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and not STUB.search(cell.source):
            bad.append(meta.get("grade_id", "?"))
    return bad


def answer_leaks(folder):
    leaks = [(p, f"marker {m!r}") for p, m in marker_leaks(folder)]
    for notebook in sorted(Path(folder).rglob("*.ipynb")):
        leaks += [(notebook, f"answer cell {g!r} is not a stub") for g in unstubbed_cells(notebook)]
    return leaks
