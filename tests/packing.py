"""Planted submissions packed into few notebooks, for the tests that grade them
through the real pipeline (test_grading.py, test_gradescope.py).

A notebook run costs the same whichever functions a planted change touches, and
most of it re-checks functions the change cannot reach. So changes that reach
disjoint sets of test cells share one notebook: each test cell of a packed
notebook sees at most one planted change, and grades as it would with that
change alone. Every change is still graded through the whole pipeline, and
test_checks.py checks each one alone, in-process."""
import ast
from functools import cache

import nbformat

from tests.notebooks import nbgrader_meta
from tests.submissions import CLASSES, notebook_paths


def _names(code):
    return {node.id for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Name)}


@cache
def _test_cells(assignment):
    """grade_id -> the names a graded test cell reads."""
    cells = nbformat.read(notebook_paths(assignment)[0], as_version=4).cells
    return {nbgrader_meta(c)["grade_id"]: _names(c.source) for c in cells
            if nbgrader_meta(c).get("grade") and not nbgrader_meta(c).get("solution")}


def reached_cells(assignment, overrides):
    """The test cells whose verdict `overrides` may change: those that name a graded
    function the change reaches (test_checks.affected). None: it may change any."""
    from tests.test_checks import CHECKS, affected  # test_checks imports this package's CLASSES

    reach = affected(assignment, overrides)
    if reach is None:
        return None
    return {gid for gid, names in _test_cells(assignment).items() if names & reach}


def overrides_of(assignment, kind, member):
    entry = getattr(CLASSES[assignment], kind)[member]
    return entry[0] if kind == "BUGGY" else entry


@cache
def packed(assignment, kind):
    """((notebook name, members), ...) for `kind` "BUGGY" or "CORRECT": members taken
    in name order, each into the first notebook whose members reach none of its test
    cells and replace none of its solution cells; a change that may reach every
    cell has a notebook of its own."""
    groups = []  # [reached cells or None, replaced grade_ids, members]
    for member in sorted(getattr(CLASSES[assignment], kind)):
        overrides = overrides_of(assignment, kind, member)
        cells = reached_cells(assignment, overrides)
        home = None if cells is None else next(
            (g for g in groups if g[0] is not None and not g[0] & cells and not g[1] & set(overrides)), None)
        if home is None:
            home = [None if cells is None else set(), set(), []]
            groups.append(home)
        if cells is not None:
            home[0] |= cells
        home[1] |= set(overrides)
        home[2].append(member)
    return tuple((f"packed_{kind.lower()}_{i:02d}", tuple(members)) for i, (_, _, members) in enumerate(groups))


def notebook_of(assignment, member):
    """The packed notebook that holds a planted member."""
    for kind in ("BUGGY", "CORRECT"):
        for name, members in packed(assignment, kind):
            if member in members:
                return name
    raise KeyError(member)


def packed_overrides(assignment, kind, members):
    """One notebook's changes: its members' overrides together (they replace different cells)."""
    merged = {}
    for member in members:
        merged.update(overrides_of(assignment, kind, member))
    return merged


def packed_loses(assignment, members):
    """The test cells a packed notebook of planted mistakes must lose: its members' together."""
    return set().union(*(CLASSES[assignment].BUGGY[m][1] for m in members))
