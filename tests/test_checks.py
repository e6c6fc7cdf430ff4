"""The hidden checks, run in-process: they accept the references and correct
answers in other styles, and reject planted mistakes with messages a student
can act on. (test_grading runs the same through nbgrader.)"""
import ast
import linecache

import nbformat
import numpy as np
import pytest

from autograde.checks import principles as checks
from autograde.checks import complexity as complexity_checks
from autograde.checks import variants as variant_checks
from autograde.compare import GradingFailure, record_margins
from autograde.reference import complexity as complexity_ref
from autograde.reference import principles as ref
from autograde.reference import variants as ref_variants
from tests.conftest import REPO
from tests.notebooks import hidden_checks, nbgrader_meta, solution_code
from tests.submissions import CLASSES, points_per_cell


def source(assignment):
    return REPO / "solutions" / assignment / CLASSES[assignment].NOTEBOOK


# The checks exactly as each notebook's hidden test cells call them.
CHECKS = {assignment: hidden_checks(source(assignment)) for assignment in CLASSES}


def run_cell(code, ns, label):
    """exec() a cell's code as Jupyter would: with its source in linecache, so
    that inspect.getsource (which @triton.jit needs) finds it."""
    filename = f"<cell {label}-{len(linecache.cache)}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
    exec(compile(code, filename, "exec"), ns)


def cells(assignment, overrides):
    """(label, code) of the cells that define a student's functions, in the
    notebook's order: the setup cell, the given cells that only define names
    (Chapter 4's forward kernel, which its capstone's solutions call), and every
    solution cell's code, with `overrides` (grade_id -> code) in place of some."""
    found = []
    for cell in nbformat.read(source(assignment), as_version=4).cells:
        meta = nbgrader_meta(cell)
        if meta.get("grade_id") == "setup":
            found.append(("setup", cell.source))
        elif cell.cell_type == "code" and not meta.get("solution") and not meta.get("grade") \
                and not _binds_and_reads(cell.source)[2]:
            found.append((meta["grade_id"], cell.source))   # a given cell that only defines (the book's kernel)
        elif meta.get("solution") and cell.cell_type == "code":
            found.append((meta["grade_id"], overrides.get(meta["grade_id"], solution_code(cell))))
    return found


def namespace(assignment, overrides):
    """A student's functions as the notebook defines them, all sharing one
    namespace so later functions call the earlier ones."""
    ns = {}
    for label, code in cells(assignment, overrides):
        run_cell(code, ns, label)
    return ns


def _binds_and_reads(code):
    """The names a cell binds at its top level, every name it reads, and whether
    its top level does anything else (a call, an attribute or item assignment)
    that could change what other cells see."""
    tree = ast.parse(code)
    binds, other = set(), False
    for node in tree.body:
        value = getattr(node, "value", None)
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            binds.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            binds |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and all(isinstance(t, ast.Name) for t in targets) \
                and not any(isinstance(n, ast.Call) for n in ast.walk(value or ast.Constant(None))):
            binds |= {t.id for t in targets}
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):  # not a docstring
            other = True
    return binds, {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}, other


def affected(assignment, overrides):
    """The student functions whose checks must run again with `overrides` in
    place: those that read, directly or through other names, a name that an
    override binds or that a replaced cell bound. Every other function runs
    exactly the code, with exactly the globals, that test_checks_accept_the_reference
    checks, so its checks give the same verdict. None: an override (or a cell it
    replaces) does more at its top level than bind names, so everything runs."""
    reference = dict(cells(assignment, {}))
    parsed = {label: _binds_and_reads(code) for label, code in reference.items()}
    replacing = [_binds_and_reads(code) for code in overrides.values()]
    if any(other for _, _, other in replacing) or any(parsed[gid][2] for gid in overrides):
        return None
    rebound = set().union(*(binds for binds, _, _ in replacing))
    binder = {name: label for label, (binds, _, _) in parsed.items() for name in binds}  # the last one wins
    changed = set()
    for name in {name for _, name in CHECKS[assignment].values()}:
        seen, todo = set(), [name]
        while todo:
            current = todo.pop()
            if current not in seen:
                seen.add(current)
                todo += parsed[binder[current]][1] if current in binder else []
        if seen & rebound or {binder.get(n) for n in seen} & set(overrides):
            changed.add(name)
    return changed


def cases(kind):
    return [(assignment, name) for assignment, module in CLASSES.items() for name in sorted(getattr(module, kind))]


# A correct answer stays within a quarter of every tolerance, on every draw: a
# tolerance fitted to one machine's rounding would leave another's no room.
MARGIN = 4


def expect_margin(margins, label):
    """Every comparison recorded (autograde.compare.record_margins) at most 1/MARGIN of its tolerance."""
    worst = max(margins, key=lambda m: m[1], default=("nothing compared", 0.0))
    assert worst[1] <= 1 / MARGIN, (f"{label}: a correct answer came within {1 / worst[1]:.1f}x of the tolerance "
                                    f"(at least {MARGIN}x is required): {worst[0]}")


@pytest.mark.parametrize("assignment, cell", [(a, c) for a in CHECKS for c in sorted(CHECKS[a])])
def test_checks_accept_the_reference(assignment, cell):
    check, name = CHECKS[assignment][cell]
    with record_margins() as margins:
        assert check(namespace(assignment, {})[name]) is None  # None: nbgrader must not read a partial score
    expect_margin(margins, f"the solution of {name}, {cell}")


# A planted submission changes one or two functions; the checks of the others
# would repeat test_checks_accept_the_reference's work exactly (same code, same
# globals, seeded inputs), so only the checks of the functions it can reach run.
@pytest.mark.parametrize("assignment, case", cases("CORRECT"))
def test_checks_accept_other_correct_styles(assignment, case):
    overrides = CLASSES[assignment].CORRECT[case]
    ns, rerun = namespace(assignment, overrides), affected(assignment, overrides)
    checked = 0
    for cell, (check, name) in CHECKS[assignment].items():
        if rerun is None or name in rerun:
            with record_margins() as margins:
                check(ns[name])
            expect_margin(margins, f"{case}, {cell}")
            checked += 1
    assert checked, f"{case} changes no graded function"


# The full suite grades every planted mistake through nbgrader (test_grading, which also
# checks the messages); in-process they are the quick suite's, and a quick way to debug one.
@pytest.mark.graded_again("test_grading.py", "test_planted_mistakes_lose_exactly_their_points")
@pytest.mark.parametrize("assignment, case", cases("BUGGY"))
def test_checks_reject_exactly_the_planted_mistakes(assignment, case):
    overrides, loses = CLASSES[assignment].BUGGY[case]
    ns, rerun = namespace(assignment, overrides), affected(assignment, overrides)
    for cell, (check, name) in CHECKS[assignment].items():
        if cell in loses:
            with pytest.raises(GradingFailure) as err:
                check(ns[name])
            assert name in str(err.value), f"the message should name {name}: {err.value}"
        elif rerun is None or name in rerun:
            check(ns[name])


def test_a_change_reaches_every_function_that_reads_it():
    """The functions affected() leaves out are those that cannot see the change."""
    softmax = "def softmax(x, axis=-1):\n    return np.exp(x) / np.exp(x).sum(axis, keepdims=True)\n"
    # scaled_dot_product_attention and softmax_jvp call softmax; multi_head_attention calls the former.
    assert affected("ch1_principles", {"softmax": softmax}) == {
        "softmax", "scaled_dot_product_attention", "softmax_jvp", "multi_head_attention"}
    assert affected("ch1_principles", {"softmax_jvp": "def softmax_jvp(x, u, axis=-1):\n    return u\n"}) \
        == {"softmax_jvp"}
    # A helper that an override defines under a name another cell reads reaches that cell too.
    assert "commuting_permutations" in affected(
        "ch1_principles", {"softmax_jvp": "import numpy as np\ndef softmax_jvp(x, u, axis=-1):\n    return u\n"})
    # Anything at the top level beyond binding names may change any function.
    for patch in ["np.exp = np.abs\n", "np.seterr(all='ignore')\n", "SEEN = open('/etc/hostname').read()\n"]:
        assert affected("ch1_principles", {"softmax_jvp": patch + "def softmax_jvp(x, u, axis=-1):\n    return u\n"}) \
            is None


def test_unwritten_functions_get_a_plain_message():
    def stub(*args, **kwargs):
        raise NotImplementedError()

    with pytest.raises(GradingFailure, match="not written yet"):
        checks.check_softmax_any_axis(stub)


def test_failure_messages_point_at_the_fix():
    principles = CLASSES["ch1_principles"]
    ns = namespace("ch1_principles", {"softmax": principles.SOFTMAX_UNSTABLE})
    with pytest.raises(GradingFailure, match="Subtract the maximum"):
        checks.check_softmax_stable(ns["softmax"])
    ns = namespace("ch1_principles", {"scaled_dot_product_attention": principles.SDPA_NO_SCALING})
    with pytest.raises(GradingFailure, match="1/sqrt"):
        checks.check_sdpa_batched_and_masked(ns["scaled_dot_product_attention"])
    for mistake, advice in [(principles.SYMMETRIES_ABSOLUTE_TOLERANCE, "relative to the size of f"),
                            (principles.SYMMETRIES_SAME_ROWS_ANY_ORDER, "row for row"),
                            (principles.SYMMETRIES_INVERSE_PERMUTATION, "not by the inverse")]:
        ns = namespace("ch1_principles", {"commuting_permutations": mistake})
        with pytest.raises(GradingFailure, match=advice):
            checks.check_commuting_permutations(ns["commuting_permutations"])
    for mistake, check, advice in [
            (principles.CHECKS_FLOAT_MASK, checks.check_attention_checks_accept_correct, "dtype float64.*Pass boolean"),
            (principles.CHECKS_PROBE_EMPTY_ROWS, checks.check_attention_checks_accept_correct,
             "a query may attend to no key; Exercise 2 excludes"),
            (principles.CHECKS_EXACT_EQUALITY, checks.check_attention_checks_accept_correct, "Compare with a tolerance"),
            (principles.CHECKS_LET_ERRORS_ESCAPE, checks.check_attention_checks_catch_bugs,
             "raised the attention's own error.*return False"),
            (principles.CHECKS_MASK_ON_SMALL_SCORES, checks.check_attention_checks_catch_bugs, "-1e4"),
            (principles.CHECKS_BY_CALL_COUNT, checks.check_attention_checks_catch_bugs, "decided without calling")]:
        ns = namespace("ch1_principles", {"passes_attention_checks": mistake})
        with pytest.raises(GradingFailure, match=advice):
            check(ns["passes_attention_checks"])
    ns = namespace("ch1_principles", {"scaled_dot_product_attention": principles.SDPA_FINITE_MASK})
    with pytest.raises(GradingFailure, match="finite penalty such as -1e4"):
        checks.check_sdpa_extreme_scores(ns["scaled_dot_product_attention"])
    variants = CLASSES["ch2_variants"]
    ns = namespace("ch2_variants", {"left_padded_causal_attention": variants.PADDED_ADDITIVE_PENALTY})
    with pytest.raises(GradingFailure, match="padding entries of size about.*rather than penalise"):
        variant_checks.check_left_padded_values(ns["left_padded_causal_attention"])
    ns = namespace("ch2_variants", {"entropy_temperature_slope": variants.SLOPE_GLOBAL_MAX})
    with pytest.raises(GradingFailure, match="rows at offsets.*each row's own maximum"):
        variant_checks.check_slope_limits(ns["entropy_temperature_slope"])
    ns = namespace("ch2_variants", {"decode_with_kv_cache": variants.DECODE_REBUILDS_CACHES})
    with pytest.raises(GradingFailure, match="Pass them on as they are"):
        variant_checks.check_decode_with_kv_cache(ns["decode_with_kv_cache"])
    ns = namespace("ch2_variants", {"left_padded_causal_attention": variants.PADDED_NAN_ROWS})
    with pytest.raises(GradingFailure, match="NaN or infinity.*return zeros"):
        variant_checks.check_left_padded_empty_rows(ns["left_padded_causal_attention"])
    ns = namespace("ch2_variants", {"decode_with_kv_cache": variants.DECODE_RECOMPUTES})
    with pytest.raises(GradingFailure, match="once per remaining token.*made 0 calls"):
        variant_checks.check_decode_with_kv_cache(ns["decode_with_kv_cache"])
    ns = namespace("ch2_variants", {"decode_step": variants.STEP_INTERLEAVED_GROUPS})
    with pytest.raises(GradingFailure, match=r"Query head h reads KV head h // \(n_heads // n_kv_heads\)"):
        variant_checks.check_decode_step(ns["decode_step"])
    ns = namespace("ch2_variants", {"entropy_temperature_slope": variants.SLOPE_RAW_MOMENTS})
    with pytest.raises(GradingFailure, match="near a million.*centre the scores"):
        variant_checks.check_slope_limits(ns["entropy_temperature_slope"])
    ns = namespace("ch2_variants", {"DecoderLayer": variants.DECODER_NOT_CAUSAL})
    with pytest.raises(GradingFailure, match="post-norm.*Self-attention is causal"):
        variant_checks.check_decoder_post_norm(ns["DecoderLayer"])
    complexity = CLASSES["ch3_complexity"]
    ns = namespace("ch3_complexity", {"dilated_local_attention": complexity.DILATED_FINITE_FILL})
    with pytest.raises(GradingFailure, match="a finite fill such as -1e4"):
        complexity_checks.check_dilated_extreme(ns["dilated_local_attention"])
    ns = namespace("ch3_complexity", {"dilated_local_attention": complexity.DILATED_TORCH_MASK})
    with pytest.raises(GradingFailure, match="peak memory.*MiB.*n x n array"):
        complexity_checks.check_dilated_memory(ns["dilated_local_attention"])
    ns = namespace("ch3_complexity", {"longest_fitting": complexity.FITTING_FIRST_THAT_DOES_NOT_FIT})
    with pytest.raises(GradingFailure, match=r"expected \d+, found \d+\. n = \d+ does not fit: cost\(\d+\) = \d+ is"):
        complexity_checks.check_fitting_models(ns["longest_fitting"])
    ns = namespace("ch3_complexity", {"longest_fitting": complexity.FITTING_LINEAR_SCAN})
    with pytest.raises(GradingFailure, match=r"called cost more than \d+ times.*doubling, then bisect"):
        complexity_checks.check_fitting_models(ns["longest_fitting"])
    ns = namespace("ch3_complexity", {"longest_fitting": complexity.FITTING_STARTS_AT_ZERO})
    with pytest.raises(GradingFailure, match=r"called cost\(0\): cost is defined for n >= 1 only"):
        complexity_checks.check_fitting_too_small(ns["longest_fitting"])
    ns = namespace("ch3_complexity", {"causal_linear_attention": complexity.CAUSAL_STATE_UPDATED_FIRST})
    with pytest.raises(GradingFailure, match=r"causal_linear_attention.*j <= t only"):
        complexity_checks.check_causal_linear_output(ns["causal_linear_attention"])


def test_attention_checks_are_shown_in_an_order_drawn_per_submission():
    """Two submissions see the implementations in different orders; the same one, graded
    again, in the same order; and the two anchors come twice each."""
    from autograde import draws

    def order(sources):
        draws.grading(sources)
        return [label for label, _, _ in checks._presented()]

    try:
        first, again, other = order(["a"]), order(["a"]), order(["b"])
    finally:
        draws.grading([])
    assert first == again and first != other and sorted(first) == sorted(other)
    assert first.count(checks.PLAIN_CORRECT) == first.count(checks.PLAIN_MISTAKE) == 2


def test_fitting_checks_refuse_what_the_cost_is_not_defined_for():
    """Floats and NumPy integers are refused even where their value is right, and a
    breach fails the check even when the submission catches the error it raises."""
    def float_argument(cost, budget):
        return complexity_ref.longest_fitting(lambda n: cost(float(n)), budget)

    def numpy_argument(cost, budget):
        return complexity_ref.longest_fitting(lambda n: cost(np.int64(n)), budget)

    def swallows_errors(cost, budget):
        try:
            cost(0)
        except Exception:
            pass
        return complexity_ref.longest_fitting(cost, budget)

    for fn, message in [(float_argument, "n = 1.0 of type float"), (numpy_argument, "of type int64"),
                        (swallows_errors, r"cost\(0\)")]:
        with pytest.raises(GradingFailure, match=message):
            complexity_checks.check_fitting_models(fn)
    complexity_checks.check_fitting_models(complexity_ref.longest_fitting)


def test_fitting_too_small_needs_the_budget_in_the_message():
    def silent(cost, budget):
        if cost(1) > budget:
            raise ValueError("too small")
        return complexity_ref.longest_fitting(cost, budget)

    with pytest.raises(GradingFailure, match="does not name the budget"):
        complexity_checks.check_fitting_too_small(silent)


def test_odd_width_check_needs_a_value_error():
    def wrong_exception(x, positions):
        assert x.shape[-1] % 2 == 0, "odd"
        return ref_variants.rotary_half_split(x, positions)

    with pytest.raises(GradingFailure, match="should raise ValueError.*raised AssertionError"):
        variant_checks.check_rope_rotation(wrong_exception)


def test_warnings_from_student_code_do_not_reach_stderr(capfd):
    """nbgrader scores any stderr output in a test cell as a failure."""
    def noisy_softmax(x, axis=-1):
        import warnings
        warnings.warn("harmless")
        return ref.softmax(x, axis)

    checks.check_softmax_any_axis(noisy_softmax)
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("assignment", sorted(CLASSES))
def test_packed_notebooks_keep_each_change_to_cells_of_its_own(assignment):
    """test_grading grades planted changes packed into shared notebooks (tests/packing.py):
    sound only if each mistake loses only cells it reaches, and no two members of a
    notebook reach the same cell or replace the same solution cell."""
    from tests.packing import overrides_of, packed, reached_cells

    tests = set(CHECKS[assignment]) | set(points_per_cell(assignment))
    for name, (overrides, loses) in CLASSES[assignment].BUGGY.items():
        reached = reached_cells(assignment, overrides)
        assert loses <= (tests if reached is None else reached), f"{name} loses cells it cannot reach"
    for kind in ("BUGGY", "CORRECT"):
        for notebook, members in packed(assignment, kind):
            seen_cells, seen_replaced = set(), set()
            for member in members:
                overrides = overrides_of(assignment, kind, member)
                reached = reached_cells(assignment, overrides)
                assert reached is not None or len(members) == 1, f"{notebook}: {member} may reach any cell"
                assert not (reached or set()) & seen_cells and not set(overrides) & seen_replaced, notebook
                seen_cells |= reached or set()
                seen_replaced |= set(overrides)


def test_the_split_check_a_student_runs_before_submitting():
    """Chapter 4's ungraded cell after Exercise 5's visible tests (the grader does not run it:
    its hidden test checks the split) passes the solution and every correct style, and stops
    a launcher that reads each cache in one program, or in NumPy, with a message naming it."""
    cell = next(c for c in nbformat.read(source("ch4_flash"), as_version=4).cells
                if nbgrader_meta(c).get("grade_id") == "decode_split_check")
    assert "not-run-when-graded" in cell.metadata.get("tags", [])
    flash = CLASSES["ch4_flash"]
    reaching = [name for name, overrides in flash.CORRECT.items()
                if (reached := affected("ch4_flash", overrides)) is None or "decode_attention" in reached]
    assert len(reaching) >= 3
    for case, overrides in [("solution", {})] + [(name, flash.CORRECT[name]) for name in reaching]:
        run_cell(cell.source, namespace("ch4_flash", overrides), case)
    for case in ("decode_one_program_per_head", "decode_copy_kernel_then_one_program_per_head", "decode_in_numpy"):
        with pytest.raises(AssertionError, match="decode_attention"):
            run_cell(cell.source, namespace("ch4_flash", flash.BUGGY[case][0]), case)
