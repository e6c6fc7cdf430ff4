"""The structure of a submitted notebook, checked against the assignment before grading.

The grader executes the notebook it is given, so it must get one whose graded
cells are the instructor's: test cells with their hidden tests, the setup cell
and read-only text exactly as in the source, every nbgrader cell once, with the
points of the release. Students damage that structure by accident (a deleted or
copied cell, a code cell turned into markdown, a notebook of the wrong
assignment) and now and then on purpose (an edited test, more points). Here the
submission is compared with the release (the student version) and the source
(the instructor version) and a normalized copy is built for the grader, with a
list of what was wrong and what was done about it, for the instructor.

Nothing here raises on a damaged notebook: whatever cannot be understood becomes
an anomaly, or a reason why the notebook cannot be graded at all, so that one
broken file never stops grading the class.
"""
import copy
import json
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat import validator
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_raw_cell

NEW_CELL = {"code": new_code_cell, "markdown": new_markdown_cell, "raw": new_raw_cell}
FLAGS = ("grade", "solution", "locked")
CELL_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")   # nbformat 4.5's cell ids (matched whole)
IDS_SINCE_MINOR = 5                               # nbformat 4.5 introduced cell ids
MISSING = object()


@dataclass
class Anomaly:
    kind: str         # short slug: locked-cell-modified, missing-cell, points-changed, ...
    cell: str         # the grade_id concerned, "" if none
    detail: str       # one sentence for the instructor: the cell, what was wrong, what was done
    suspicious: bool  # looks like tampering rather than an accident


@dataclass
class Normalized:
    notebook: "nbformat.NotebookNode | None"   # what the grader executes; None when ungradable
    anomalies: list = field(default_factory=list)
    ungradable: "str | None" = None            # why nothing can be graded


def describe(anomalies):
    """The anomalies' details as one line, for a cell of the grades CSV."""
    parts = [("Suspicious: " if a.suspicious else "") + a.detail for a in anomalies]
    return " ".join(" ".join(part.split()) for part in parts)


def normalize_file(path, release_path, source_path):
    """normalize() on notebook files; a file that cannot be read makes the submission ungradable."""
    notebooks = []
    for file in (path, release_path, source_path):
        notebook, reason = read_notebook(file)
        if reason:
            return Normalized(None, [], reason)
        notebooks.append(notebook)
    return normalize(*notebooks)


def read_notebook(path):
    """(notebook, None), or (None, a sentence naming the file and why it cannot be read)."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None, f"{path} is not UTF-8 text, so it is not a notebook that can be graded."
    except Exception as exc:
        return None, f"{path} could not be read ({exc})."
    try:
        data = json.loads(text)
    except ValueError as exc:
        return None, f"{path} is not valid JSON ({exc}), so it is not a notebook that can be graded."
    if not isinstance(data, dict):
        return None, (f"{path} holds a JSON {type(data).__name__}, not a notebook "
                      "(a JSON object with cells), so it cannot be graded.")
    try:
        return as_version_4(data), None
    except Exception as exc:
        return None, f"{path} is not a Jupyter notebook that nbformat can read ({brief(exc)}), so it cannot be graded."


def as_version_4(data):
    """A v4 NotebookNode; an older notebook is converted. No validation: damage is dealt with later."""
    notebook = nbformat.from_dict(data)
    # A v4 notebook that lost its version fields still has its cells: grade it anyway.
    if notebook.get("nbformat", 4) == 4 and isinstance(notebook.get("cells"), list):
        return notebook
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return nbformat.convert(notebook, 4)


def normalize(submitted, release, source):
    """Check `submitted` against the assignment and build the notebook the grader executes.

    `release` is the student version, `source` the instructor version (solutions
    and hidden tests). The inputs are left unchanged.
    """
    try:
        return _Normalizer(release, source).run(submitted)
    except Exception as exc:   # a case nobody foresaw must not stop grading the class
        return Normalized(None, [], f"the notebook's structure could not be checked ({brief(exc)}).")


def brief(exc):
    """An exception in a few words, for a sentence in a report (validation errors run to pages)."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 200 else text[:197] + "..."


# --- reading cells ----------------------------------------------------------------------------

def nbgrader_of(cell):
    """The cell's nbgrader metadata as stored (any type), or None."""
    metadata = cell.get("metadata") if isinstance(cell, Mapping) else None
    return metadata.get("nbgrader") if isinstance(metadata, Mapping) else None


def grade_id_of(cell):
    """The cell's nbgrader grade_id if it is usable (a non-empty string), else None."""
    nbgrader = nbgrader_of(cell)
    grade_id = nbgrader.get("grade_id") if isinstance(nbgrader, Mapping) else None
    return grade_id if isinstance(grade_id, str) and grade_id else None


def source_of(cell):
    """The cell's source as one string; None if it is neither a string nor a list of strings."""
    source = cell.get("source", "")
    if isinstance(source, str):
        return source
    if isinstance(source, list) and all(isinstance(line, str) for line in source):
        return "".join(source)
    return None


def comparable(text):
    """Source text with trailing whitespace ignored: an editor's stray spaces are not edits."""
    return "\n".join(line.rstrip() for line in (text or "").splitlines()).rstrip()


def as_released(cell):
    """The cell holds what a release handed out: its content matches the checksum nbgrader
    stored in it when that release was generated (nbgrader's own test for an edited read-only
    cell). A student who began on an earlier release keeps that release's text of a prompt the
    instructor has since changed; that is no edit of theirs."""
    nbgrader, source = nbgrader_of(cell), source_of(cell)
    checksum = nbgrader.get("checksum") if isinstance(nbgrader, Mapping) else None
    if not isinstance(checksum, str) or source is None:
        return False
    try:
        from nbgrader.utils import compute_checksum

        return compute_checksum(nbformat.from_dict({**cell, "source": source})) == checksum
    except Exception:       # metadata too damaged to hash (points that are not a number, ...)
        return False


def cells_by_grade_id(notebook):
    """grade_id -> the first cell holding it, in notebook order."""
    cells = {}
    for cell in notebook.get("cells", []):
        grade_id = grade_id_of(cell)
        if grade_id and grade_id not in cells:
            cells[grade_id] = cell
    return cells


def flag(nbgrader, name):
    return bool(nbgrader.get(name, False)) if isinstance(nbgrader, Mapping) else False


def is_students(release_cell):
    """Solution cells hold the student's work; every other nbgrader cell is the instructor's."""
    return flag(nbgrader_of(release_cell), "solution")


def is_test(release_cell):
    nbgrader = nbgrader_of(release_cell)
    return flag(nbgrader, "grade") and not flag(nbgrader, "solution")


def is_autograded_answer(release_cell):
    """A solution cell without points of its own: its code is checked by test cells."""
    nbgrader = nbgrader_of(release_cell)
    return flag(nbgrader, "solution") and not flag(nbgrader, "grade")


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def shown(value):
    if value is MISSING:
        return "none"
    return str(value) if is_number(value) else repr(value)


def same_value(a, b):
    """Equal metadata values: 1 and 1.0 points are the same, True and 1 are not."""
    if is_number(a) and is_number(b):
        return a == b
    return type(a) is type(b) and a == b


# --- building cells ---------------------------------------------------------------------------

def make_cell(cell_type, source, metadata, cell_id, attachments=None):
    """A fresh cell: no outputs and no execution count, since the grader re-executes everything."""
    cell = NEW_CELL[cell_type](source=source)   # it validates what it is given: metadata comes after
    cell.metadata = nbformat.from_dict(copy.deepcopy(dict(metadata)))
    cell["id"] = cell_id if isinstance(cell_id, str) else ""   # checked once all cells are in place
    if attachments and cell_type != "code":   # code cells cannot hold attachments
        cell["attachments"] = copy.deepcopy(attachments)
    return cell


def is_valid_cell(cell):
    probe = copy.deepcopy(cell)
    probe["id"] = "probe"
    return validator.isvalid(probe, ref=f"{cell['cell_type']}_cell", version=4, version_minor=IDS_SINCE_MINOR)


def without_nbgrader(metadata):
    return {key: value for key, value in metadata.items() if key != "nbgrader"}


def student_metadata(cell):
    metadata = cell.get("metadata")
    return dict(metadata) if isinstance(metadata, Mapping) else {}


def fresh_id(base, taken):
    base = base[:56] if isinstance(base, str) and CELL_ID.fullmatch(base) else "cell"
    number = 2
    while f"{base}-{number}" in taken:
        number += 1
    return f"{base}-{number}"


def make_ids_unique(cells):
    """Give every cell a valid id of its own; the first cell holding an id keeps it.

    Returns the ids that were held by more than one cell.
    """
    taken, duplicated, renamed = set(), [], []
    for cell in cells:
        cell_id = cell.get("id")
        if isinstance(cell_id, str) and CELL_ID.fullmatch(cell_id) and cell_id not in taken:
            taken.add(cell_id)
            continue
        if cell_id in taken and cell_id not in duplicated:
            duplicated.append(cell_id)
        renamed.append(cell)
    for cell in renamed:   # after the first pass, so a new id never takes a later cell's own
        cell["id"] = fresh_id(cell.get("id"), taken)
        taken.add(cell["id"])
    return duplicated


def longest_ordered_subsequence(ranks):
    """Indexes of a longest increasing run (not necessarily contiguous) of `ranks`."""
    best = [1] * len(ranks)
    previous = [-1] * len(ranks)
    for i in range(len(ranks)):
        for j in range(i):
            if ranks[j] < ranks[i] and best[j] + 1 > best[i]:
                best[i], previous[i] = best[j] + 1, j
    keep, i = set(), max(range(len(ranks)), key=best.__getitem__, default=-1)
    while i >= 0:
        keep.add(i)
        i = previous[i]
    return keep


# --- the comparison ---------------------------------------------------------------------------

class _Normalizer:
    def __init__(self, release, source):
        self.release = release
        self.release_cells = cells_by_grade_id(release)
        self.source_cells = cells_by_grade_id(source)
        self.release_order = list(self.release_cells)
        self.output = []      # [grade_id of the release held by the cell, or None; the cell]
        self.anomalies = []

    def note(self, kind, cell, detail, suspicious):
        self.anomalies.append(Anomaly(kind, cell, " ".join(detail.split()), suspicious))

    def run(self, submitted):
        cells = submitted.get("cells") if isinstance(submitted, Mapping) else None
        if not isinstance(cells, list):
            return Normalized(None, [], "it is not a notebook: it has no list of cells.")
        if not any(grade_id_of(cell) in self.distinctive_ids() for cell in cells):
            return Normalized(None, [], (
                "none of its cells belong to this assignment (no cell has an nbgrader id of the release's "
                "answer or test cells): it may be another assignment's notebook, or a copy saved without "
                "nbgrader's metadata."))
        for position, cell in enumerate(cells, start=1):
            self.add_guarded(position, cell)
        self.insert_missing_cells()
        self.report_moved_cells()
        return Normalized(self.notebook(), self.anomalies, None)

    def distinctive_ids(self):
        """The grade_ids of answer and test cells: assignments share ids like 'setup' or 'intro'."""
        graded = {grade_id for grade_id, cell in self.release_cells.items()
                  if flag(nbgrader_of(cell), "solution") or flag(nbgrader_of(cell), "grade")}
        return graded or set(self.release_cells)

    # Submitted cells, one by one.

    def add_guarded(self, position, cell):
        try:
            self.add(position, cell)
        except Exception as exc:
            self.note("bad-cell", grade_id_of(cell) or "",
                      f"Cell {position} could not be understood ({brief(exc)}); dropped it.", False)

    def add(self, position, cell):
        if not isinstance(cell, Mapping):
            self.note("bad-cell", "", f"Cell {position} is a JSON {type(cell).__name__}, not a notebook cell; "
                                      "dropped it.", False)
            return
        grade_id = grade_id_of(cell)
        if grade_id is None:
            if nbgrader_of(cell):
                why = "no grade_id" if isinstance(nbgrader_of(cell), Mapping) else "not a dictionary"
                self.note("bad-metadata", "", f"Cell {position} had unusable nbgrader metadata ({why}); "
                                              "kept it as an ordinary, ungraded cell.", False)
            self.keep_plain(position, cell)
        elif grade_id not in self.release_cells:
            self.note("unknown-cell", grade_id, f"Cell {position} has the nbgrader id '{grade_id}', which this "
                                                "assignment does not have (a renamed cell?); kept its content as "
                                                "an ordinary, ungraded cell.", True)
            self.keep_plain(position, cell)
        elif any(held == grade_id for held, _ in self.output):
            self.add_duplicate(position, cell, grade_id)
        elif is_students(self.release_cells[grade_id]):
            self.add_answer(position, cell, grade_id)
        else:
            self.add_instructors(position, cell, grade_id)

    def keep_plain(self, position, cell):
        """The cell as the student left it, without nbgrader metadata: it runs but is not graded."""
        cell_type = cell.get("cell_type")
        if cell_type not in NEW_CELL:
            self.note("bad-cell", "", f"Cell {position} has the unknown cell type {cell_type!r}; "
                                      "kept its text as a raw cell, which does not run.", False)
            cell_type = "raw"
        self.append(None, position, cell_type, cell, without_nbgrader(student_metadata(cell)))

    def add_duplicate(self, position, cell, grade_id):
        if is_students(self.release_cells[grade_id]):
            # Copying a cell copies its metadata: usually a student keeping a variant of an answer.
            self.note("duplicate-cell", grade_id, f"{grade_id}: cell {position} is a second copy of this answer "
                                                  "cell; kept it as an ordinary cell (its code still runs, only "
                                                  "the first copy is graded as the answer).", False)
            self.keep_plain(position, cell)
        else:
            self.note("duplicate-cell", grade_id, f"{grade_id}: cell {position} is a second copy of this "
                                                  "read-only cell; dropped it.", True)

    def add_answer(self, position, cell, grade_id):
        """A solution cell: the student's text, with the release's type and nbgrader metadata."""
        release_cell = self.release_cells[grade_id]
        self.compare_with_release(position, cell, grade_id)
        metadata = student_metadata(cell)
        metadata["nbgrader"] = copy.deepcopy(nbgrader_of(release_cell))
        self.append(grade_id, position, release_cell["cell_type"], cell, metadata)

    def add_instructors(self, position, cell, grade_id):
        """A read-only cell: replaced by the source's, which holds the hidden tests."""
        release_cell = self.release_cells[grade_id]
        # The instructor's own version (hidden tests included) is what replaces it anyway.
        known = {comparable(source_of(release_cell)), comparable(source_of(self.source_cell(grade_id)))}
        if comparable(source_of(cell)) not in known:
            if as_released(cell):
                self.note("earlier-release-cell", grade_id, f"{grade_id}: this read-only cell is as an earlier "
                                                            "release handed it out (its nbgrader checksum matches); "
                                                            "replaced it by the current version.", False)
            else:
                self.note("locked-cell-modified", grade_id, f"{grade_id}: the content of this read-only cell was "
                                                            "changed; replaced it by the instructor's version.", True)
        self.compare_with_release(position, cell, grade_id)
        original = self.source_cell(grade_id)
        self.output.append([grade_id, make_cell(original["cell_type"], source_of(original) or "",
                                                original.get("metadata", {}), cell.get("id"),
                                                original.get("attachments"))])

    def compare_with_release(self, position, cell, grade_id):
        """Report a changed cell type, points or nbgrader flags (the release's are restored)."""
        release_cell = self.release_cells[grade_id]
        if cell.get("cell_type") != release_cell["cell_type"]:
            self.note("cell-type-changed", grade_id, f"{grade_id}: the cell type was changed from "
                                                     f"{release_cell['cell_type']} to {cell.get('cell_type')}; "
                                                     f"restored to {release_cell['cell_type']}.", False)
        theirs, ours = nbgrader_of(cell), nbgrader_of(release_cell)
        before, after = ours.get("points", MISSING), theirs.get("points", MISSING)
        if not same_value(before, after):
            self.note("points-changed", grade_id, f"{grade_id}: points changed from {shown(before)} to "
                                                  f"{shown(after)}; restored to {shown(before)}.", True)
        changed = [f"{name} {shown(ours.get(name, False))} -> {shown(theirs.get(name, False))}"
                   for name in FLAGS if not same_value(ours.get(name, False), theirs.get(name, False))]
        if changed:
            self.note("metadata-changed", grade_id, f"{grade_id}: nbgrader flags changed ({', '.join(changed)}); "
                                                    "restored the release's.", True)

    def source_cell(self, grade_id):
        if grade_id in self.source_cells:
            return self.source_cells[grade_id]
        self.note("no-source-cell", grade_id, f"{grade_id}: the instructor's source notebook has no such cell; "
                                              "used the release's version, without hidden tests.", False)
        return self.release_cells[grade_id]

    def append(self, grade_id, position, cell_type, cell, metadata):
        source = source_of(cell)
        if source is None:
            self.note("bad-cell", grade_id or "", f"Cell {position} has no readable source text; kept it empty.",
                      False)
        new = make_cell(cell_type, source or "", metadata, cell.get("id"), cell.get("attachments"))
        if not is_valid_cell(new):
            # Broken Jupyter metadata (tags, collapsed...) would make the whole notebook invalid.
            self.note("bad-cell", grade_id or "", f"Cell {position} had metadata or attachments that nbformat "
                                                  "rejects; kept only its text and nbgrader metadata.", False)
            kept = {"nbgrader": metadata["nbgrader"]} if "nbgrader" in metadata else {}
            new = make_cell(cell_type, source or "", kept, cell.get("id"))
        self.output.append([grade_id, new])

    # Release cells that never appeared.

    def insert_missing_cells(self):
        present = {held for held, _ in self.output if held}
        for grade_id in self.release_order:
            if grade_id in present:
                continue
            release_cell = self.release_cells[grade_id]
            if is_autograded_answer(release_cell):
                # Its code may live in a cell the student renamed or added: a stub would overwrite it.
                self.note("missing-solution-cell", grade_id, f"{grade_id}: this answer cell is missing (deleted or "
                                                             "renamed); not re-inserted, so the tests run with "
                                                             "whatever code the notebook defines.", False)
                continue
            self.insert_after_predecessor(grade_id, release_cell)
            present.add(grade_id)

    def insert_after_predecessor(self, grade_id, release_cell):
        """Re-insert the cell after the nearest earlier release cell the output holds."""
        if is_students(release_cell):   # a manually graded answer: the empty stub the student was given
            original, what = release_cell, "the empty answer cell of the release"
        else:
            original, what = self.source_cell(grade_id), "the instructor's version"
        # The submission's ids come first: a renamed cell may still hold this cell's id.
        taken = {cell.get("id") for _, cell in self.output}
        cell_id = original.get("id") if original.get("id") not in taken else None
        new = make_cell(original["cell_type"], source_of(original) or "", original.get("metadata", {}),
                        cell_id, original.get("attachments"))
        index, where = 0, "at the top of the notebook"
        positions = {held: i for i, (held, _) in enumerate(self.output) if held}
        for earlier in reversed(self.release_order[:self.release_order.index(grade_id)]):
            if earlier in positions:
                index, where = positions[earlier] + 1, f"after {earlier}"
                break
        self.output.insert(index, [grade_id, new])
        self.note("missing-cell", grade_id, f"{grade_id}: this cell is missing from the submission; "
                                            f"re-inserted {what} {where}.", is_test(release_cell))

    def report_moved_cells(self):
        """Cells are left in the student's order; one that moved may run before what it needs."""
        held = [grade_id for grade_id, _ in self.output if grade_id]
        in_order = longest_ordered_subsequence([self.release_order.index(grade_id) for grade_id in held])
        for k, grade_id in enumerate(held):
            if k not in in_order:
                self.note("cell-moved", grade_id, f"{grade_id}: this cell was moved out of the assignment's order; "
                                                  "left where the student put it, and it runs there.", False)

    # The result.

    def notebook(self):
        cells = [cell for _, cell in self.output]
        duplicated = make_ids_unique(cells)
        if duplicated:
            self.note("duplicate-cell-id", "", f"Cell ids {', '.join(duplicated)} were held by more than one cell; "
                                               "gave the later cells new ids.", False)
        notebook = new_notebook(cells=cells, metadata=copy.deepcopy(dict(self.release.get("metadata", {}))))
        minor = self.release.get("nbformat_minor")
        notebook.nbformat_minor = max(minor if isinstance(minor, int) else 0, IDS_SINCE_MINOR)
        try:
            nbformat.validate(notebook)
        except Exception as exc:   # not expected, since every cell was checked; say so rather than fail
            self.note("invalid-notebook", "", f"The normalized notebook does not pass nbformat's validation "
                                              f"({brief(exc)}); grading it anyway.", False)
        return notebook
