"""Checks used by the hidden tests. Each failure raises `GradingFailure` whose
message says what was called, what was expected and what was found, in words a
student can act on. Helpers return None so nbgrader never reads a return value
as partial credit."""
import contextlib
import numbers

import numpy as np

from student_runtime.calls import GradingFailure, call  # noqa: F401  (the checks import them from here)


def describe(value):
    """Short human description of a value: type, dtype and shape."""
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape} and dtype {value.dtype}"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} items"
    return f"a {type(value).__name__}"


def expect_array(found, *, shape, what):
    if not isinstance(found, np.ndarray):
        raise GradingFailure(f"{what} should return a NumPy array of shape {shape}, but returned {describe(found)}.")
    if found.shape != tuple(shape):
        raise GradingFailure(f"{what} should return shape {tuple(shape)}, but returned shape {found.shape}.")
    if not np.issubdtype(found.dtype, np.floating):
        raise GradingFailure(f"{what} should return floating-point values, but returned dtype {found.dtype}.")


# Tolerances. The NumPy exercises compute in float64 on inputs of at most a few
# thousand elements per sum: the rounding error of any correct order of
# operations is below m * 2^-53 * sum|terms| ~ 1e-12 relative, so the default
# rtol = 1e-6, atol = 1e-9 is wider by many orders of magnitude than rounding
# and narrower by as many than any mistake (a missing factor, a wrong axis).
# Kernels in float32 or 16 bits are compared with element-wise error bounds
# (autograde.bounds, expect_within). record_margins() shows how close a correct
# answer comes to either.
_MARGINS = []


@contextlib.contextmanager
def record_margins():
    """Collects, for every comparison made inside, (what, largest |found - expected|
    over the tolerance at that element): 1 is the edge of acceptance."""
    found = []
    _MARGINS.append(found)
    try:
        yield found
    finally:
        _MARGINS.remove(found)


def _note_margin(what, ratio):
    for record in _MARGINS:
        record.append((what, float(ratio)))


def expect_close(found, expected, *, what, rtol=1e-6, atol=1e-9, hint=""):
    """Compare a student array with the reference, shape and values: within
    atol + rtol * |expected| at every element, as np.isclose."""
    expected = np.asarray(expected)
    found = _expect_finite_array(found, expected, what, hint)
    _expect_within_tolerance(found, expected, atol + rtol * np.abs(expected), what, hint)


def expect_within(found, expected, bound, *, what, hint=""):
    """Compare a student array with the reference within an element-wise error bound."""
    expected = np.asarray(expected)
    found = _expect_finite_array(found, expected, what, hint)
    _expect_within_tolerance(found, expected, np.asarray(bound, dtype=np.float64), what, hint)


def _expect_finite_array(found, expected, what, hint):
    if expected.shape == () and isinstance(found, (float, np.floating)):
        found = np.asarray(found)  # a NumPy or Python scalar is a fine 0-d result
    expect_array(found, shape=expected.shape, what=what)
    if not np.all(np.isfinite(found)):
        bad = np.argwhere(~np.isfinite(found))[0]
        raise GradingFailure(
            f"{what} returned a non-finite value ({found[tuple(bad)]}) at index {tuple(int(i) for i in bad)}; "
            f"the expected value there is {expected[tuple(bad)]:.6g}. {hint}".rstrip()
        )
    return found


def _expect_within_tolerance(found, expected, tolerance, what, hint):
    with np.errstate(invalid="ignore", over="ignore"):
        error = np.where(found == expected, 0.0, np.abs(found - expected))
        close = error <= tolerance
    if error.size:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(error == 0, 0.0, error / tolerance)
        _note_margin(what, np.nanmax(ratio) if np.isfinite(ratio).all() else np.inf)
    if not np.all(close):
        bad = tuple(int(i) for i in np.argwhere(~close)[0])
        worst = float(np.max(error))
        allowed = float(np.broadcast_to(tolerance, error.shape)[bad])
        raise GradingFailure(
            f"{what} is wrong at index {bad}: expected {expected[bad]:.6g}, found {found[bad]:.6g}, a difference of "
            f"{float(error[bad]):.3g} where rounding allows {allowed:.3g} ({int(np.sum(~close))} of {close.size} "
            f"entries differ; largest difference {worst:.3g}). {hint}".rstrip()
        )


def expect_int(found, expected, *, what, hint=""):
    """An exact integer count: a Python (or NumPy) integer, not a float or a bool."""
    if isinstance(found, bool) or not isinstance(found, numbers.Integral):
        raise GradingFailure(f"{what} should return an integer (a Python int), but returned {describe(found)}.")
    if int(found) != expected:
        raise GradingFailure(f"{what}: expected {expected}, found {int(found)}. {hint}".rstrip())


def expect_scalar(found, *, what):
    if isinstance(found, np.ndarray) and found.shape == ():
        found = found.item()
    if isinstance(found, bool) or not isinstance(found, (int, float, np.integer, np.floating)):
        raise GradingFailure(f"{what} should return a number, but returned {describe(found)}.")
    found = float(found)
    if not np.isfinite(found):
        raise GradingFailure(f"{what} returned {found}, which is not a finite number.")
    return found


def expect_unchanged(before, after, *, what):
    from autograde.sandbox import changed_in_place

    if changed_in_place(after) or not np.array_equal(before, after, equal_nan=True):
        raise GradingFailure(f"{what} modified its input array in place; work on a copy instead.")


def call_unchanged(fn, *args, what, **kwargs):
    """call(), then check that no array among the positional arguments was
    modified in place. The arguments are therefore safe to reuse afterwards,
    for the reference."""
    before = [a.copy() if isinstance(a, np.ndarray) else None for a in args]
    result = call(fn, *args, what=what, **kwargs)
    for b, a in zip(before, args):
        if b is not None:
            expect_unchanged(b, a, what=what)
    return result


def expect_sequence(result, length, *, what, names):
    """A tuple (or list) of `length` items, as in `return a, b`; names says which."""
    if not (isinstance(result, (tuple, list)) and len(result) == length):
        raise GradingFailure(f"{what} should return a tuple {names}, but returned {describe(result)}.")


def expect_value_error(fn, *args, what, reason):
    """fn(*args) must raise ValueError (or a subclass) because of `reason`; returns
    the error, for callers that check its message."""
    try:
        found = fn(*args)
    except ValueError as exc:
        return exc
    except Exception as exc:  # any other exception is the wrong answer, not a crash
        raise GradingFailure(f"{what} should raise ValueError because {reason}, but raised "
                             f"{type(exc).__name__}: {exc}") from None
    returned = found if isinstance(found, (int, float)) else describe(found)  # a number is shown as it is
    raise GradingFailure(f"{what} should raise ValueError because {reason}, but returned {returned}.")


def numpy_only(fn, *args, what):
    """fn(*args) for an exercise graded as NumPy code: PyTorch's softmax,
    attention or autograd would answer it in a few lines. A student's function
    runs in the student's process without PyTorch (autograde.execute binds the
    hidden tests' names there; one of the other process is looked up there by
    name), where using PyTorch fails. A local function runs under a recorder
    of PyTorch's operators."""
    from autograde.sandbox import Remote, in_student_process, student_function
    from student_runtime import probes

    if isinstance(fn, Remote):
        twin = fn._sandbox.twin
        if not fn._sandbox.torchless and twin is not None and "name" in fn._target:
            fn = student_function(twin, fn._target["name"])
        if fn._sandbox.torchless:
            return call(fn, *args, what=what)
    result, used = in_student_process(probes.torch_operators_used, fn, *args, what=what)
    if used:
        raise GradingFailure(f"{what} computed with PyTorch ({', '.join(used)}): this exercise asks for NumPy "
                             "(or plain Python) code that does the computation itself.")
    return result
