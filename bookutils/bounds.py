"""Rounding that keeps a bound true. Prose such as "at least 0.89" or "at most 2e-06" states a
bound, and a number rounded to the nearest can break it (0.89967 printed as 0.90 is not "at
least"). at_least rounds down and at_most rounds up, to `digits` decimals or to `significant`
significant digits; a page glues the result and prints it with the matching format (`.2f` for
digits=2, `.0%` for a fraction with digits=2, `.0e` for significant=1), which then shows it exactly.

A value within a relative GRID_TOL of a grid point counts as on it and is returned as that point:
0.29 * 100 is 28.999999999999996 in floating point, and 0.1 + 0.2 is 0.30000000000000004, both
rounding errors of the arithmetic that produced them, not part of the value measured. The
displayed bound can therefore be off by that relative amount, far below any printed precision."""
import math

GRID_TOL = 1e-12


def _bound(x, digits, significant, rounding):
    if (digits is None) == (significant is None):
        raise ValueError("give exactly one of digits and significant")
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"no bound for {x}")
    if significant is not None:
        if significant < 1:
            raise ValueError("significant must be at least 1")
        if x == 0:
            return 0.0
        exponent = math.floor(math.log10(abs(x)))
        if 10.0 ** exponent > abs(x):           # log10 rounded up across a power of ten
            exponent -= 1
        elif 10.0 ** (exponent + 1) <= abs(x):  # or down
            exponent += 1
        digits = significant - 1 - exponent
    scaled = x * 10.0 ** digits if digits >= 0 else x / 10.0 ** -digits
    nearest = round(scaled)
    if abs(scaled - nearest) <= GRID_TOL * abs(scaled):
        steps = nearest
    else:
        steps = rounding(scaled)
    # an integer over a power of ten: the float nearest the decimal, which a format prints exactly
    return steps / 10 ** digits if digits >= 0 else float(steps * 10 ** -digits)


def at_least(x, digits=None, *, significant=None):
    """The largest number of `digits` decimals (or of `significant` significant digits) that is
    not above x: x rounded down, a true lower bound."""
    return _bound(x, digits, significant, math.floor)


def at_most(x, digits=None, *, significant=None):
    """The smallest number of `digits` decimals (or of `significant` significant digits) that is
    not below x: x rounded up, a true upper bound."""
    return _bound(x, digits, significant, math.ceil)
