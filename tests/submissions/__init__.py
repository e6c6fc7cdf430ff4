"""Planted submissions for the grading tests: typical student mistakes (each
must lose exactly the points it should) and correct answers written in other
styles (each must get full marks)."""
from tests.submissions import complexity, flash, principles, variants

# One module per assignment: ASSIGNMENT, NOTEBOOK, BUGGY and CORRECT.
CLASSES = {module.ASSIGNMENT: module for module in (principles, variants, complexity, flash)}
