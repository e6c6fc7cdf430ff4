"""Instructor-side NumPy reference implementations, one module per chapter.
Hidden tests compare student functions with these; they never ship to students."""
