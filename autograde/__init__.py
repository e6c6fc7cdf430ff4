"""Grading support for the course: reference implementations, comparison
helpers used by hidden tests, the nbgrader configuration and the grading
command. Instructor-side only: nothing here ships in the student notebooks."""
