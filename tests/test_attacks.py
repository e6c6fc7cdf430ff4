"""Hostile submissions graded in one batch with honest ones, through the real
command: each attack gains nothing, costs only its own student, and is flagged
where it should be; the honest students in the same batch get full marks.
Chapter 1's batch attacks the machinery, Chapter 2's the sandbox's watch on
PyTorch and on the grader's helpers, Chapter 4's the checks of kernels."""
import csv
import sqlite3
import sys

import pytest

from tests.attacks import ATTACKS, CH2_ATTACKS, FLASH_ATTACKS
from tests.conftest import REPO, run
from tests.notebooks import filled_submission, graded_test_cells, write_submission

pytestmark = pytest.mark.filterwarnings("ignore::nbformat.warnings.DuplicateCellId")  # planted on purpose

ASSIGNMENT = "ch1_principles"
NOTEBOOK = "principles.ipynb"
SOURCE = REPO / "solutions" / ASSIGNMENT / NOTEBOOK
RELEASE = REPO / "exercises" / ASSIGNMENT / NOTEBOOK
POINTS = graded_test_cells(SOURCE)

SOFTMAX = {"test_softmax", "test_softmax_any_axis", "test_softmax_stable"}
SDPA = {"test_scaled_dot_product_attention", "test_sdpa_batched_and_masked", "test_sdpa_extreme_scores"}
MHA = {"test_multi_head_attention", "test_mha_hidden"}
JVP = {"test_softmax_jvp", "test_softmax_jvp_hidden"}
GAP = {"test_commuting_permutations", "test_commuting_permutations_hidden"}
ATTENTION_CHECKS = {"test_passes_attention_checks", "test_attention_checks_accept_correct",
                    "test_attention_checks_catch_bugs"}
SOFTMAX_HIDDEN = {"test_softmax_any_axis", "test_softmax_stable"}
SDPA_HIDDEN = {"test_sdpa_batched_and_masked", "test_sdpa_extreme_scores"}
TORCH_USE = "sandbox: uses PyTorch where the answer is graded as NumPy code"
HELPERS_CHANGED = "sandbox: changes the grader's helpers in its process"
DISAGREE = "sandbox: memory measurements disagree"

# attack -> (test cells it must lose, integrity reasons it must be flagged with)
EXPECTED = {
    # The student's softmax is wrong, so everything built on it (attention, heads, the Jacobian)
    # fails too; the patched allclose also blinds the student's own attention checks, which
    # then accept the plainest mistake.
    "allclose_patch": (SOFTMAX | SDPA | MHA | JVP | ATTENTION_CHECKS,
                       {"rebinds an attribute of a course library", "passed as submitted, failed when graded"}),
    "always_equal": (SOFTMAX | SDPA | MHA | JVP, set()),
    "always_equal_object": (GAP, set()),
    "input_transformer": (SDPA | MHA | GAP | JVP | ATTENTION_CHECKS, {"uses the IPython shell (get_ipython)"}),
    "grading_marker": (set(), set()),
    "reads_hidden_tests": (SOFTMAX | SDPA | MHA | JVP, set()),  # the paths are in variables: no pattern to see
    # Seen as it runs: its path is under /tmp, which the static scan leaves to the student.
    "writes_gradebook": (set(), {"sandbox: opens a file outside its folder"}),
    "loops_in_function": (SDPA | MHA, {"execution: process-lost"}),
    "memory_bomb": (MHA, set()),
    "fork_bomb": (MHA, {"execution: process-lost"}),
    "stderr_warnings": (set(), set()),
    "deletes_test_cells": (SOFTMAX | SDPA | MHA | JVP, {"notebook structure: missing-cell"}),
    "duplicates_test_cells": (set(), {"notebook structure: duplicate-cell"}),
    "renames_cells": (set(), {"notebook structure: unknown-cell", "notebook structure: missing-cell"}),
    "changes_points": (JVP, {"notebook structure: points-changed"}),
    "code_cell_made_markdown": (set(), set()),
    "unusual_but_correct": (set(), set()),
    # Reaching for the answers, each other's work or the machine: nothing is there to reach.
    "imports_references": (SOFTMAX | SDPA | MHA | JVP, {"sandbox: imports the instructor's package"}),
    "imports_checks_dynamically": (SOFTMAX | SDPA | MHA | JVP, {"sandbox: imports the instructor's package"}),
    "reads_solutions": (SOFTMAX | SDPA | MHA | JVP, {"sandbox: opens a file outside its folder"}),
    "copies_a_classmate": (SOFTMAX | SDPA | MHA | JVP, {"sandbox: opens a file outside its folder"}),
    "opens_the_network": (set(), {"sandbox: uses the network"}),
    "drops_a_file_for_others": (set(), {"sandbox: opens a file outside its folder"}),
    "picks_up_a_dropped_file": (SOFTMAX | SDPA | MHA | JVP, set()),
    # Its files fill the private /tmp (512 MiB), which is memory: the measured call is charged with them.
    "fills_the_disk": ({"test_softmax_jvp_hidden"}, {DISAGREE}),
    "zeroes_its_inputs": (SOFTMAX | SDPA | MHA | JVP, set()),
    "honest_scratch_a": (set(), set()),
    "honest_scratch_b": (set(), set()),
    # PyTorch where NumPy is graded: the hidden tests call the function in a process without PyTorch,
    # whatever thread or mode it hides in (the visible tests run where the student's Jupyter did).
    "torch_in_a_thread": (SDPA_HIDDEN, {TORCH_USE}),
    "torch_when_unwatched": (SOFTMAX_HIDDEN | SDPA_HIDDEN | {"test_softmax_jvp_hidden"},
                             {TORCH_USE, "uses the garbage collector (gc)"}),
    "rebinds_the_numpy_probe": (SDPA_HIDDEN, {TORCH_USE, HELPERS_CHANGED}),
    # Memory out of the in-process measurement's sight: the kernel counts it.
    "jacobian_in_a_thread": ({"test_softmax_jvp_hidden"}, {DISAGREE}),
    "jacobian_in_a_forked_child": ({"test_softmax_jvp_hidden"}, {DISAGREE, "sandbox: calls native code (ctypes)"}),
    "jacobian_in_a_kept_buffer": ({"test_softmax_jvp_hidden"}, {DISAGREE}),
    # Memory in files and shared mappings, made during the call or kept from a cell: every measured
    # call is charged with the student's files and shared memory, so only the memory cell is lost.
    "jacobian_in_a_tmp_file": ({"test_softmax_jvp_hidden"}, {DISAGREE}),
    "jacobian_in_a_kept_shared_mapping": ({"test_softmax_jvp_hidden"}, {DISAGREE}),
    "jacobian_through_a_file_kept_open": ({"test_softmax_jvp_hidden"}, {DISAGREE}),
    "rewrites_the_memory_probe": ({"test_softmax_jvp_hidden"},
                                  {"sandbox: replaces the code of a function", HELPERS_CHANGED}),
    # The grader's helpers changed while a test cell ran: that cell earns nothing.
    "tampers_while_graded": ({"test_softmax_jvp", "test_softmax_jvp_hidden"}, {HELPERS_CHANGED}),
    # The grader's own function, called back on an input whose scores need gigabytes: bounded.
    "calls_back_with_a_huge_input": (ATTENTION_CHECKS, {"sandbox: makes a grader function exceed its bounds"}),
    "honest_scratch_in_tmp": (set(), set()),
    "honest_notes_in_a_measured_call": (set(), set()),
    # The sandbox's machinery: a full audit pipe, a folder tree too deep for a recursive clean-up,
    # System V shared memory that outlives its process, a builtin the visible tests call.
    "floods_the_audit_pipe": (set(), {"sandbox: floods its audit report"}),
    "deep_folder_tree": (set(), set()),
    "leaves_shared_memory": (set(), {"sandbox: calls native code (ctypes)"}),
    "picks_up_shared_memory": (SOFTMAX | SDPA | MHA | JVP, {"sandbox: calls native code (ctypes)"}),
    "shadows_a_builtin": (GAP, set()),
}
HONEST = ("honest_a", "honest_b", "honest_c")


def graded_batch(assignment, submitted, out, options, timeout):
    """Grade a folder of submissions with the real command: the grades.csv rows by
    student, the integrity report's (student, reason) pairs and the command's output."""
    proc = run([sys.executable, "-m", "autograde", "grade", assignment, str(submitted), "--out", str(out),
                *options], timeout=timeout)
    assert proc.returncode == 0, f"grading command failed:\n{proc.stdout}\n{proc.stderr}"
    with (out / "grades.csv").open() as fh:
        rows = {row["student_id"]: row for row in csv.DictReader(fh)}
    with (out / "integrity.csv").open() as fh:
        flags = [(row["student_id"], row["reason"]) for row in csv.DictReader(fh)]
    return {"rows": rows, "flags": flags, "stdout": proc.stdout}


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    root = tmp_path_factory.mktemp("attacks")
    submitted, out = root / "submitted", root / "grading"
    for name in HONEST:
        write_submission(submitted, name, ASSIGNMENT, NOTEBOOK, filled_submission(RELEASE, SOURCE))
    for name, build in ATTACKS.items():
        write_submission(submitted, name, ASSIGNMENT, NOTEBOOK, build(RELEASE, SOURCE, out.resolve()))
    return {**graded_batch(ASSIGNMENT, submitted, out, ["--timeout", "20", "--memory-limit", "2048"], 1800),
            "out": out}


def scores(row):
    return {gid: float(row[f"principles:{gid}"]) for gid in POINTS}


def test_every_attack_has_an_expectation():
    assert set(EXPECTED) == set(ATTACKS)


@pytest.mark.parametrize("student", HONEST)
def test_honest_students_in_the_same_batch_get_full_marks(batch, student):
    row = batch["rows"][student]
    assert row["status"] == "graded"
    assert scores(row) == POINTS
    assert student not in {s for s, _ in batch["flags"]}


@pytest.mark.parametrize("attack", sorted(EXPECTED))
def test_each_attack_loses_exactly_what_it_should(batch, attack):
    row = batch["rows"][attack]
    lost = {gid for gid, s in scores(row).items() if s != POINTS[gid]}
    assert lost == EXPECTED[attack][0], f"{attack}: {row['problems']}"
    assert float(row["max_score"]) == sum(POINTS.values()) + 2  # points claimed in the notebook do not count


@pytest.mark.parametrize("attack", sorted(EXPECTED))
def test_each_attack_is_flagged_as_it_should(batch, attack):
    reasons = {reason for student, reason in batch["flags"] if student == attack}
    assert EXPECTED[attack][1] <= reasons, f"{attack}: flagged for {reasons}"
    if not EXPECTED[attack][1]:
        assert not reasons & {"execution: process-lost", "notebook structure: missing-cell"}


def test_the_gradebook_survives_an_attempt_to_rewrite_it(batch):
    db = sqlite3.connect(batch["out"] / "gradebook.db")
    manual = db.execute("SELECT count(*) FROM grade WHERE manual_score IS NOT NULL").fetchone()[0]
    assert manual == 0
    proc = run([sys.executable, "-m", "nbgrader", "export", "--to", "export.csv"], cwd=batch["out"])
    assert proc.returncode == 0, proc.stderr
    with (batch["out"] / "export.csv").open() as fh:
        exported = {row["student_id"]: float(row["raw_score"]) for row in csv.DictReader(fh)}
    assert exported["writes_gradebook"] == sum(POINTS.values())
    assert exported["honest_a"] == sum(POINTS.values())


@pytest.mark.parametrize("student", ["honest_scratch_a", "honest_scratch_b", "honest_scratch_in_tmp",
                                     "honest_notes_in_a_measured_call"])
def test_scratch_files_and_helper_modules_are_private_and_unflagged(batch, student):
    assert student not in {s for s, _ in batch["flags"]}


def test_the_fork_bomb_is_stopped_and_named(batch):
    assert "fork bomb" in batch["rows"]["fork_bomb"]["problems"]


def test_a_function_that_never_returns_is_stopped_at_each_call(batch):
    assert "stopped answering within the time limit" in batch["rows"]["loops_in_function"]["problems"]


def test_the_summary_counts_flagged_students(batch):
    flagged = {student for student, _ in batch["flags"]}
    assert f"flagged {len(flagged)} of {len(HONEST) + len(ATTACKS)} submissions" in batch["stdout"]


# ------------------------------------------------------------------ Chapter 2

CH2 = "ch2_variants"
CH2_NOTEBOOK = "variants.ipynb"
CH2_SOURCE, CH2_RELEASE = REPO / "solutions" / CH2 / CH2_NOTEBOOK, REPO / "exercises" / CH2 / CH2_NOTEBOOK
CH2_POINTS = graded_test_cells(CH2_SOURCE)
CH2_EXPECTED = {
    "decoder_layer_in_a_thread": ({"test_decoder_post_norm", "test_decoder_pre_norm"},
                                  {"sandbox: runs PyTorch's attention layers in DecoderLayer"}),
    "decoding_counter_rebound": ({"test_decode_with_kv_cache_hidden"}, {HELPERS_CHANGED}),
    "slope_in_torch_unless_probed": ({"test_slope_values", "test_slope_limits"}, {TORCH_USE}),
}


@pytest.fixture(scope="module")
def ch2_batch(tmp_path_factory):
    root = tmp_path_factory.mktemp("attacks_ch2")
    submitted, out = root / "submitted", root / "grading"
    write_submission(submitted, "honest", CH2, CH2_NOTEBOOK, filled_submission(CH2_RELEASE, CH2_SOURCE))
    for name, build in CH2_ATTACKS.items():
        write_submission(submitted, name, CH2, CH2_NOTEBOOK, build(CH2_RELEASE, CH2_SOURCE, out.resolve()))
    return graded_batch(CH2, submitted, out, ["--timeout", "60"], 1200)


def test_every_chapter_2_attack_has_an_expectation():
    assert set(CH2_EXPECTED) == set(CH2_ATTACKS)


@pytest.mark.parametrize("attack", sorted(CH2_EXPECTED) + ["honest"])
def test_chapter_2_attacks_lose_their_points_and_are_flagged(ch2_batch, attack):
    row = ch2_batch["rows"][attack]
    scores = {gid: float(row[f"variants:{gid}"]) for gid in CH2_POINTS}
    lost = {gid for gid, score in scores.items() if score != CH2_POINTS[gid]}
    lose, flagged = CH2_EXPECTED.get(attack, (set(), set()))
    assert lost == lose, f"{attack}: {row['problems']}"
    reasons = {reason for student, reason in ch2_batch["flags"] if student == attack}
    assert flagged <= reasons, f"{attack}: flagged for {reasons}"
    if attack == "honest":
        assert not reasons


# ------------------------------------------------------------------ Chapter 4: launchers graded as kernels

FLASH = "ch4_flash"
FLASH_SOURCE = REPO / "solutions" / FLASH / "flash.ipynb"
FLASH_RELEASE = REPO / "exercises" / FLASH / "flash.ipynb"
FLASH_POINTS = graded_test_cells(FLASH_SOURCE)
BWD_HIDDEN = {"test_bwd_output_hidden", "test_bwd_ragged_causal_hidden", "test_bwd_scale_hidden",
              "test_bwd_gqa_hidden", "test_bwd_memory_hidden"}
DECODE_HIDDEN = {"test_decode_output_hidden", "test_decode_split_hidden"}
CACHE_COPIED = {"test_decode_attention", "test_decode_in_place_hidden"}
OUTSIDE = "sandbox: results computed outside the Triton kernels"
LYING_COMPILE = "sandbox: its kernel's compiling process reported what the compiler did not make"

# attack -> (test cells it must lose, integrity reasons it must be flagged with). The
# memory and split cells award nothing to a launcher whose results are not its kernels'.
FLASH_EXPECTED = {
    "bwd_copies_inputs_then_numpy": (BWD_HIDDEN, {OUTSIDE}),
    # Its N x N tensors, made by PyTorch, fail the visible test too.
    "bwd_copies_inputs_then_torch": (BWD_HIDDEN | {"test_flash_attention_backward"}, {OUTSIDE}),
    "bwd_reads_the_flips": (BWD_HIDDEN, {OUTSIDE}),
    # Patching what the interpreter runs through spoils every later check of kernels, decoding's too.
    "bwd_hijacks_the_interpreter": (BWD_HIDDEN | DECODE_HIDDEN,
                                    {"sandbox: patches the libraries that run the kernels"}),
    # Their copies of the cache are seen by the visible test and the in-place cell as well.
    "decode_copies_cache_then_numpy": (DECODE_HIDDEN | CACHE_COPIED, {OUTSIDE}),
    "decode_kernel_scores_host_softmax": (DECODE_HIDDEN | CACHE_COPIED, {OUTSIDE}),
    # Its merge kernel does not compile; the lie told from inside the compiling process is seen.
    "decode_merge_lies_about_compiling": ({"test_decode_compiles_hidden"}, {LYING_COMPILE}),
}
FLASH_HONEST = ("honest_flash",)


@pytest.fixture(scope="module")
def flash_batch(tmp_path_factory):
    root = tmp_path_factory.mktemp("flash_attacks")
    submitted, out = root / "submitted", root / "grading"
    for name in FLASH_HONEST:
        write_submission(submitted, name, FLASH, "flash.ipynb", filled_submission(FLASH_RELEASE, FLASH_SOURCE))
    for name, overrides in FLASH_ATTACKS.items():
        write_submission(submitted, name, FLASH, "flash.ipynb",
                         filled_submission(FLASH_RELEASE, FLASH_SOURCE, overrides))
    return graded_batch(FLASH, submitted, out, ["--timeout", "60"], 3600)


def flash_scores(row):
    return {gid: float(row[f"flash:{gid}"]) for gid in FLASH_POINTS}


def test_every_flash_attack_has_an_expectation():
    assert set(FLASH_EXPECTED) == set(FLASH_ATTACKS)


def test_the_honest_flash_student_in_the_same_batch_gets_full_marks(flash_batch):
    for student in FLASH_HONEST:
        row = flash_batch["rows"][student]
        assert row["status"] == "graded"
        assert flash_scores(row) == FLASH_POINTS
        assert student not in {s for s, _ in flash_batch["flags"]}


@pytest.mark.parametrize("attack", sorted(FLASH_EXPECTED))
def test_each_flash_attack_loses_exactly_its_cells_and_is_flagged(flash_batch, attack):
    row = flash_batch["rows"][attack]
    lost = {gid for gid, s in flash_scores(row).items() if s != FLASH_POINTS[gid]}
    assert lost == FLASH_EXPECTED[attack][0], f"{attack}: {row['problems']}"
    reasons = {reason for student, reason in flash_batch["flags"] if student == attack}
    assert FLASH_EXPECTED[attack][1] <= reasons, f"{attack}: flagged for {reasons}"
