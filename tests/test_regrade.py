"""Grading the same class again: identical grades, re-submissions replace every
automatic grade, hand-given grades are kept (and disagreements reported), the
gradebook is backed up, a run killed at any moment loses nothing when run
again, and a broken grading environment records nothing as a student's zero."""
import csv
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from nbgrader.api import Gradebook

from tests.conftest import REPO, outer_environ, run
from tests.notebooks import filled_submission, nbgrader_meta, write_submission

ASSIGNMENT = "ch1_principles"
NOTEBOOK = "principles.ipynb"
SOURCE = REPO / "solutions" / ASSIGNMENT / NOTEBOOK
RELEASE = REPO / "exercises" / ASSIGNMENT / NOTEBOOK
WRONG_SOFTMAX = "def softmax(x, axis=-1):\n    return np.exp(x)"
SOFTMAX_TESTS = ("test_softmax", "test_softmax_any_axis", "test_softmax_stable")


def grade(submitted, out, *extra):
    return run([sys.executable, "-m", "autograde", "grade", ASSIGNMENT, str(submitted), "--out", str(out),
                "--timeout", "20", *extra], timeout=900)


def rows(out):
    with (out / "grades.csv").open() as fh:
        return {row["student_id"]: row for row in csv.DictReader(fh)}


def plant(submitted, student, notebook):
    folder = submitted / student / ASSIGNMENT
    if folder.exists():
        shutil.rmtree(folder)
    write_submission(submitted, student, ASSIGNMENT, NOTEBOOK, notebook)


def first_round(root):
    submitted = root / "submitted"
    for student in ("alice", "bob", "carol"):
        plant(submitted, student, filled_submission(RELEASE, SOURCE))
    return submitted


@pytest.fixture(scope="module")
def regraded(tmp_path_factory):
    root = tmp_path_factory.mktemp("regrade")
    submitted, out = first_round(root), root / "grading"
    first = grade(submitted, out)
    assert first.returncode == 0, first.stderr
    before = rows(out)
    # The instructor overrides one automatic grade by hand and grades alice's written answer.
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
        for name, score in (("test_softmax", 0), ("written_gradient_sums", 2)):
            gb.find_grade(name, "principles", ASSIGNMENT, "alice").manual_score = score
        gb.db.commit()
    # Re-submissions: alice breaks softmax and deletes its tests; bob's file is damaged.
    resubmission = filled_submission(RELEASE, SOURCE, {"softmax": WRONG_SOFTMAX})
    resubmission.cells = [c for c in resubmission.cells if nbgrader_meta(c).get("grade_id") not in SOFTMAX_TESTS]
    plant(submitted, "alice", resubmission)
    plant(submitted, "bob", "{ not json")
    second = grade(submitted, out)
    assert second.returncode == 0, second.stderr
    after = rows(out)
    third = grade(submitted, out)
    assert third.returncode == 0, third.stderr
    return {"out": out, "before": before, "after": after, "again": rows(out), "second": second}


def test_regrading_the_same_submissions_gives_identical_grades(regraded):
    assert regraded["again"] == regraded["after"]


def test_a_new_gradebook_is_stamped_with_the_revision_the_alembic_command_gives(regraded):
    """The grader reads nbgrader's migration head in-process (autograde.nbgrader_revision);
    nbgrader's upgrade tools trust the stamp, so it must be what `alembic heads` prints."""
    from nbgrader.dbutil import _temp_alembic_ini

    with sqlite3.connect(regraded["out"] / "gradebook.db") as db:
        stamped = db.execute("SELECT version_num FROM alembic_version").fetchall()
    with _temp_alembic_ini("sqlite:///unused.db") as ini:
        heads = subprocess.check_output([os.path.join(os.path.dirname(sys.executable), "alembic"), "-c", ini,
                                         "heads"], text=True)
    assert stamped == [(heads.split()[0],)]


def test_a_resubmission_replaces_every_automatic_grade(regraded):
    alice = regraded["after"]["alice"]
    # Deleting the test cells does not keep the old scores: they are restored and fail.
    assert float(alice["principles:test_softmax_any_axis"]) == 0
    assert float(alice["principles:test_softmax_stable"]) == 0
    assert float(regraded["before"]["alice"]["principles:test_softmax_any_axis"]) == 1


def test_an_unreadable_resubmission_leaves_no_stale_scores(regraded):
    bob = regraded["after"]["bob"]
    assert bob["status"] == "ungradable"
    assert float(bob["score"]) == 0
    assert float(regraded["before"]["bob"]["score"]) > 0
    with Gradebook(f"sqlite:///{regraded['out'] / 'gradebook.db'}") as gb:
        submission = gb.find_submission(ASSIGNMENT, "bob")
        assert all(not g.auto_score for nb in submission.notebooks for g in nb.grades)


def test_manual_grades_are_kept_and_disagreements_reported(regraded):
    alice = regraded["after"]["alice"]
    assert float(alice["principles:written_gradient_sums"]) == 2
    # The hand-given 0 for test_softmax stands; the new automatic 0 agrees with it, so no report.
    assert float(alice["principles:test_softmax"]) == 0
    assert "manual grade kept for alice" not in regraded["second"].stdout


def test_a_disagreeing_automatic_grade_is_reported(tmp_path):
    submitted, out = first_round(tmp_path), tmp_path / "grading"
    assert grade(submitted, out).returncode == 0
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
        gb.find_grade("test_softmax", "principles", ASSIGNMENT, "carol").manual_score = 0
        gb.db.commit()
    proc = grade(submitted, out)
    assert proc.returncode == 0, proc.stderr
    assert "manual grade kept for carol" in proc.stdout and "test_softmax" in proc.stdout
    assert float(rows(out)["carol"]["principles:test_softmax"]) == 0


def test_the_gradebook_is_backed_up_before_each_run(regraded):
    backups = sorted((regraded["out"] / "backups").glob("gradebook-*.db"))
    assert len(backups) == 2  # before the second and the third run
    db = sqlite3.connect(backups[0])
    assert db.execute("SELECT count(*) FROM submitted_assignment").fetchone()[0] == 3


def _kill_after_first_student(submitted, out):
    proc = subprocess.Popen([sys.executable, "-m", "autograde", "grade", ASSIGNMENT, str(submitted),
                             "--out", str(out), "--timeout", "20", "--workers", "1"], cwd=REPO, env=outer_environ(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 600
    for line in proc.stdout:
        if "] 1/" in line or time.monotonic() > deadline:
            break
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_a_run_killed_midway_loses_nothing_when_run_again(tmp_path):
    submitted = first_round(tmp_path)
    plant(submitted, "dave", filled_submission(RELEASE, SOURCE, {"softmax": WRONG_SOFTMAX}))
    clean = tmp_path / "clean"
    assert grade(submitted, clean).returncode == 0
    killed = tmp_path / "killed"
    _kill_after_first_student(submitted, killed)
    again = grade(submitted, killed)
    assert again.returncode == 0, again.stderr
    assert rows(killed) == rows(clean)
    db = sqlite3.connect(killed / "gradebook.db")
    assert db.execute("SELECT count(*) FROM submitted_assignment").fetchone()[0] == 4
    per_student = db.execute("SELECT count(*) FROM grade GROUP BY notebook_id").fetchall()
    assert len({n for (n,) in per_student}) == 1  # every student has the same number of grades: none doubled


def test_a_broken_environment_records_no_zeros(tmp_path):
    submitted, out = first_round(tmp_path), tmp_path / "grading"
    # Too little memory to even start Python: the machine's problem, not the students'.
    proc = grade(submitted, out, "--memory-limit", "64")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "grading environment is broken" in proc.stderr and "Traceback" not in proc.stderr
    db = sqlite3.connect(out / "gradebook.db")
    assert db.execute("SELECT count(*) FROM submitted_assignment").fetchone()[0] == 0
    assert not (out / "grades.csv").exists()


@pytest.mark.parametrize("kind", ["bug", "worker dies"])
def test_a_grader_failure_is_reported_not_recorded_as_a_zero(tmp_path, monkeypatch, capsys, kind):
    from autograde import cli
    from autograde import grade as grading
    from tests import faulty_worker

    submitted, out = first_round(tmp_path), tmp_path / "grading"
    monkeypatch.setenv("FAULTY_STUDENT", "carol")
    monkeypatch.setenv("FAULT", kind)
    monkeypatch.setattr(grading, "grade_student", faulty_worker.grade_student)
    status = cli.main(["grade", ASSIGNMENT, str(submitted), "--out", str(out), "--workers", "1"])
    assert status == 4
    assert "the grader itself failed" in capsys.readouterr().out
    graded = rows(out)
    assert graded["carol"]["status"] == "error" and "not the student's score" in graded["carol"]["problems"]
    if kind == "bug":  # (a dead worker takes the students still queued on it along)
        assert graded["alice"]["status"] == graded["bob"]["status"] == "graded"
    db = sqlite3.connect(out / "gradebook.db")
    recorded = dict(db.execute("SELECT student_id, count(*) FROM submitted_assignment GROUP BY student_id"))
    assert "carol" not in recorded and recorded["alice"] == 1


def test_a_triton_that_cannot_interpret_loops_records_no_zeros(tmp_path, monkeypatch, capsys):
    """Triton before 3.7 with NumPy 2.4 (coursekit.triton_env.interpreter_problem) fails every interpreted
    kernel that loops: the grader refuses the whole run instead of scoring every Chapter 4 student zero."""
    from autograde import cli
    from coursekit import triton_env

    said = "Triton 3.6.0's interpreter cannot run a loop whose bounds are tensors (a test's stand-in)."
    monkeypatch.setattr(triton_env, "interpreter_problem", lambda: said)
    monkeypatch.setenv("TRITON_INTERPRET", "1")    # kernels interpreted, as on a machine without a GPU
    submitted, out = tmp_path / "submitted", tmp_path / "grading"
    release = REPO / "exercises" / "ch4_flash" / "flash.ipynb"
    write_submission(submitted, "alice", "ch4_flash", "flash.ipynb", release.read_text())
    status = cli.main(["grade", "ch4_flash", str(submitted), "--out", str(out), "--workers", "1"])
    assert status == 3
    err = capsys.readouterr().err
    assert "grading environment is broken" in err and said in err
    assert not (out / "grades.csv").exists()
    db = sqlite3.connect(out / "gradebook.db")
    assert db.execute("SELECT count(*) FROM submitted_assignment").fetchone()[0] == 0
