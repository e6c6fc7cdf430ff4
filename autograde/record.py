"""Writing results into the nbgrader gradebook: done by one process only, one
student at a time, so SQLite is never written concurrently.

The executed notebooks already hold every test cell's output (from the
grader's run), so nbgrader is asked to score and store them without running
anything again: its Autograde steps minus clearing outputs and executing."""
import datetime
import shutil
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry

BACKUPS_KEPT = 5

SANITIZE_WITHOUT_CLEARING = [
    "nbgrader.preprocessors.DeduplicateIds",
    "nbgrader.preprocessors.OverwriteKernelspec",
    "nbgrader.preprocessors.OverwriteCells",
    "nbgrader.preprocessors.CheckCellMetadata",
]
SCORE_WITHOUT_EXECUTING = [
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]


def scoring_config(config):
    """A copy of the course configuration whose autograde only scores."""
    config = config.copy()
    config.Autograde.sanitize_preprocessors = SANITIZE_WITHOUT_CLEARING
    config.Autograde.autograde_preprocessors = SCORE_WITHOUT_EXECUTING
    return config


def backup_gradebook(out):
    """Copy gradebook.db to backups/ before a run changes it; keep the last few."""
    db = Path(out) / "gradebook.db"
    if not db.exists():
        return None
    folder = Path(out) / "backups"
    folder.mkdir(exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
    target = folder / f"gradebook-{stamp}.db"
    shutil.copy2(db, target)
    for old in sorted(folder.glob("gradebook-*.db"))[:-BACKUPS_KEPT]:
        old.unlink()
    return target


def manual_grades(db_url, assignment, student):
    """(notebook, grade_id) -> manual score, for cells an instructor graded by hand."""
    found = {}
    with Gradebook(db_url) as gb:
        try:
            submission = gb.find_submission(assignment, student)
        except MissingEntry:
            return found
        for notebook in submission.notebooks:
            for grade in notebook.grades:
                if grade.manual_score is not None:
                    found[(notebook.name, grade.name)] = float(grade.manual_score)
    return found


def manual_conflicts(db_url, assignment, student, before):
    """Sentences for hand-given grades that a new automatic score disagrees with."""
    notes = []
    if not before:
        return notes
    with Gradebook(db_url) as gb:
        submission = gb.find_submission(assignment, student)
        for notebook in submission.notebooks:
            for grade in notebook.grades:
                key = (notebook.name, grade.name)
                if key in before and grade.auto_score is not None and float(grade.auto_score) != before[key]:
                    notes.append(f"{notebook.name}:{grade.name}: the manual grade {before[key]:g} is kept, but the "
                                 f"new automatic score is {float(grade.auto_score):g}")
    return notes


def zero_automatic_grades(db_url, assignment, student):
    """Nothing gradable was submitted: no earlier automatic score may survive."""
    with Gradebook(db_url) as gb:
        try:
            submission = gb.find_submission(assignment, student)
        except MissingEntry:
            return
        for notebook in submission.notebooks:
            for grade in notebook.grades:
                if grade.auto_score is not None:
                    grade.auto_score = 0
        gb.db.commit()


def place_submission(out, assignment, student, stage, staged, original_folder):
    """The executed notebooks go where nbgrader reads submissions; the files as
    received are kept beside them, in received/."""
    dest = Path(out) / "submitted" / student / assignment
    received = Path(out) / "received" / student / assignment
    for folder in (dest, received):
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
    for name in staged:
        shutil.copy2(Path(stage) / name, dest / name)
    original_folder = Path(original_folder)
    for path in original_folder.glob("*.ipynb"):
        if path.is_file() and not path.is_symlink():
            shutil.copy2(path, received / path.name)
    stamp = original_folder / "timestamp.txt"
    if stamp.is_file() and not stamp.is_symlink():
        shutil.copy2(stamp, dest / "timestamp.txt")
