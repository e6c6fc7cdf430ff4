"""Submissions as one zip of notebooks (an LMS export): each unpacks to its
student's folder, no entry escapes the destination, odd entries are skipped or
explained, and the grading command grades a zip like a folder."""
import csv
import sys
import zipfile

import pytest

from autograde.course import CourseError
from autograde.zip_input import student_id, unpack_zip
from tests.conftest import REPO, run

NB = "principles.ipynb"


def make_zip(path, entries):
    with zipfile.ZipFile(path, "w") as zf:
        for i, (name, data) in enumerate(entries):
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, i))
            zf.writestr(info, data)
    return path


@pytest.mark.parametrize("name, expected", [("jdoe_12345_principles.ipynb", "jdoe"), ("jdoe.ipynb", "jdoe"),
                                            ("Ann Lee_7_principles.ipynb", "Ann-Lee"), ("a/b/x_1.ipynb", "x")])
def test_student_id_is_the_name_before_the_first_underscore(name, expected):
    assert student_id(name) == expected


def test_entries_unpack_to_nbgrader_layout_and_cannot_escape(tmp_path):
    archive = make_zip(tmp_path / "export.zip", [
        ("alice_1_principles.ipynb", "{}"),
        ("course/bob_2_principles.ipynb", "{}"),
        ("../../carol_3_principles.ipynb", "{}"),
        ("__MACOSX/._alice_1_principles.ipynb", "junk"),
        ("notes.txt", "hello"),
    ])
    out = tmp_path / "dest"
    unpacked = unpack_zip(archive, "ch1_principles", [NB], out)
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.ipynb"))
    assert written == [f"{s}/ch1_principles/{NB}" for s in ("alice", "bob", "carol")]
    assert not (tmp_path / "carol_3_principles.ipynb").exists()
    assert unpacked.skipped == ["notes.txt"] and unpacked.problems == {}


def test_a_resubmission_keeps_the_later_entry_and_says_so(tmp_path):
    archive = make_zip(tmp_path / "export.zip", [("dan_1_principles.ipynb", "old"),
                                                 ("dan_2_principles.ipynb", "new")])
    unpacked = unpack_zip(archive, "ch1_principles", [NB], tmp_path / "dest")
    assert (tmp_path / "dest" / "dan" / "ch1_principles" / NB).read_text() == "new"
    assert "graded dan_2_principles.ipynb, the later one" in unpacked.problems["dan"][0]


def test_an_oversized_notebook_is_refused_with_a_reason(tmp_path):
    archive = make_zip(tmp_path / "export.zip", [("eve_principles.ipynb", "x" * 2000), ("fay.ipynb", "{}")])
    unpacked = unpack_zip(archive, "ch1_principles", [NB], tmp_path / "dest", max_bytes=1000)
    assert not (tmp_path / "dest" / "eve" / "ch1_principles" / NB).exists()
    assert "larger than the 1000-byte limit" in unpacked.problems["eve"][0]
    assert (tmp_path / "dest" / "fay" / "ch1_principles" / NB).exists()


def test_a_file_that_is_not_a_zip_is_named(tmp_path):
    bad = tmp_path / "export.zip"
    bad.write_text("not a zip")
    with pytest.raises(CourseError, match="is not a readable zip file"):
        unpack_zip(bad, "ch1_principles", [NB], tmp_path / "dest")
    proc = run([sys.executable, "-m", "autograde", "grade", "ch1_principles", str(bad), "--out", str(tmp_path / "o")])
    assert proc.returncode == 2 and "is not a readable zip file" in proc.stderr and "Traceback" not in proc.stderr


def test_grading_a_zip_gives_each_student_their_row(tmp_path):
    solved = (REPO / "solutions" / "ch1_principles" / NB).read_text()
    untouched = (REPO / "exercises" / "ch1_principles" / NB).read_text()
    archive = make_zip(tmp_path / "export.zip", [("ada_11_principles.ipynb", solved),
                                                 ("ben_12_principles.ipynb", untouched),
                                                 ("cy_13_principles.ipynb", "{not json")])
    out = tmp_path / "grading"
    proc = run([sys.executable, "-m", "autograde", "grade", "ch1_principles", str(archive), "--out", str(out),
                "--timeout", "60"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with (out / "grades.csv").open() as fh:
        rows = {row["student_id"]: row for row in csv.DictReader(fh)}
    assert rows.keys() == {"ada", "ben", "cy"}
    assert float(rows["ada"]["score"]) == float(rows["ada"]["max_score"]) - 2   # all but the hand-graded answer
    assert float(rows["ben"]["score"]) == 0
    assert rows["cy"]["status"] == "ungradable" and "not valid notebook JSON" in rows["cy"]["problems"]
