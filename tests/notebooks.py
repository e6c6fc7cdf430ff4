"""Helpers for tests that build student submissions from the course notebooks."""
import importlib
import json
import re
from pathlib import Path

import nbformat

from autograde.course import solution_code  # noqa: F401  (the tests' submissions use it through here)


def nbgrader_meta(cell):
    return cell.get("metadata", {}).get("nbgrader", {})


def filled_submission(release_nb_path, source_nb_path, overrides=None, answer_text="The scaled scores shrink."):
    """The student notebook with every solution cell answered from the
    instructor's source, except the cells named in `overrides`
    (grade_id -> code), which get that code instead."""
    overrides = dict(overrides or {})
    release = nbformat.read(release_nb_path, as_version=4)
    source = nbformat.read(source_nb_path, as_version=4)
    answers = {nbgrader_meta(c).get("grade_id"): c for c in source.cells if nbgrader_meta(c).get("solution")}
    for cell in release.cells:
        meta = nbgrader_meta(cell)
        gid = meta.get("grade_id")
        if not meta.get("solution"):
            continue
        if cell.cell_type == "markdown":
            cell.source = answer_text
        elif gid in overrides:
            cell.source = overrides.pop(gid).strip("\n")
        else:
            cell.source = solution_code(answers[gid])
    if overrides:
        raise KeyError(f"no solution cells named {sorted(overrides)}")
    return release


def write_submission(root, student, assignment, name, notebook_or_text):
    folder = Path(root) / student / assignment
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if isinstance(notebook_or_text, str):
        path.write_text(notebook_or_text)
    else:
        nbformat.write(notebook_or_text, path)
    return path


HIDDEN_CALL = re.compile(r"from (autograde\.checks\.\w+) import (\w+)\n\2\((\w+)\)")


def hidden_checks(notebook_path):
    """grade_id -> (check function, name of the student function it checks),
    read from the hidden test cells: `from autograde.checks.X import check`
    followed by `check(function)`."""
    found = {}
    for cell in nbformat.read(notebook_path, as_version=4).cells:
        for module, check, function in HIDDEN_CALL.findall(cell.source):
            found[nbgrader_meta(cell)["grade_id"]] = (getattr(importlib.import_module(module), check), function)
    return found


def graded_test_cells(notebook_path):
    """grade_id -> points of the autograded test cells."""
    nb = json.loads(Path(notebook_path).read_text())
    return {nbgrader_meta(c)["grade_id"]: nbgrader_meta(c)["points"] for c in nb["cells"]
            if nbgrader_meta(c).get("grade") and not nbgrader_meta(c).get("solution")}
