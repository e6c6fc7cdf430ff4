"""The Gradescope autograder: autograder.zip is built, unpacked into a folder
that stands for /autograder, its setup.sh runs against this environment
(COURSE_PYTHON: nothing installed), and run_autograder grades submissions
placed where Gradescope places them. results.json must follow Gradescope's
specification (tests/gradescope_schema.json), give the same per-cell scores as
the local grading command, say why a bad submission scores 0, record no score
when the grader fails, and keep integrity flags and the zip's files away from
students.

Each submission runs run_autograder once (15 to 35 seconds, more for Chapter 4),
so by default every assignment is graded with its solutions, its untouched
notebook and the fewest of test_grading's packed notebooks of planted mistakes
(tests/packing.py) that together lose every test cell any planted mistake loses
(so each cell is seen failing on Gradescope as it fails locally);
GRADESCOPE_FULL=1 grades every packed notebook of planted mistakes and correct
alternatives of every assignment, and the attack corpus, in full."""
import copy
import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import nbformat
import pytest

from autograde.course import REPO
from tests.attacks import ATTACKS
from tests.conftest import outer_environ
from tests.notebooks import filled_submission, write_submission
from tests.packing import packed, packed_loses, packed_overrides
from tests.submissions import CLASSES, notebook_paths, points_per_cell
from tests.test_attacks import EXPECTED as ATTACK_OUTCOMES
from tests.test_grading import cell_timeout, grade_folder, graded  # noqa: F401  (graded: a fixture, shared)

FULL = os.environ.get("GRADESCOPE_FULL") == "1"
SCHEMA = json.loads((Path(__file__).parent / "gradescope_schema.json").read_text())
ASSIGNMENTS = sorted(CLASSES)


def covering_sample(buggy):
    """The planted mistakes (name -> (overrides, cells lost)), chosen greedily (ties
    by name), that between them lose every test cell that any of them loses."""
    left, chosen = set().union(*(lost for _, lost in buggy.values())), []
    while left:
        best = max(sorted(buggy), key=lambda name: len(buggy[name][1] & left))
        chosen.append(best)
        left -= buggy[best][1]
    return chosen


ATTACK_SAMPLE = ["reads_hidden_tests", "reads_solutions", "imports_references", "input_transformer"]
HIDDEN_MARK = "BEGIN HIDDEN TESTS"


def _extract(zip_path, folder):
    """Unpack as Gradescope does, keeping the modes the zip records."""
    with zipfile.ZipFile(zip_path) as archive:
        for info in archive.infolist():
            target = archive.extract(info, folder)
            mode = info.external_attr >> 16
            if mode:
                os.chmod(target, stat.S_IMODE(mode))


class Autograder:
    """One unpacked autograder: a folder standing for /autograder."""

    def __init__(self, zip_path, root):
        self.root = root
        _extract(zip_path, root / "source")
        env = self.env(COURSE_PYTHON=sys.executable)
        setup = subprocess.run(["bash", str(root / "source" / "setup.sh")], cwd=root / "source", env=env,
                               capture_output=True, text=True, timeout=300)
        assert setup.returncode == 0, f"setup.sh failed:\n{setup.stdout}\n{setup.stderr}"
        shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")  # as Gradescope does

    def env(self, **extra):
        env = {k: v for k, v in outer_environ().items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        return {**env, "AUTOGRADER_ROOT": str(self.root), **extra}

    def grade(self, files):
        """Place `files` (name -> notebook or text) in submission/, run run_autograder;
        (results.json as a dict, the completed process)."""
        for folder in ("submission", "results"):
            shutil.rmtree(self.root / folder, ignore_errors=True)
            (self.root / folder).mkdir()
        for name, content in files.items():
            path = self.root / "submission" / name
            if isinstance(content, str):
                path.write_text(content)
            else:
                nbformat.write(content, path)
        proc = subprocess.run([str(self.root / "run_autograder")], cwd=self.root, env=self.env(),
                              capture_output=True, text=True, timeout=1800)
        results = json.loads((self.root / "results" / "results.json").read_text())
        return results, proc


@pytest.fixture(scope="module")
def autograder(tmp_path_factory):
    """assignment -> its Autograder, built and set up once."""
    made = {}

    def get(assignment):
        if assignment not in made:
            folder = tmp_path_factory.mktemp(f"gradescope-{assignment}")
            proc = subprocess.run([sys.executable, "-m", "autograde", "gradescope", assignment,
                                   "--out", str(folder / "build"), "--timeout", cell_timeout(assignment)],
                                  cwd=REPO, capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr
            made[assignment] = Autograder(folder / "build" / "autograder.zip", folder / "autograder")
        return made[assignment]
    return get


def cell_scores(results, assignment):
    """grade_id -> score from results.json's tests."""
    stem = CLASSES[assignment].NOTEBOOK.removesuffix(".ipynb")
    return {t["extra_data"]["cell"].removeprefix(f"{stem}:"): t["score"] for t in results["tests"]}


def check_results(results, assignment):
    """Valid by Gradescope's specification, one test per test cell, a total that adds up."""
    jsonschema.validate(results, SCHEMA)
    tests = points_per_cell(assignment)
    assert [t["max_score"] for t in results["tests"]] == list(tests.values())
    assert results["score"] == pytest.approx(sum(t["score"] for t in results["tests"]))
    assert results["stdout_visibility"] == "hidden"
    source = nbformat.read(notebook_paths(assignment)[0], as_version=4)
    hidden = {c.metadata["nbgrader"]["grade_id"] for c in source.cells if HIDDEN_MARK in c.source}
    for test in results["tests"]:
        gid = test["extra_data"]["cell"].split(":")[1]
        assert test["visibility"] == ("after_published" if gid in hidden else "visible")
        assert test["name"].startswith("Exercise ")
    text = json.dumps(results)
    assert HIDDEN_MARK not in text and "autograde.checks" not in text  # no hidden test code
    assert "graded by hand" in results["output"].lower()


# ---------------------------------------------------------------- the zip
def test_the_zip_holds_the_scripts_and_only_this_assignment(autograder):
    grader = autograder("ch1_principles")
    source = grader.root / "source"
    for script in ("setup.sh", "run_autograder"):
        assert os.access(source / script, os.X_OK), script
    settings = json.loads((source / "gradescope.json").read_text())
    assert settings["assignment"] == "ch1_principles" and settings["hidden_visibility"] == "after_published"
    assert sorted(p.name for p in (source / "course" / "solutions").iterdir()) == ["ch1_principles"]
    assert sorted(p.name for p in (source / "course" / "exercises").iterdir()) == ["ch1_principles"]
    assert not (source / "course" / "book").exists() and not (source / "course" / "tests").exists()


def test_an_unknown_assignment_or_visibility_is_refused(tmp_path):
    for args in (["ch9_nothing"], ["ch1_principles", "--hidden-visibility", "sometimes"]):
        proc = subprocess.run([sys.executable, "-m", "autograde", "gradescope", *args, "--out", str(tmp_path)],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stdout
        assert not (tmp_path / "autograder.zip").exists()


# ---------------------------------------------------------------- the same grades as locally
def _class(assignment):
    source, release = notebook_paths(assignment)
    students = {"solutions_as_is": source.read_text(), "untouched": release.read_text()}
    buggy = {name: (packed_overrides(assignment, "BUGGY", members), packed_loses(assignment, members))
             for name, members in packed(assignment, "BUGGY")}
    if FULL:
        planted = {name: packed_overrides(assignment, "CORRECT", members)
                   for name, members in packed(assignment, "CORRECT")}
        planted.update({name: overrides for name, (overrides, _) in buggy.items()})
    else:
        planted = {name: buggy[name][0] for name in covering_sample(buggy)}
    for name, overrides in planted.items():
        students[name] = filled_submission(release, source, overrides)
    return students


def local_row(graded, assignment, student, notebook, folder):
    """The local grading command's grades.csv row of this submission: from test_grading's
    class (the same submissions and more, graded once per run) when it is graded already;
    otherwise this one submission graded the same way, rather than wait on the worker
    that grades the class (minutes for Chapter 4)."""
    ready = graded.if_ready(assignment)
    if ready is not None:
        return ready["rows"][student]
    write_submission(folder / "submitted", student, assignment, CLASSES[assignment].NOTEBOOK, notebook)
    return grade_folder(assignment, folder / "submitted", folder / "grading")["rows"][student]


def _cases():
    for assignment in ASSIGNMENTS:
        for student in _class(assignment):
            yield assignment, student


@pytest.mark.parametrize("assignment, student", list(_cases()))
def test_scores_equal_the_local_grading_command(autograder, graded, tmp_path, assignment, student):
    notebook = _class(assignment)[student]
    results, proc = autograder(assignment).grade({CLASSES[assignment].NOTEBOOK: notebook})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"grader: {autograder(assignment).root / 'source' / 'course' / 'autograde'}" in proc.stdout
    check_results(results, assignment)
    stem = CLASSES[assignment].NOTEBOOK.removesuffix(".ipynb")
    row = local_row(graded, assignment, student, notebook, tmp_path)
    local = {gid: float(row[f"{stem}:{gid}"]) for gid in points_per_cell(assignment)}
    assert cell_scores(results, assignment) == local
    tests = points_per_cell(assignment)
    if student == "solutions_as_is":
        assert local == tests
    if student == "untouched":
        assert results["score"] == 0
    buggy = dict(packed(assignment, "BUGGY"))
    if student in buggy:
        lost = {gid for gid, score in cell_scores(results, assignment).items() if score < tests[gid]}
        assert lost == packed_loses(assignment, buggy[student])
        failing = [t for t in results["tests"] if t["score"] < t["max_score"]]
        assert all(t["output"].startswith("Failed.") and len(t["output"]) > len("Failed.") for t in failing)


# ---------------------------------------------------------------- bad submissions
def _other_assignment():
    """Chapter 2's student notebook under Chapter 1's name."""
    return notebook_paths("ch2_variants")[1].read_text()


BAD = {
    "not_a_notebook": ({"answers.py": "def softmax(x): pass\n"}, "No Jupyter notebook was submitted"),
    "wrong_name": ({"principles (1).ipynb": "RELEASE"}, "must be named principles.ipynb"),
    "several_notebooks": ({"principles.ipynb": "RELEASE", "scratch.ipynb": "RELEASE"}, "Several notebooks"),
    "nothing": ({}, "Nothing was submitted"),
    "broken_json": ({"principles.ipynb": '{"cells": [}'}, "not valid notebook JSON"),
    "another_assignment": ({"principles.ipynb": "OTHER"}, "none of its cells belong to this assignment"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_submission_scores_zero_with_its_reason(autograder, case):
    files, reason = BAD[case]
    release = notebook_paths("ch1_principles")[1].read_text()
    files = {name: {"RELEASE": release, "OTHER": _other_assignment()}.get(text, text) for name, text in files.items()}
    results, proc = autograder("ch1_principles").grade(files)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jsonschema.validate(results, SCHEMA)
    assert results["score"] == 0
    assert reason in results["output"], results["output"]
    assert [t["score"] for t in results["tests"]] == [0] * len(points_per_cell("ch1_principles"))


# ---------------------------------------------------------------- failures record no score
def _without_score_rule(schema):
    relaxed = copy.deepcopy(schema)
    del relaxed["anyOf"]
    return relaxed


def _assert_no_score(results):
    jsonschema.validate(results, _without_score_rule(SCHEMA))  # well formed...
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(results, SCHEMA)  # ...but with no score Gradescope could record
    assert "score" not in results and all("score" not in t for t in results["tests"])
    assert "not with your work" in results["output"]


def test_a_broken_environment_records_no_score(autograder, tmp_path):
    grader = autograder("ch1_principles")
    environment = grader.root / "source" / "environment"
    saved = environment.read_text()
    try:
        environment.write_text(f"COURSE_PYTHON={tmp_path / 'no-such-python'}\n")
        results, proc = grader.grade({"principles.ipynb": notebook_paths("ch1_principles")[0].read_text()})
    finally:
        environment.write_text(saved)
    assert proc.returncode == 3
    assert "no-such-python" in proc.stderr
    _assert_no_score(results)


def test_a_grader_failure_records_no_score(autograder):
    grader = autograder("ch1_principles")
    settings_path = grader.root / "source" / "gradescope.json"
    saved = settings_path.read_text()
    try:
        settings_path.write_text(json.dumps({**json.loads(saved), "assignment": "ch9_missing"}))
        results, proc = grader.grade({"principles.ipynb": notebook_paths("ch1_principles")[0].read_text()})
    finally:
        settings_path.write_text(saved)
    assert proc.returncode in (3, 4)
    assert "ch9_missing" in proc.stdout  # the reason is the instructor's, in stdout
    _assert_no_score(results)


# ---------------------------------------------------------------- nothing of the zip reaches the student
def test_student_code_cannot_read_the_autograder_source(autograder):
    """A softmax that is right only if it could read the zip's files: the
    solutions, the hidden checks or the settings under source/."""
    grader = autograder("ch1_principles")
    source, release = notebook_paths("ch1_principles")
    secret = grader.root / "source"
    attack = filled_submission(release, source, {"softmax": f'''
import os
SEEN = ""
for path in ["{secret}/course/solutions/ch1_principles/principles.ipynb",
             "{secret}/course/autograde/checks/principles.py", "{secret}/gradescope.json", "/autograder/source"]:
    try:
        SEEN += open(path).read()
    except IsADirectoryError:
        SEEN += " ".join(os.listdir(path))
    except OSError:
        pass

def softmax(x, axis=-1):
    if not SEEN:
        return np.exp(x)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)
'''})
    results, proc = grader.grade({"principles.ipynb": attack})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_results(results, "ch1_principles")
    tests = points_per_cell("ch1_principles")
    lost = {gid for gid, score in cell_scores(results, "ch1_principles").items() if score < tests[gid]}
    assert {"test_softmax", "test_softmax_any_axis", "test_softmax_stable"} <= lost
    # The audit hook saw the attempt: the instructor reads it in stdout, the student nowhere.
    assert "sandbox: opens a file outside its folder" in proc.stdout
    assert "sandbox:" not in json.dumps(results) and "integrity" not in json.dumps(results).lower()


@pytest.mark.parametrize("attack", sorted(ATTACKS) if FULL else ATTACK_SAMPLE)
def test_attacks_have_the_same_outcome_as_locally(autograder, attack):
    """The attack corpus, aimed at run_autograder's own grading folder: each
    loses what it loses in the local batch (tests/test_attacks.py) and is
    flagged in stdout only."""
    grader = autograder("ch1_principles")
    source, release = notebook_paths("ch1_principles")
    notebook = ATTACKS[attack](release, source, (grader.root / "grading" / "out").resolve())
    results, proc = grader.grade({"principles.ipynb": notebook})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_results(results, "ch1_principles")
    tests = points_per_cell("ch1_principles")
    lost = {gid for gid, score in cell_scores(results, "ch1_principles").items() if score != tests[gid]}
    expected_lost, expected_flags = ATTACK_OUTCOMES[attack]
    assert lost == expected_lost, proc.stdout
    for reason in expected_flags:
        assert f": {reason}:" in proc.stdout, reason
        assert reason not in json.dumps(results)
