"""Gradescope autograders built from the course's own grading pipeline.

    python -m autograde gradescope ch1_principles --out DIR   # writes DIR/autograder.zip

`build` writes the zip (autograde.gradescope.build); inside Gradescope's
container, `run_autograder` calls `python -m autograde.gradescope.run`, which
grades the one submission with autograde.grade.grade, the function behind
`./scripts/grade`, and turns its grades into Gradescope's results.json."""

# Everything of the autograder lives under this folder; tests point the
# variable at a temporary one.
ROOT_VARIABLE = "AUTOGRADER_ROOT"
DEFAULT_ROOT = "/autograder"
SETTINGS = "gradescope.json"  # in the zip: the assignment and the grading options chosen at build time
VISIBILITIES = ("visible", "after_due_date", "after_published", "hidden")  # Gradescope's values
