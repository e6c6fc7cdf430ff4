"""Finding solution code, hidden tests and reference implementations in text
that students or readers receive (exercises/, the built site)."""
import html
import re
from pathlib import Path

import nbformat

from tests.conftest import REPO

MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS",
           "BEGIN MARK SCHEME", "autograde.checks", "autograde.reference")
TEXT_SUFFIXES = {".html", ".txt", ".js", ".json", ".ipynb", ".md", ".py", ".css", ".inv", ".xml"}


def normalize(line):
    return re.sub(r"\s+", " ", line).strip()


def _meaningful(lines):
    """Lines that say something: no blanks, comments, markers or lone keywords."""
    out = []
    for line in map(normalize, lines):
        if len(line) < 12 or line.startswith("#") or any(m in line for m in MARKERS):
            continue
        out.append(line)
    return out


def _windows(lines, size=2):
    return {"\n".join(lines[i:i + size]) for i in range(len(lines) - size + 1)} if len(lines) >= size else set(lines)


def _regions(source, begin, end):
    regions, current = [], None
    for line in source.split("\n"):
        if begin in line:
            current = []
        elif end in line and current is not None:
            regions.append(current)
            current = None
        elif current is not None:
            current.append(line)
    return regions


def secret_fragments():
    """Two-line windows of every solution region, hidden test region and
    reference implementation, and the sentences of hand-graded model answers."""
    fragments = set()
    for path in sorted((REPO / "solutions").rglob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if cell.cell_type == "markdown" and meta.get("solution"):
                text = re.sub(r"=== BEGIN MARK SCHEME ===.*", "", cell.source, flags=re.S)
                fragments |= {normalize(s) for s in re.split(r"(?<=[.:;])\s+", text) if len(s) > 40}
                continue
            for begin, end in (("BEGIN SOLUTION", "END SOLUTION"), ("BEGIN HIDDEN TESTS", "END HIDDEN TESTS")):
                for region in _regions(cell.source, begin, end):
                    fragments |= _windows(_meaningful(region))
    for path in sorted((REPO / "autograde" / "reference").glob("*.py")):
        body = re.sub(r'""".*?"""', "", path.read_text(), flags=re.S)
        fragments |= _windows(_meaningful(ln for ln in body.split("\n") if not ln.startswith(("import", "from"))))
    return {f for f in fragments if f}


def readable_text(path):
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".html":
        text = html.unescape(re.sub(r"<[^>]+>", "", text))
    return "\n".join(normalize(line) for line in text.split("\n"))


def find_leaks(folder, fragments=None):
    """(file, what) pairs for every marker or secret fragment found under folder."""
    fragments = secret_fragments() if fragments is None else fragments
    leaks = []
    for path in sorted(Path(folder).rglob("*")):
        if not path.is_file() or path.suffix not in TEXT_SUFFIXES:
            continue
        text = readable_text(path)
        for marker in MARKERS:
            if marker in text:
                leaks.append((path, marker))
        for fragment in fragments:
            if fragment in text:
                leaks.append((path, fragment))
    return leaks
