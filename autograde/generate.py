"""Generate the student notebooks (exercises/) from solutions/ with nbgrader."""
import shutil
import tempfile
from pathlib import Path

from nbgrader.apps import NbGraderAPI

from autograde import nbgrader_revision
from autograde.course import EXERCISES, REPO, SOLUTIONS, CourseError, assignments, nbgrader_config


def generate(assignment, release_dir, *, db_url=None):
    """Run nbgrader's generate_assignment for one assignment; the student
    notebooks land in release_dir/<assignment>/. Without db_url nothing is
    written to a gradebook."""
    nbgrader_revision.install()
    config = nbgrader_config(REPO, source=SOLUTIONS, release=Path(release_dir), db_url=db_url)
    if db_url is None:
        config.GenerateAssignment.no_database = True
        config.SaveCells.enabled = False
    api = NbGraderAPI(config=config)
    result = api.generate_assignment(assignment, force=True, create=True)
    if not result["success"]:
        raise CourseError(f"nbgrader could not generate '{assignment}' from {SOLUTIONS / assignment}:\n"
                          f"{result.get('error') or result.get('log')}")
    return Path(release_dir) / assignment


def generate_all(release_dir):
    return [generate(a, release_dir) for a in assignments()]


def regenerate_exercises():
    """Replace exercises/ with a fresh generation, via a temporary folder so a
    failure never leaves exercises/ half written."""
    with tempfile.TemporaryDirectory() as tmp:
        generate_all(tmp)
        if EXERCISES.exists():
            shutil.rmtree(EXERCISES)
        shutil.copytree(tmp, EXERCISES)
    return sorted(p.relative_to(REPO) for p in EXERCISES.rglob("*.ipynb"))
