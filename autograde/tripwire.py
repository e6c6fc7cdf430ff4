"""A tripwire scan of what students wrote: code that reaches into the grader's
machinery (the IPython shell, the module table, builtins, the garbage
collector, C pointers), rebinds attributes of the libraries the checks use, or
leaves its process or folder. A hit is a flag for a person to look at, not a
verdict and not a defence; cells exactly as the release handed them out are
not scanned."""
import csv
import re
from dataclasses import dataclass

import nbformat

PATTERNS = {
    "uses the IPython shell (get_ipython)": r"\bget_ipython\b",
    "touches the module table (sys.modules)": r"\bsys\.modules\b",
    "touches builtins": r"\b__builtins__\b|\bimport\s+builtins\b|\bbuiltins\.",
    "uses ctypes": r"\bctypes\b",
    "uses the garbage collector (gc)": r"\bimport\s+gc\b|\bgc\.",
    "inspects frames or source (inspect)": r"\bimport\s+inspect\b|\binspect\.|\bsys\._getframe\b",
    "rebinds an attribute of a course library": r"^\s*(?:np|numpy|torch|triton|tl|autograde|coursekit|student_runtime|tracemalloc)(?:\.\w+)+\s*=(?!=)",
    "exits its process (os._exit)": r"\bos\._exit\b",
    # Code built from text at run time hides from this scan (a kernel's default argument that
    # rewrote the compile report once did); a method such as model.eval() is not a call of it.
    "runs code built from text (exec, eval, compile, __import__)":
        r"(?<![\w.])(?:exec|eval|compile|__import__)\s*\(",
    "opens a file outside its folder": r"\bopen\(\s*[rbf]?['\"](?:/(?!tmp/)|\.\.|~)",  # /tmp is the student's
    # Not an attack: the exercises ask for what the book did not write out, so
    # an answer built on the book's helpers deserves a person's look.
    "imports the book's helpers": r"^\s*(?:import|from)\s+bookutils\b|\b__import__\(\s*['\"]bookutils",
}
_COMPILED = {reason: re.compile(rx, re.M) for reason, rx in PATTERNS.items()}


@dataclass
class Flag:
    student: str
    notebook: str
    cell: str
    line: int
    reason: str
    code: str


def scan_notebook(student, path, release_sources):
    """Flags for the code cells of one submitted notebook that differ from every release cell."""
    nb = nbformat.read(path, as_version=4)
    flags = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or cell.source in release_sources:
            continue
        name = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") or f"cell {index + 1}"
        for reason, rx in _COMPILED.items():
            for match in rx.finditer(cell.source):
                line = cell.source.count("\n", 0, match.start()) + 1
                flags.append(Flag(student, path.name, name, line, reason, cell.source.split("\n")[line - 1].strip()))
    return flags


def release_sources(release_notebook):
    return {c.source for c in nbformat.read(release_notebook, as_version=4).cells if c.cell_type == "code"}


def write_report(out, flags):
    """integrity.csv (one row per flag) and integrity.txt (grouped by student, for reading)."""
    with (out / "integrity.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["student_id", "notebook", "cell", "line", "reason", "code"])
        for f in flags:
            writer.writerow([f.student, f.notebook, f.cell, f.line, f.reason, f.code])
    lines = ["Integrity report: code that reaches into the grader or outside the notebook, notebooks whose",
             "structure was changed, crashes and time limits, and tests that passed in the notebook as",
             "submitted but failed when graded. Each entry is for a person to review; scores are already",
             "those of the grader's own run.", ""]
    students = sorted({f.student for f in flags})
    for student in students:
        lines.append(f"{student}:")
        lines += [f"  {f.notebook} {f.cell}{f', line {f.line}' if f.line else ''}: {f.reason}: {f.code}"
                  for f in flags if f.student == student]
    if not students:
        lines.append("Nothing flagged.")
    (out / "integrity.txt").write_text("\n".join(lines) + "\n")
    return students
