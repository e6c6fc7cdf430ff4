"""The student release: a self-contained repository with the book, the
student notebooks and what the book imports, generated from this (private)
instructor's repository. It holds nothing from which an answer or a hidden
test can be read: no solutions/, no references, no checks, no grading engine.

    python -m autograde release DIR

Files come from two places: PUBLIC, copied from this repository as they are,
and release/, the release's own README, tests and publishing workflow."""
import shutil
from pathlib import Path

from autograde.course import REPO, CourseError

# What students and readers get, as it is here.
PUBLIC = ["book", "exercises", "bookutils", "coursekit", "_config.yml", "_toc.yml", "requirements.txt",
          "scripts/env.sh", "scripts/build", "scripts/serve", "scripts/test", "scripts/benchmark"]
RELEASE_ONLY = REPO / "release"  # README.md, pyproject.toml, tests/, .github/
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "_build", ".pytest_cache")


def write_release(destination):
    """Write the release into destination (created, or emptied of all but .git)."""
    out = Path(destination).resolve()
    if out == REPO or REPO in out.parents:
        raise CourseError(f"{out}: the release must be written outside the instructor's repository")
    if out.exists() and not out.is_dir():
        raise CourseError(f"{out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    for entry in out.iterdir():  # a release repository keeps its history; everything else is rewritten
        if entry.name == ".git":
            continue
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    for name in PUBLIC:
        source = REPO / name
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, out / name, ignore=IGNORED)
        else:
            shutil.copy2(source, out / name)
    shutil.copytree(RELEASE_ONLY, out, ignore=IGNORED, dirs_exist_ok=True)
    (out / ".gitignore").write_text(".venv/\n_build/\n__pycache__/\n.pytest_cache/\n.ipynb_checkpoints/\n")
    return out
