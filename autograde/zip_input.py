"""Submissions as a learning-management system exports them: one zip of
notebooks, each named after its student ("jdoe_12345_principles.ipynb" or
"jdoe.ipynb": the student id is the part before the first underscore).
They are unpacked into nbgrader's layout, <dest>/<student>/<assignment>/<notebook>,
using only each entry's base name, so no entry can write outside dest."""
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from autograde.course import CourseError

MAX_NOTEBOOK_BYTES = 50 * 2**20   # a notebook larger than this is refused, not unpacked


@dataclass
class Unpacked:
    folder: Path
    problems: dict = field(default_factory=dict)   # student -> reasons, added to that student's row
    skipped: list = field(default_factory=list)    # entries that are not notebooks, for the log


def student_id(filename):
    """'jdoe_12345_principles.ipynb' -> 'jdoe'; characters unsafe in a folder name become '-'."""
    stem = PurePosixPath(filename).name.rsplit(".", 1)[0]
    return re.sub(r"[^A-Za-z0-9.@-]", "-", stem.split("_", 1)[0].strip()).strip(".")


def _notebook_for(filename, expected):
    """Which of the assignment's notebooks an entry is: the one its name ends with, or the only one."""
    stem = PurePosixPath(filename).name.rsplit(".", 1)[0]
    matches = [nb for nb in expected if stem.endswith(nb.rsplit(".", 1)[0])]
    if len(matches) == 1:
        return matches[0]
    return expected[0] if len(expected) == 1 else None


def unpack_zip(zip_path, assignment, expected, dest, *, max_bytes=MAX_NOTEBOOK_BYTES):
    """Unpack the notebooks of zip_path into dest in nbgrader's layout."""
    dest = Path(dest)
    result = Unpacked(folder=dest)
    try:
        archive = zipfile.ZipFile(zip_path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise CourseError(f"{zip_path} is not a readable zip file ({exc})") from None
    seen = {}
    with archive:
        # Later entries win when a student appears twice (a re-submission); the row says so.
        for info in sorted(archive.infolist(), key=lambda i: i.date_time):
            name = PurePosixPath(info.filename).name
            if info.is_dir() or not name or name.startswith(".") or "__MACOSX" in info.filename:
                continue
            if not name.endswith(".ipynb"):
                result.skipped.append(info.filename)
                continue
            student = student_id(name)
            notebook = _notebook_for(name, expected)
            if not student or notebook is None:
                result.skipped.append(info.filename)
                continue
            folder = dest / student / assignment
            folder.mkdir(parents=True, exist_ok=True)
            reasons = result.problems.setdefault(student, [])
            if (student, notebook) in seen:
                reasons.append(f"the zip holds {seen[(student, notebook)]} and {info.filename} for this student; "
                               f"graded {info.filename}, the later one")
            seen[(student, notebook)] = info.filename
            data = b""
            if info.file_size <= max_bytes:
                with archive.open(info) as src:
                    data = src.read(max_bytes + 1)   # never more, whatever the header claims
            if info.file_size > max_bytes or len(data) > max_bytes:
                reasons.append(f"{info.filename} is larger than the {max_bytes}-byte limit for a notebook; "
                               "not graded")
                (folder / notebook).unlink(missing_ok=True)
                continue
            (folder / notebook).write_bytes(data)
    if not seen:
        raise CourseError(f"{zip_path} holds no notebooks for '{assignment}' "
                          f"(expected entries like <student>_{expected[0]})")
    result.problems = {s: r for s, r in result.problems.items() if r}
    return result
