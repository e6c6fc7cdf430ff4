"""Finding and checking submitted notebooks before nbgrader sees them.

A damaged file must cost only its own student's points, with a reason the
instructor can read; it must never stop the batch."""
import json
from dataclasses import dataclass, field
from pathlib import Path

import nbformat


@dataclass
class Submission:
    student: str
    folder: Path  # <submissions>/<student>/<assignment>
    notebooks: list = field(default_factory=list)  # names that can be graded
    problems: list = field(default_factory=list)  # readable reasons, one per problem


def read_problem(path):
    """None if `path` is a readable notebook, else a sentence saying why not."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return f"{path.name} is not UTF-8 text, so it is not a notebook"
    except OSError as exc:
        return f"{path.name} could not be read ({exc.strerror or exc})"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"{path.name} is not valid notebook JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
    if not isinstance(data, dict) or "cells" not in data:
        return f"{path.name} is JSON but not a notebook (no 'cells' list)"
    try:
        nb = nbformat.reads(text, as_version=4)
        nbformat.validate(nb)
    except Exception as exc:  # nbformat raises several types for bad structure
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"{path.name} is not a valid notebook ({first})"
    return None


def find_submissions(submitted_dir, assignment, expected_notebooks):
    """One Submission per student folder that holds the assignment."""
    submitted_dir = Path(submitted_dir)
    found = []
    for student_dir in sorted(p for p in submitted_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        folder = student_dir / assignment
        if not folder.is_dir():
            continue
        sub = Submission(student=student_dir.name, folder=folder)
        for name in expected_notebooks:
            path = folder / name
            if not path.is_file():
                sub.problems.append(f"{name} is missing from the submission")
                continue
            problem = read_problem(path)
            if problem:
                sub.problems.append(problem)
            else:
                sub.notebooks.append(name)
        found.append(sub)
    return found
