"""Planted submissions for the grading tests: typical student mistakes (each
must lose exactly the points it should) and correct answers written in other
styles (each must get full marks)."""
