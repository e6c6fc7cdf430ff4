"""A submitted notebook's structure, checked against the assignment: the grader
gets the instructor's read-only and test cells (hidden tests included), every
nbgrader cell once with the release's points and types, the student's answers
and own cells, no outputs; what was wrong is listed, and damaged files never
raise."""
import copy
import json
from pathlib import Path

import nbformat
import pytest

from autograde.structure import Anomaly, describe, normalize, normalize_file

REPO = Path(__file__).resolve().parent.parent
RELEASE = REPO / "exercises/ch1_principles/principles.ipynb"
SOURCE = REPO / "solutions/ch1_principles/principles.ipynb"
ASSIGNMENTS = sorted(p.relative_to(REPO / "exercises") for p in (REPO / "exercises").glob("*/*.ipynb"))


def read(path):
    return nbformat.read(path, as_version=4)


@pytest.fixture(scope="module")
def release():
    return read(RELEASE)


@pytest.fixture(scope="module")
def source():
    return read(SOURCE)


def grade_id(cell):
    nbgrader = cell.metadata.get("nbgrader")
    return nbgrader.get("grade_id") if isinstance(nbgrader, dict) else None


def find(notebook, gid):
    return [cell for cell in notebook.cells if grade_id(cell) == gid]


def position(notebook, gid):
    return [grade_id(cell) for cell in notebook.cells].index(gid)


def anomalies(result):
    return sorted((a.kind, a.cell, a.suspicious) for a in result.anomalies)


def completed(release, source):
    """The release with every answer written (the source's solutions) and run (outputs present)."""
    notebook = copy.deepcopy(release)
    solutions = {grade_id(cell): cell.source for cell in source.cells if grade_id(cell)}
    for cell in notebook.cells:
        nbgrader = cell.metadata.get("nbgrader", {})
        if nbgrader.get("solution"):
            cell.source = solutions[grade_id(cell)]
        if cell.cell_type == "code":
            cell.execution_count = 3
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran\n")]
    return notebook


@pytest.fixture
def submission(release, source):
    return completed(release, source)


def check(submitted, release, source):
    result = normalize(submitted, release, source)
    assert result.ungradable is None
    nbformat.validate(result.notebook)
    return result


@pytest.mark.parametrize("assignment", ASSIGNMENTS, ids=str)
def test_a_completed_release_is_graded_as_the_instructor_wrote_it(assignment):
    release, source = read(REPO / "exercises" / assignment), read(REPO / "solutions" / assignment)
    submitted = completed(release, source)
    untouched = copy.deepcopy(submitted), copy.deepcopy(release), copy.deepcopy(source)
    result = check(submitted, release, source)
    assert result.anomalies == []
    assert (submitted, release, source) == untouched
    out = result.notebook
    assert len(out.cells) == len(release.cells)
    assert out.metadata == release.metadata
    for cell, expected in zip(out.cells, source.cells):
        # Every cell matches the source: hidden tests are in, answers are the student's (here the solutions).
        assert (cell.cell_type, cell.source) == (expected.cell_type, expected.source)
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    assert any("### BEGIN HIDDEN TESTS" in cell.source for cell in out.cells)


def test_the_release_as_handed_out_has_no_anomalies_and_keeps_its_stubs(release, source):
    result = check(release, release, source)
    assert result.anomalies == []
    assert find(result.notebook, "softmax")[0].source == find(release, "softmax")[0].source
    assert "### BEGIN HIDDEN TESTS" in find(result.notebook, "test_softmax_any_axis")[0].source


def test_submitting_the_source_itself_is_not_an_edit(source, release):
    """Its read-only cells are exactly what the grader puts there anyway."""
    result = check(source, release, source)
    assert anomalies(result) == []
    hidden = [c for c in result.notebook.cells if "### BEGIN HIDDEN TESTS" in c.source]
    assert len(hidden) == sum("### BEGIN HIDDEN TESTS" in c.source for c in source.cells) > 0


def test_an_edited_test_cell_is_restored_with_its_hidden_tests(submission, release, source):
    find(submission, "test_softmax_any_axis")[0].source = "pass"
    result = check(submission, release, source)
    assert find(result.notebook, "test_softmax_any_axis")[0].source == find(source, "test_softmax_any_axis")[0].source
    assert anomalies(result) == [("locked-cell-modified", "test_softmax_any_axis", True)]
    assert "replaced it by the instructor's version" in result.anomalies[0].detail


@pytest.mark.parametrize("gid", ["intro", "test_softmax_any_axis"])
def test_a_cell_of_an_earlier_release_is_replaced_without_a_flag(submission, release, source, gid):
    """The instructor corrects a prompt or a test after handing out the release this student
    began on: the student's copy still holds the old text, with the checksum nbgrader stored
    when it generated that release, and is replaced without suspicion. The same cell edited by
    the student no longer matches that checksum, and is flagged."""
    newer_release, newer_source = copy.deepcopy(release), copy.deepcopy(source)
    for notebook in (newer_release, newer_source):
        find(notebook, gid)[0].source += "\n\n# corrected after the first release"
    result = check(submission, newer_release, newer_source)
    assert anomalies(result) == [("earlier-release-cell", gid, False)]
    assert find(result.notebook, gid)[0].source == find(newer_source, gid)[0].source

    find(submission, gid)[0].source += " (and a student's edit)"
    assert anomalies(check(submission, newer_release, newer_source)) == [("locked-cell-modified", gid, True)]


def test_trailing_whitespace_in_a_read_only_cell_is_not_an_edit(submission, release, source):
    cell = find(submission, "setup")[0]
    cell.source = cell.source.replace("\n", "  \n") + "\n\n"
    assert check(submission, release, source).anomalies == []


def test_deleted_test_cells_are_reinserted_where_the_source_has_them(submission, release, source):
    for gid in ("test_softmax", "test_softmax_stable", "test_mha_hidden"):
        submission.cells.remove(find(submission, gid)[0])
    result = check(submission, release, source)
    assert [grade_id(c) for c in result.notebook.cells] == [grade_id(c) for c in source.cells]
    assert find(result.notebook, "test_mha_hidden")[0].source == find(source, "test_mha_hidden")[0].source
    assert anomalies(result) == [("missing-cell", gid, True)
                                 for gid in ("test_mha_hidden", "test_softmax", "test_softmax_stable")]
    assert "after softmax." in next(a.detail for a in result.anomalies if a.cell == "test_softmax")


def test_a_deleted_first_cell_returns_to_the_top_and_text_cells_are_not_suspicious(submission, release, source):
    submission.cells.pop(0)
    result = check(submission, release, source)
    assert grade_id(result.notebook.cells[0]) == "intro"
    assert anomalies(result) == [("missing-cell", "intro", False)]


def test_student_cells_are_kept_where_they_were(submission, release, source):
    mine = nbformat.v4.new_code_cell("helper = 42")
    submission.cells.insert(position(submission, "softmax"), mine)
    result = check(submission, release, source)
    assert result.anomalies == []
    assert result.notebook.cells[position(result.notebook, "softmax") - 1].source == "helper = 42"


def test_a_test_cell_copied_twice_runs_once(submission, release, source):
    at = position(submission, "test_softmax")
    for _ in range(2):
        submission.cells.insert(at + 1, copy.deepcopy(submission.cells[at]))
    result = check(submission, release, source)
    assert len(find(result.notebook, "test_softmax")) == 1
    assert len(result.notebook.cells) == len(release.cells)
    assert anomalies(result) == [("duplicate-cell", "test_softmax", True)] * 2


def test_a_copied_answer_cell_still_runs_as_an_ordinary_cell(submission, release, source):
    at = position(submission, "softmax")
    copied = copy.deepcopy(submission.cells[at])
    copied.source = "def softmax(x, axis=-1):\n    return x  # second try\n"
    copied.id = "second-try"   # Jupyter gives a pasted cell an id of its own
    submission.cells.insert(at + 1, copied)
    result = check(submission, release, source)
    out = result.notebook
    assert len(find(out, "softmax")) == 1
    plain = out.cells[position(out, "softmax") + 1]
    assert plain.source == copied.source and "nbgrader" not in plain.metadata and plain.cell_type == "code"
    assert anomalies(result) == [("duplicate-cell", "softmax", False)]


def test_changed_points_are_restored(submission, release, source):
    find(submission, "test_softmax")[0].metadata.nbgrader.points = 100
    find(submission, "written_gradient_sums")[0].metadata.nbgrader.points = 100
    find(submission, "written_gradient_sums")[0].source = "My answer."
    result = check(submission, release, source)
    assert find(result.notebook, "test_softmax")[0].metadata.nbgrader.points == 1
    answer = find(result.notebook, "written_gradient_sums")[0]
    assert answer.metadata.nbgrader.points == 2 and answer.source == "My answer."
    assert anomalies(result) == [("points-changed", "test_softmax", True), ("points-changed", "written_gradient_sums", True)]
    assert "test_softmax: points changed from 1 to 100; restored to 1." in describe(result.anomalies)


def test_changed_nbgrader_flags_are_restored(submission, release, source):
    find(submission, "softmax")[0].metadata.nbgrader.update(grade=True, points=5)
    result = check(submission, release, source)
    assert find(result.notebook, "softmax")[0].metadata.nbgrader == find(release, "softmax")[0].metadata.nbgrader
    assert anomalies(result) == [("metadata-changed", "softmax", True), ("points-changed", "softmax", True)]


def test_a_renamed_answer_cell_keeps_its_code_and_gets_no_stub(submission, release, source):
    cell = find(submission, "softmax")[0]
    cell.metadata.nbgrader.grade_id = "my_softmax"
    result = check(submission, release, source)
    out = result.notebook
    assert find(out, "softmax") == [] and find(out, "my_softmax") == []
    assert cell.source in [c.source for c in out.cells]
    assert find(release, "softmax")[0].source not in [c.source for c in out.cells]
    assert anomalies(result) == [("missing-solution-cell", "softmax", False), ("unknown-cell", "my_softmax", True)]


def test_a_renamed_test_cell_is_not_graded_and_the_real_one_returns(submission, release, source):
    find(submission, "test_softmax_any_axis")[0].metadata.nbgrader.grade_id = "free_points"
    result = check(submission, release, source)
    out = result.notebook
    assert find(out, "free_points") == []
    assert find(out, "test_softmax_any_axis")[0].source == find(source, "test_softmax_any_axis")[0].source
    assert position(out, "test_softmax_any_axis") == position(out, "test_softmax") + 1
    assert anomalies(result) == [("missing-cell", "test_softmax_any_axis", True),
                                 ("unknown-cell", "free_points", True)]


def test_an_answer_turned_into_markdown_runs_as_code_again(submission, release, source):
    at = position(submission, "softmax")
    old = submission.cells[at]
    submission.cells[at] = nbformat.v4.new_markdown_cell(old.source, metadata=old.metadata, id=old.id)
    result = check(submission, release, source)
    cell = find(result.notebook, "softmax")[0]
    assert cell.cell_type == "code" and cell.source == old.source
    assert anomalies(result) == [("cell-type-changed", "softmax", False)]


def test_broken_nbgrader_metadata_leaves_an_ordinary_cell(submission, release, source):
    submission.cells.insert(0, nbformat.v4.new_code_cell("a = 1", metadata={"nbgrader": "oops"}))
    submission.cells.insert(1, nbformat.v4.new_code_cell("b = 2", metadata={"nbgrader": {"grade": True}}))
    result = check(submission, release, source)
    assert [c.source for c in result.notebook.cells[:2]] == ["a = 1", "b = 2"]
    assert all("nbgrader" not in c.metadata for c in result.notebook.cells[:2])
    assert anomalies(result) == [("bad-metadata", "", False)] * 2


def test_cell_ids_end_up_unique_and_valid(submission, release, source):
    submission.cells[3].id = submission.cells[2].id
    submission.cells[4].id = "not a valid id!"
    del submission.cells[5]["id"]
    result = check(submission, release, source)
    ids = [cell.id for cell in result.notebook.cells]
    assert len(set(ids)) == len(ids)
    assert ids[2] == submission.cells[2].id
    assert anomalies(result) == [("duplicate-cell-id", "", False)]


def test_a_notebook_without_ids_gets_them(submission, release, source):
    old = json.loads(nbformat.writes(submission))
    old["nbformat_minor"] = 4
    for cell in old["cells"]:
        del cell["id"]
    result = check(nbformat.from_dict(old), release, source)
    assert result.anomalies == [] and result.notebook.nbformat_minor >= 5


def test_a_moved_cell_is_reported_and_left_in_place(submission, release, source):
    submission.cells.insert(0, submission.cells.pop(position(submission, "test_softmax")))
    result = check(submission, release, source)
    assert position(result.notebook, "test_softmax") == 0
    assert anomalies(result) == [("cell-moved", "test_softmax", False)]


def test_cells_nbformat_rejects_are_repaired(submission, release, source):
    answer = find(submission, "softmax")[0]
    answer.metadata["collapsed"] = "yes"
    submission.cells.insert(0, 7)
    submission.cells.insert(1, {"cell_type": "heading", "source": "# Old", "metadata": {}})
    submission.cells.insert(2, {"cell_type": "code", "source": 12, "metadata": {"tags": [1, 1]}})
    result = check(submission, release, source)
    assert result.notebook.cells[0].cell_type == "raw" and result.notebook.cells[0].source == "# Old"
    assert result.notebook.cells[1].source == "" and result.notebook.cells[1].metadata == {}
    assert find(result.notebook, "softmax")[0].source == answer.source
    assert {a.kind for a in result.anomalies} == {"bad-cell"}


def test_another_assignments_notebook_is_ungradable(release, source):
    other = completed(read(REPO / "exercises/ch2_variants/variants.ipynb"),
                      read(REPO / "solutions/ch2_variants/variants.ipynb"))
    result = normalize(other, release, source)
    assert result.notebook is None
    assert result.ungradable.startswith("none of its cells belong to this assignment")


@pytest.mark.parametrize("submitted", [None, [], {"cells": "x"}, {"cells": []}])
def test_what_is_not_a_notebook_is_ungradable(submitted, release, source):
    result = normalize(submitted, release, source)
    assert result.notebook is None and result.ungradable


@pytest.mark.parametrize("content, why", [
    (b"{\"cells\": [", "not valid JSON"),
    ("{}".encode("utf-16"), "not UTF-8"),
    (b"[1, 2]", "a JSON list"),
    (b"{\"nbformat\": 9, \"cells\": {}}", "not a Jupyter notebook"),
])
def test_an_unreadable_file_is_ungradable_with_a_reason_naming_it(tmp_path, content, why):
    path = tmp_path / "principles.ipynb"
    path.write_bytes(content)
    result = normalize_file(path, RELEASE, SOURCE)
    assert result.notebook is None
    assert str(path) in result.ungradable and why in result.ungradable


def test_a_missing_file_is_ungradable(tmp_path):
    result = normalize_file(tmp_path / "nothing.ipynb", RELEASE, SOURCE)
    assert result.notebook is None and "nothing.ipynb" in result.ungradable


def test_a_file_on_disk_is_normalized(tmp_path, release, source):
    path = tmp_path / "principles.ipynb"
    nbformat.write(completed(release, source), path)
    result = normalize_file(path, RELEASE, SOURCE)
    assert result.ungradable is None and result.anomalies == []
    nbformat.validate(result.notebook)


def test_an_nbformat_3_notebook_is_converted(tmp_path, release, source):
    path = tmp_path / "principles.ipynb"
    path.write_text(nbformat.writes(nbformat.convert(completed(release, source), 3), version=3))
    result = normalize_file(path, RELEASE, SOURCE)
    assert result.ungradable is None and result.anomalies == []
    assert find(result.notebook, "softmax")[0].source == find(source, "softmax")[0].source


def test_describe_joins_the_details_on_one_line():
    found = [Anomaly("missing-cell", "t", "t: re-inserted.", True), Anomaly("cell-moved", "u", "u:\nmoved.", False)]
    assert describe(found) == "Suspicious: t: re-inserted. u: moved."
    assert describe([]) == ""
