"""Where the course's notebooks live and how nbgrader is configured for them.

The repository is an nbgrader course: `solutions/` is nbgrader's source
directory (instructor notebooks) and `exercises/` its release directory
(student notebooks, generated). Grading runs in a separate course directory
of its own (see autograde.grade)."""
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = REPO / "solutions"
EXERCISES = REPO / "exercises"

CELL_TIMEOUT_S = 120


SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def solution_code(source_cell):
    """An instructor's solution cell as a student who solved it would leave it."""
    return without_solution_markers(source_cell.source)


def without_solution_markers(source):
    """A solution cell's source with nbgrader's solution markers taken out."""
    return "\n".join(ln for ln in source.split("\n") if ln.strip() not in SOLUTION_MARKERS)


class CourseError(Exception):
    """A problem with the instructor's input (names, paths): printed, not traced."""


def assignments():
    """Names of the assignments: the folders of solutions/ holding notebooks."""
    return sorted(p.name for p in SOLUTIONS.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def uses_triton(assignment):
    """Whether the assignment's notebooks define Triton kernels."""
    return any("import triton" in path.read_text() for path in source_notebooks(assignment))


def source_notebooks(assignment):
    folder = SOLUTIONS / assignment
    if assignment not in assignments():
        known = ", ".join(assignments()) or "none"
        raise CourseError(f"unknown assignment '{assignment}': no notebooks in {folder} (known: {known})")
    return sorted(folder.glob("*.ipynb"))


def nbgrader_config(root, *, source="source", release="release", db_url=None,
                    cell_timeout=CELL_TIMEOUT_S):
    """The nbgrader configuration shared by generation and grading."""
    # imported here: the benchmark reads SOLUTIONS from this module on GPU machines without Jupyter
    from traitlets.config import Config

    c = Config()
    c.CourseDirectory.root = str(root)
    c.CourseDirectory.source_directory = str(source)
    c.CourseDirectory.release_directory = str(release)
    if db_url is not None:
        c.CourseDirectory.db_url = db_url
    c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
    c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
    # A cell that runs longer than this is stopped and scored 0; the rest of
    # the notebook still runs.
    c.Execute.timeout = cell_timeout
    c.Execute.interrupt_on_timeout = True
    # nbgrader scores a test cell 0 if anything reaches stderr. A warning is
    # not a failure (np.log(mask) for an additive mask warns about log(0)), so
    # stderr output that is a Python warning is dropped before scoring.
    c.IgnorePattern.enabled = True
    c.IgnorePattern.pattern = r"\w*Warning: "
    # Quiet the kernel's start-up warnings in the instructor's terminal.
    c.Execute.extra_arguments = ["--IPKernelApp.log_level=ERROR"]
    # Feedback shows what each test checked, never the hidden test code.
    c.GenerateFeedback.preprocessors = [
        "nbgrader.preprocessors.GetGrades",
        "autograde.feedback.RedactHiddenTests",
        "autograde.feedback.InertStudentHTML",
        "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
    ]
    return c


def config_file_text(config):
    """The same configuration as an nbgrader_config.py, for nbgrader's own
    commands (formgrader, export) run inside a grading folder."""
    lines = ["# Written by the course's grading command; nbgrader reads it when run from this folder.",
             "c = get_config()  # noqa: F821"]
    for section, values in config.items():
        for key, value in values.items():
            lines.append(f"c.{section}.{key} = {value!r}")
    return "\n".join(lines) + "\n"
