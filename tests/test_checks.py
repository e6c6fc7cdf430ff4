"""The hidden checks, run in-process: they accept the references and correct
answers in other styles, and reject planted mistakes with messages a student
can act on. (test_grading runs the same through nbgrader.)"""
import nbformat
import numpy as np
import pytest

from autograde.checks import principles as checks
from autograde.compare import GradingFailure
from autograde.reference import principles as ref
from tests.conftest import REPO
from tests.notebooks import hidden_checks, nbgrader_meta, solution_code
from tests.submissions import principles as cases

SOURCE = REPO / "solutions" / cases.ASSIGNMENT / "principles.ipynb"
# The checks exactly as the notebook's hidden test cells call them.
CHECKS = hidden_checks(SOURCE)


def namespace(overrides):
    """A student's functions as the notebook defines them: every solution
    cell's code, with `overrides` (grade_id -> code) in place of some, all
    sharing one namespace so later functions call the earlier ones."""
    nb = nbformat.read(SOURCE, as_version=4)
    ns = {"np": np}
    for cell in nb.cells:
        meta = nbgrader_meta(cell)
        if meta.get("solution") and cell.cell_type == "code":
            exec(overrides.get(meta["grade_id"], solution_code(cell)), ns)
    return ns


@pytest.mark.parametrize("cell", sorted(CHECKS))
def test_checks_accept_the_reference(cell):
    check, name = CHECKS[cell]
    assert check(namespace({})[name]) is None  # None: nbgrader must not read a partial score


@pytest.mark.parametrize("case", sorted(cases.CORRECT))
def test_checks_accept_other_correct_styles(case):
    ns = namespace(cases.CORRECT[case])
    for check, name in CHECKS.values():
        check(ns[name])


@pytest.mark.parametrize("case", sorted(cases.BUGGY))
def test_checks_reject_exactly_the_planted_mistakes(case):
    overrides, loses = cases.BUGGY[case]
    ns = namespace(overrides)
    for cell, (check, name) in CHECKS.items():
        if cell in loses:
            with pytest.raises(GradingFailure) as err:
                check(ns[name])
            assert name in str(err.value), f"the message should name {name}: {err.value}"
        else:
            check(ns[name])


def test_unwritten_functions_get_a_plain_message():
    def stub(*args, **kwargs):
        raise NotImplementedError()

    with pytest.raises(GradingFailure, match="not written yet"):
        checks.check_softmax_any_axis(stub)


def test_failure_messages_point_at_the_fix():
    ns = namespace({"softmax": cases.SOFTMAX_UNSTABLE})
    with pytest.raises(GradingFailure, match="Subtract the maximum"):
        checks.check_softmax_stable(ns["softmax"])
    ns = namespace({"scaled_dot_product_attention": cases.SDPA_NO_SCALING})
    with pytest.raises(GradingFailure, match="1/sqrt"):
        checks.check_sdpa_batched_and_masked(ns["scaled_dot_product_attention"])


def test_warnings_from_student_code_do_not_reach_stderr(capfd):
    """nbgrader scores any stderr output in a test cell as a failure."""
    def noisy_softmax(x, axis=-1):
        import warnings
        warnings.warn("harmless")
        return ref.softmax(x, axis)

    checks.check_softmax_any_axis(noisy_softmax)
    assert capfd.readouterr().err == ""
