"""The README and the guides name only what exists: every script
(`./scripts/x`), every option of a command (checked against the command's own
`--help`), every file or folder of the repository and every relative link.
The student release's README is checked against a release written for the
test. Planted broken references show that the checker reports each kind."""
import functools
import os
import re
import subprocess

import pytest

from autograde.release import write_release
from tests.conftest import REPO

DOCS = ["README.md", "CONTRIBUTING.md", "tests/README.md", "book/instructors.md"]
RELEASE_DOCS = ["release/README.md"]  # checked in a written release, where it is the README

README_MAX_BYTES = 6000  # a front page read in two minutes

# Names of things the course's commands write or that live outside the
# repository; the guides name them, but they are not files of the repository.
OUTPUTS = {"grades.csv", "integrity.txt", "integrity.csv", "gradebook.db", "nbgrader_config.py",
           "autograder.zip", "results.json", "gradescope.json", "jdoe.ipynb", "jdoe_12345_flash.ipynb",
           "export.zip", "_build", ".venv", "grading", "gradescope", "feedback", "received", "backups",
           "submitted", "path", "screenshots"}

SCRIPT = re.compile(r"(?<![\w/.-])(?:\./)?scripts/([\w.-]+)")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
ROLE = re.compile(r"\{(\w+)\}`([^`\n]+)`")  # MyST roles: {doc}`flash/compiler`, {cite}`key`
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
FILE_SUFFIX = re.compile(r"\.(md|py|ipynb|yml|yaml|toml|json|txt|sh|png|cfg)$")


def code_units(text):
    """The lines of fenced code blocks and the inline code spans: the places a
    document names commands, options and paths."""
    units = []
    for block in FENCE.findall(text):
        units += [line for line in block.split("\n") if line.strip()]
    prose = ROLE.sub("", FENCE.sub("", text))
    units += CODE_SPAN.findall(prose)
    return units


def _path_like(token):
    token = token.lstrip("('\"").rstrip(".,;:)'\"")
    if not token or token.startswith(("/", "../", "http", "-", "$", "~")) or "=" in token:
        return None
    if any(c in token for c in "<>*{}") or "..." in token:
        return None
    if token.startswith("./"):
        token = token[2:]
    if "/" not in token and not FILE_SUFFIX.search(token):
        return None
    if not re.fullmatch(r"[\w.@/-]+", token):
        return None
    return token


def _exists(token, doc_dir, root, tracked_names):
    if token.split("/")[0] in OUTPUTS or token.rstrip("/") in OUTPUTS:
        return True
    for base in (doc_dir, root):
        if (base / token).exists():
            return True
    # A bare file name (test_checks.py) may name a file anywhere in the tree.
    return "/" not in token and token in tracked_names


def problems(text, doc_dir, root, options_of):
    """What the document names that does not exist, one line each.
    options_of(script) -> the long options the script accepts (None: no such script)."""
    found = []
    tracked_names = file_names(root)
    for unit in code_units(text):
        scripts = SCRIPT.findall(unit)
        for name in scripts:
            if options_of(name) is None:
                found.append(f"no script scripts/{name} (in `{unit.strip()}`)")
        for option in OPTION.findall(unit):
            named = [s for s in scripts if options_of(s) is not None]
            if named:
                if not any(option in options_of(s) for s in named):
                    found.append(f"{option} is not an option of scripts/{'/'.join(named)} (in `{unit.strip()}`)")
            elif not any(option in options_of(s) for s in all_scripts(root)):
                found.append(f"{option} is an option of no script (in `{unit.strip()}`)")
        for token in unit.split():
            if SCRIPT.search(token):
                continue
            path = _path_like(token)
            if path and not _exists(path, doc_dir, root, tracked_names):
                found.append(f"no file or folder {path} (in `{unit.strip()}`)")
    for role, target in ROLE.findall(FENCE.sub("", text)):
        target = re.sub(r"^.*<(.+)>$", r"\1", target)  # {doc}`the title <page>`
        if role == "doc" and not any((doc_dir / (target + suffix)).exists() for suffix in (".md", ".ipynb")):
            found.append(f"no page {target} (in {{doc}}`{target}`)")
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        if not (doc_dir / target.split("#")[0]).exists():
            found.append(f"broken link {target}")
    return found


@functools.cache
def file_names(root):
    """The names of the files and folders under root, less what the tools make."""
    names = set()
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in {".git", ".venv", "_build", "__pycache__"}]
        names.update(dirs, files)
    return names


def all_scripts(root):
    return sorted(p.name for p in (root / "scripts").iterdir() if p.is_file())


@functools.cache
def script_options(root, name):
    """The long options a script accepts: those its --help lists. A script
    that passes no arguments on ("$@") accepts none; None: no such script."""
    path = root / "scripts" / name
    if not path.is_file():
        return None
    if '"$@"' not in path.read_text():
        return frozenset()
    proc = subprocess.run([str(path), "--help"], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"scripts/{name} --help failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    return frozenset(OPTION.findall(proc.stdout))


def _options(root):
    return lambda name: script_options(root, name)


@pytest.mark.parametrize("doc", DOCS)
def test_documents_name_only_what_exists(doc):
    path = REPO / doc
    found = problems(path.read_text(), path.parent, REPO, _options(REPO))
    assert not found, f"{doc} names what does not exist:\n" + "\n".join(found)


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return write_release(tmp_path_factory.mktemp("release") / "attention-course")


@pytest.mark.parametrize("doc", RELEASE_DOCS)
def test_release_readme_names_only_what_the_release_has(doc, release):
    # The release's scripts are the instructor's own, so their options are read here.
    def options_of(name):
        return script_options(REPO, name) if (release / "scripts" / name).is_file() else None

    found = problems((REPO / doc).read_text(), release, release, options_of)
    assert not found, f"{doc} names what the release does not have:\n" + "\n".join(found)


def test_readme_is_a_short_front_page():
    size = len((REPO / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; the guides hold the details"


def test_the_checker_reports_each_kind_of_broken_reference():
    planted = "\n".join([
        "Run `./scripts/nope` first.",
        "```bash",
        "./scripts/grade ch1_principles submitted --out grading --no-such-option",
        "```",
        "Pass `--frobnicate` to taste; the checks live in `autograde/chekcs/`.",
        "See [the guide](GUIDE_THAT_IS_NOT_THERE.md) and `tests/test_nothing.py`.",
        "The page {doc}`flash/no_such_page` explains it.",
    ])
    found = "\n".join(problems(planted, REPO / "book", REPO, _options(REPO)))
    for broken in ["scripts/nope", "--no-such-option", "--frobnicate", "autograde/chekcs/",
                   "GUIDE_THAT_IS_NOT_THERE.md", "tests/test_nothing.py", "flash/no_such_page"]:
        assert broken in found, f"{broken} was not reported:\n{found}"


def test_the_checker_accepts_what_exists():
    fine = "\n".join([
        "```bash",
        "./scripts/grade ch1_principles submitted --out grading/ch1 --workers 2",
        "./scripts/gradescope ch1_principles --out gradescope/ch1 --hidden-visibility visible",
        "```",
        "The checks live in `autograde/checks/`; see [the guide](../CONTRIBUTING.md) and `test_checks.py`.",
        "Options of any command: `--memory-limit`, `--causal`.",
        "The page {doc}`the compiler <../book/flash/compiler>` explains it.",
    ])
    assert problems(fine, REPO / "tests", REPO, _options(REPO)) == []
