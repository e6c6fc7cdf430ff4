"""The tripwire scan flags code that reaches into the grader, and nothing that
honest solutions write: the instructor's solutions and every correct planted
style of every assignment scan clean."""
import nbformat
import pytest

from autograde.tripwire import PATTERNS, release_sources, scan_notebook, write_report
from tests.conftest import REPO
from tests.notebooks import filled_submission
from tests.submissions import CLASSES

ATTACKS = {
    "uses the IPython shell (get_ipython)": "get_ipython().input_transformers_cleanup.append(lambda l: [])",
    "touches the module table (sys.modules)": "import sys\nsys.modules['numpy'].allclose = lambda *a, **k: True",
    "touches builtins": "import builtins\nbuiltins.print = None",
    "uses ctypes": "import ctypes",
    "uses the garbage collector (gc)": "import gc\nobjs = gc.get_objects()",
    "inspects frames or source (inspect)": "import inspect\nframe = inspect.currentframe().f_back",
    "rebinds an attribute of a course library": "np.allclose = lambda *a, **k: True",
    "exits its process (os._exit)": "import os\nos._exit(0)",
    "runs code built from text (exec, eval, compile, __import__)":
        "import base64\nexec(base64.b64decode('cHJpbnQoMSk='))",
    "opens a file outside its folder": "secret = open('/srv/course/source/tests.ipynb').read()",
    "imports the book's helpers": "from bookutils import softmax_rows",
}


def paths(assignment):
    notebook = CLASSES[assignment].NOTEBOOK
    return REPO / "solutions" / assignment / notebook, REPO / "exercises" / assignment / notebook


def scan(tmp_path, assignment, overrides, student="s"):
    source, release = paths(assignment)
    path = tmp_path / f"{student}.ipynb"
    nbformat.write(filled_submission(release, source, overrides), path)
    return scan_notebook(student, path, release_sources(release))


def test_every_pattern_has_an_attack():
    assert set(ATTACKS) == set(PATTERNS)


@pytest.mark.parametrize("reason", sorted(ATTACKS))
def test_each_attack_is_flagged_with_its_reason_and_line(tmp_path, reason):
    code = f"def softmax(x, axis=-1):\n    return x\n{ATTACKS[reason]}"
    flags = scan(tmp_path, "ch1_principles", {"softmax": code})
    assert reason in {f.reason for f in flags}
    hit = next(f for f in flags if f.reason == reason)
    assert hit.cell == "softmax" and hit.line >= 3 and hit.code in code


def test_comparisons_and_library_calls_are_not_flagged(tmp_path):
    code = ("def softmax(x, axis=-1):\n    ok = np.e == 2.718\n    z = np.exp(x - x.max(axis=axis, keepdims=True))\n"
            "    return z / z.sum(axis=axis, keepdims=True)")
    assert scan(tmp_path, "ch1_principles", {"softmax": code}) == []


def test_a_scratch_file_in_tmp_is_not_flagged(tmp_path):
    """/tmp is the student's own in the sandbox, as in Jupyter."""
    code = "open('/tmp/notes.txt', 'w').write('x')\ndef softmax(x, axis=-1):\n    return x"
    assert scan(tmp_path, "ch1_principles", {"softmax": code}) == []


@pytest.mark.parametrize("assignment", sorted(CLASSES))
def test_honest_solutions_scan_clean(tmp_path, assignment):
    assert scan(tmp_path, assignment, {}) == []
    for name, overrides in CLASSES[assignment].CORRECT.items():
        assert scan(tmp_path, assignment, overrides, student=name) == [], name


def test_report_lists_students_and_says_when_nothing_was_flagged(tmp_path):
    flags = scan(tmp_path, "ch1_principles", {"softmax": "import ctypes\ndef softmax(x, axis=-1):\n    return x"},
                 student="mallory")
    assert write_report(tmp_path, flags) == ["mallory"]
    assert "mallory:" in (tmp_path / "integrity.txt").read_text()
    assert "uses ctypes" in (tmp_path / "integrity.csv").read_text()
    write_report(tmp_path, [])
    assert "Nothing flagged." in (tmp_path / "integrity.txt").read_text()


@pytest.mark.parametrize("code", ["import bookutils", "import bookutils.attention as att",
                                  "    from bookutils.attention import softmax_row"])
def test_every_way_of_importing_the_book_helpers_is_flagged(tmp_path, code):
    cell = f"def softmax(x, axis=-1):\n    return x\n{code}"
    flags = scan(tmp_path, "ch1_principles", {"softmax": cell})
    assert [f.reason for f in flags] == ["imports the book's helpers"]


def test_the_word_bookutils_alone_is_not_flagged(tmp_path):
    cell = "def softmax(x, axis=-1):\n    # unlike bookutils.softmax_row, any axis\n    return x"
    assert scan(tmp_path, "ch1_principles", {"softmax": cell}) == []
