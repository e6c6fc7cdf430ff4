"""Calling a student's function: the one failure type a check raises, and a
call that turns any student error into that failure. Used by the grader's
checks (autograde.compare re-exports both) and by the probes that run in the
student's process, so a failure raised on either side is the same class."""
import contextlib
import io
import warnings

import numpy as np


class GradingFailure(AssertionError):
    """A check failed; the message is written for the student."""


def call(fn, *args, what, **kwargs):
    """Call a student function. Warnings are silenced (nbgrader scores any
    output on stderr as a failure) and exceptions become a clear failure."""
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            return fn(*args, **kwargs)
    except NotImplementedError:
        raise GradingFailure(f"{what} raised NotImplementedError: the function is not written yet.") from None
    except Exception as exc:  # any student error is a failed check, not a crash
        raise GradingFailure(f"{what} raised {type(exc).__name__}: {exc}") from None
