"""Mistakes in the instructor's command line get a one-line message naming the
problem, not a traceback."""
import sys

from tests.conftest import run


def grade(*args):
    return run([sys.executable, "-m", "autograde", "grade", *map(str, args)], timeout=300)


def test_unknown_assignment_is_named(tmp_path):
    proc = grade("ch9_nonexistent", tmp_path)
    assert proc.returncode == 2
    assert "unknown assignment 'ch9_nonexistent'" in proc.stderr and "ch1_principles" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_submissions_folder_is_named(tmp_path):
    proc = grade("ch1_principles", tmp_path / "nowhere")
    assert proc.returncode == 2
    assert f"submissions folder not found: {tmp_path / 'nowhere'}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_folder_without_submissions_is_explained(tmp_path):
    (tmp_path / "alice" / "other_assignment").mkdir(parents=True)
    proc = grade("ch1_principles", tmp_path)
    assert proc.returncode == 2
    assert "no submissions for 'ch1_principles'" in proc.stderr
    assert "<student>/ch1_principles/" in proc.stderr


def test_unwritable_output_folder_is_named(tmp_path):
    (tmp_path / "alice" / "ch1_principles").mkdir(parents=True)
    (tmp_path / "alice" / "ch1_principles" / "principles.ipynb").write_text("{}")
    blocker = tmp_path / "file_not_folder"
    blocker.write_text("")
    proc = grade("ch1_principles", tmp_path, "--out", blocker / "out")
    assert proc.returncode == 2
    assert "error:" in proc.stderr and "file_not_folder" in proc.stderr
    assert "Traceback" not in proc.stderr
