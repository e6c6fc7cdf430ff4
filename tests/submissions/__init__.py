"""Planted submissions for the grading tests: typical student mistakes (each
must lose exactly the points it should) and correct answers written in other
styles (each must get full marks)."""
from tests.submissions import complexity, flash, principles, variants

# One module per assignment: ASSIGNMENT, NOTEBOOK, BUGGY and CORRECT.
CLASSES = {module.ASSIGNMENT: module for module in (principles, variants, complexity, flash)}


def notebook_paths(assignment):
    """(instructor notebook, student notebook) of an assignment."""
    from tests.conftest import REPO

    notebook = CLASSES[assignment].NOTEBOOK
    return REPO / "solutions" / assignment / notebook, REPO / "exercises" / assignment / notebook


def points_per_cell(assignment):
    """grade_id -> points of every autograded test cell of the assignment."""
    from tests.notebooks import graded_test_cells

    return graded_test_cells(notebook_paths(assignment)[0])
