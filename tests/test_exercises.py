"""exercises/ is exactly what nbgrader generates from solutions/ today, and
holds no solution code and no hidden test."""
import json
import re

import nbformat
import pytest

from autograde import course
from autograde.generate import generate_all
from tests.conftest import REPO
from tests.leaks import find_leaks, secret_fragments
from tests.notebooks import hidden_checks, nbgrader_meta

SOURCES = sorted((REPO / "solutions").rglob("*.ipynb"))
RELEASES = sorted((REPO / "exercises").rglob("*.ipynb"))


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    out = tmp_path_factory.mktemp("release")
    generate_all(out)
    return out


def test_every_assignment_is_released():
    assert course.assignments(), "no assignments in solutions/"
    assert [p.relative_to(REPO / "exercises") for p in RELEASES] == \
        [p.relative_to(REPO / "solutions") for p in SOURCES]


def test_exercises_equal_a_fresh_generation(fresh):
    generated = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
    committed = sorted(p.relative_to(REPO / "exercises") for p in (REPO / "exercises").rglob("*") if p.is_file())
    assert committed == generated, "exercises/ holds other files than nbgrader generates; run ./scripts/generate"
    for rel in generated:
        assert (REPO / "exercises" / rel).read_bytes() == (fresh / rel).read_bytes(), \
            f"exercises/{rel} differs from what nbgrader generates from solutions/; run ./scripts/generate"


@pytest.mark.parametrize("path", SOURCES + RELEASES, ids=lambda p: str(p.relative_to(REPO)))
def test_notebooks_are_stored_without_outputs(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, \
                f"{path.name}: cell {cell.get('id')} has outputs; notebooks are stored without them"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_graded_functions_live_in_cells_named_after_them(path):
    nb = nbformat.read(path, as_version=4)
    ids = [nbgrader_meta(c).get("grade_id") for c in nb.cells if nbgrader_meta(c)]
    assert len(ids) == len(set(ids)), "duplicate grade_id"
    for cell in nb.cells:
        meta = nbgrader_meta(cell)
        if meta.get("solution") and cell.cell_type == "code":
            defs = re.findall(r"^(?:def|class) (\w+)\b", cell.source, flags=re.M)
            assert defs == [meta["grade_id"]], f"solution cell {meta['grade_id']} defines {defs}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_hidden_test_calls_an_existing_check(path):
    nb = nbformat.read(path, as_version=4)
    hidden = {nbgrader_meta(c)["grade_id"] for c in nb.cells if "BEGIN HIDDEN TESTS" in c.source}
    checks = hidden_checks(path)  # raises if a named check does not exist
    assert hidden and set(checks) == hidden, f"hidden cells without a recognised check call: {hidden - set(checks)}"
    assert all(callable(check) for check, _ in checks.values())


def test_exercises_hold_no_solutions_or_hidden_tests():
    leaks = find_leaks(REPO / "exercises")
    assert not leaks, "\n".join(f"{p.relative_to(REPO)}: {what!r}" for p, what in leaks)


def test_the_leak_scan_finds_a_planted_leak(tmp_path):
    """The scan above must be able to fail."""
    fragments = secret_fragments()
    assert len(fragments) > 20
    (tmp_path / "clean.md").write_text("Attention weights sum to one.\n")
    assert find_leaks(tmp_path, fragments) == []
    for i, fragment in enumerate(sorted(fragments)[:5]):
        (tmp_path / f"leak{i}.html").write_text(
            "<pre>" + "\n".join(f"<span>{line}</span>" for line in fragment.split("\n")) + "</pre>")
    (tmp_path / "marker.ipynb").write_text('{"source": "### BEGIN HIDDEN TESTS"}')
    found = {p.name for p, _ in find_leaks(tmp_path, fragments)}
    assert found == {f"leak{i}.html" for i in range(5)} | {"marker.ipynb"}
