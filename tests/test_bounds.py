"""bookutils.bounds: rounding down for lower bounds and up for upper bounds. Every expected
value is written out by hand."""
import math

import pytest

from bookutils.bounds import at_least, at_most


@pytest.mark.parametrize("x, digits, expected", [
    (0.89967, 2, 0.89),          # nearest would give 0.90, which is not a lower bound
    (0.99577, 3, 0.995),
    (33.83, 0, 33.0),
    (0.5988, 2, 0.59),
    (2.2848, 3, 2.284),
    (-0.123, 2, -0.13),          # down is towards minus infinity
    (1234.0, -2, 1200.0),
])
def test_at_least_rounds_down(x, digits, expected):
    assert at_least(x, digits) == expected


@pytest.mark.parametrize("x, digits, expected", [
    (0.4247, 2, 0.43),
    (0.105, 2, 0.11),
    (9.837, 1, 9.9),
    (0.4532, 2, 0.46),
    (0.0335, 2, 0.04),
    (3.7e-4, 3, 0.001),
    (-0.123, 2, -0.12),          # up is towards plus infinity
    (-0.001, 2, 0.0),
    (1234.0, -2, 1300.0),
])
def test_at_most_rounds_up(x, digits, expected):
    assert at_most(x, digits) == expected


def test_swapping_floor_and_ceil_fails():
    # the same value goes different ways: a swap of the two roundings breaks both lines
    assert at_least(0.4247, 2) == 0.42
    assert at_most(0.4247, 2) == 0.43


@pytest.mark.parametrize("x, digits", [(0.29, 2), (0.08, 2), (1.0, 2), (0.0, 3), (2.1, 1), (-0.57, 2), (100.0, 0)])
def test_values_on_the_grid_stay(x, digits):
    # 0.29 * 100 is 28.999999999999996 and 0.57 * 100 is 56.99999999999999 in floating point
    assert at_least(x, digits) == x and at_most(x, digits) == x


def test_rounding_error_next_to_a_grid_point_counts_as_on_it():
    # documented choice: within a relative 1e-12 of a grid point is on it
    assert 0.1 + 0.2 != 0.3
    assert at_most(0.1 + 0.2, 1) == 0.3
    assert at_least(0.3 - 1e-16, 1) == 0.3
    # a real difference, however small next to the printed precision, is not
    assert at_most(0.3 + 1e-9, 1) == 0.4
    assert at_least(0.3 - 1e-9, 1) == 0.2


@pytest.mark.parametrize("x, significant, low, high", [
    (5.28e-4, 1, 5e-4, 6e-4),
    (1.1123e-5, 1, 1e-5, 2e-5),
    (1.907e-6, 1, 1e-6, 2e-6),
    (8.88e-15, 1, 8e-15, 9e-15),
    (9.7e-6, 1, 9e-6, 1e-5),     # rounding up crosses the power of ten
    (1e-3, 1, 1e-3, 1e-3),       # a power of ten is on the grid
    (3.8534, 2, 3.8, 3.9),
    (-5.28e-4, 1, -6e-4, -5e-4),
    (0.0, 1, 0.0, 0.0),
])
def test_significant_digits(x, significant, low, high):
    assert at_least(x, significant=significant) == low
    assert at_most(x, significant=significant) == high


def test_the_printed_bound_is_the_bound():
    assert f"{at_least(0.89967, 2):.0%}" == "89%"
    assert f"{at_most(0.105, 2):.0%}" == "11%"
    assert f"{at_most(5.28e-4, significant=1):.0e}" == "6e-04"
    assert f"{at_most(9.7e-6, significant=1):.0e}" == "1e-05"


def test_bad_arguments():
    for bad in [dict(), dict(digits=2, significant=1)]:
        with pytest.raises(ValueError):
            at_least(0.5, **bad)
    with pytest.raises(ValueError):
        at_most(0.5, significant=0)
    for x in [math.nan, math.inf]:
        with pytest.raises(ValueError):
            at_most(x, 2)
