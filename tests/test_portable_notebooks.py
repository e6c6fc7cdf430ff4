"""Every released notebook runs where the introduction sends students: copied alone
into an empty folder and run by a Python that has the libraries the introduction
names (NumPy, PyTorch, Triton) and Jupyter's kernel, and none of the course's
packages. As handed out, a notebook stops only at its unsolved stubs
(NotImplementedError) and at the visible tests that call them (those errors or
failed assertions), never at a missing import or name; solved as the instructor
solved it, every cell runs, and a cell that would use the course's toolkit says
how to install it instead. The Python used reads the course's installed
libraries, more than the introduction names, so another test checks that the
notebooks import nothing else beyond Python's standard library; and the forward
kernel Chapter 4's notebook carries computes exactly what the book's does."""
import ast
import importlib.util
import json
import linecache
import os
import subprocess
import sys
import time

import nbformat
import pytest
import yaml
from jupyter_client import AsyncKernelManager
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient
from traitlets import default

from tests.conftest import REPO, outer_environ
from tests.notebooks import filled_submission
from tests.submissions import CLASSES, notebook_paths

pytestmark = pytest.mark.slow

COURSE_PACKAGES = ("bookutils", "coursekit", "autograde", "student_runtime")
NAMED = ("numpy", "torch", "triton")       # the libraries the introduction names
LIBRARIES = NAMED + ("ipykernel",)
# What an unsolved notebook may stop at: its stubs, and the visible tests that call them.
UNSOLVED = {"NotImplementedError", "AssertionError"}
CELL_TIMEOUT = 900      # seconds; Chapter 4's kernels run in Triton's interpreter without a GPU
ASSIGNMENTS = sorted(CLASSES)

PROBE = f"""\
import importlib.util, json, sys
print(json.dumps({{"python": sys.executable,
                  "found": [n for n in {COURSE_PACKAGES!r} if importlib.util.find_spec(n) is not None],
                  "missing": [n for n in {LIBRARIES!r} if importlib.util.find_spec(n) is None]}}))"""


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A Python with the course's libraries and not the course: a new virtual
    environment whose site-packages lists this one's in a .pth file. A path line
    adds that folder to sys.path without reading the .pth files inside it, and the
    editable install of the course (its import hook) is one of those."""
    libraries = os.path.dirname(importlib.util.find_spec("torch").submodule_search_locations[0])
    root = tmp_path_factory.mktemp("bare-python")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(purelib, "course-libraries.pth"), "w") as pth:
        pth.write(libraries + "\n")
    return python


def kernel_environment(python):
    """The user's environment less what would hand the kernel this repository:
    PYTHONPATH (scripts/env.sh puts the repository there) and the course's .venv."""
    env = {k: v for k, v in outer_environ().items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")}
    venv_bin = str(REPO / ".venv" / "bin")
    env["PATH"] = os.pathsep.join([str(python.parent)] + [p for p in env.get("PATH", "").split(os.pathsep)
                                                           if p and p != venv_bin])
    return env


def kernel_manager_class(python, spec_root):
    """A kernel manager that starts IPython's kernel with `python`, through a kernel spec of its own."""
    spec = spec_root / "bare"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python without the course", "language": "python"}))

    class BareKernelManager(AsyncKernelManager):
        @default("kernel_spec_manager")
        def _bare_specs(self):
            return KernelSpecManager(kernel_dirs=[str(spec_root)])

    return BareKernelManager


def run_alone(notebook, name, python, folder):
    """Run `notebook` saved as `name`, alone in the empty `folder`, by `python`'s kernel,
    every cell even after errors: (the executed notebook, what the probe saw, seconds)."""
    notebook = nbformat.reads(nbformat.writes(notebook), as_version=4)   # a copy, changed below
    notebook.cells.insert(0, nbformat.v4.new_code_cell(PROBE))
    folder.mkdir()
    nbformat.write(notebook, folder / name)
    assert [p.name for p in folder.iterdir()] == [name]
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT, allow_errors=True, kernel_name="bare",
                            kernel_manager_class=kernel_manager_class(python, folder.parent / f"{folder.name}-spec"))
    start = time.monotonic()
    client.execute(cwd=str(folder), env=kernel_environment(python))
    seconds = time.monotonic() - start
    probe = notebook.cells.pop(0)
    seen = json.loads("".join(o.get("text", "") for o in probe.outputs if o.output_type == "stream"))
    return notebook, seen, seconds


def errors(notebook):
    """(grade_id or cell number, error name, message) for every cell that raised."""
    found = []
    for number, cell in enumerate(notebook.cells):
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                where = cell.metadata.get("nbgrader", {}).get("grade_id", f"cell {number}")
                found.append((where, out.ename, out.evalue))
    return found


def check_the_kernel(seen, python):
    assert seen["python"] == str(python), f"the notebook ran in {seen['python']}, not the bare Python"
    assert not seen["found"], f"the course's packages are importable in the bare Python: {seen['found']}"
    assert not seen["missing"], f"libraries the notebooks need are missing from the bare Python: {seen['missing']}"


def check_toolkit_cells(notebook, assignment):
    """A cell that would use the course's toolkit says how to install it from the course's repository."""
    url = yaml.safe_load((REPO / "_config.yml").read_text())["repository"]["url"]
    for cell in notebook.cells:
        if cell.cell_type == "code" and any(f"{verb} {package}" in cell.source for verb in ("import", "from")
                                            for package in COURSE_PACKAGES):
            said = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
            assert f'pip install "git+{url}"' in said, (
                f"{assignment}: {cell.metadata.get('nbgrader', {}).get('grade_id')}: without the course's toolkit "
                f"this cell should say how to install it from {url}; it printed {said!r}")


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_released_notebook_runs_alone_up_to_its_stubs(assignment, bare_python, tmp_path):
    _, release = notebook_paths(assignment)
    notebook, seen, seconds = run_alone(nbformat.read(release, as_version=4), release.name, bare_python,
                                        tmp_path / "alone")
    check_the_kernel(seen, bare_python)
    print(f"{assignment} as released: {seconds:.0f} s")
    found = errors(notebook)
    unexpected = [e for e in found if e[1] not in UNSOLVED]
    assert not unexpected, (f"exercises/{assignment}/{release.name}, run alone without the course's packages: "
                            + "; ".join(f"{where}: {name}: {message}" for where, name, message in unexpected))
    assert any(name == "NotImplementedError" for _, name, _ in found), "no stub raised: is this the released notebook?"
    check_toolkit_cells(notebook, assignment)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_solved_notebook_runs_alone_without_an_error(assignment, bare_python, tmp_path):
    source, release = notebook_paths(assignment)
    notebook, seen, seconds = run_alone(filled_submission(release, source), release.name, bare_python,
                                        tmp_path / "alone")
    check_the_kernel(seen, bare_python)
    print(f"{assignment} solved: {seconds:.0f} s")
    found = errors(notebook)
    assert not found, (f"exercises/{assignment}/{release.name} solved, run alone without the course's packages: "
                       + "; ".join(f"{where}: {name}: {message}" for where, name, message in found))
    check_toolkit_cells(notebook, assignment)


def imported_modules(notebook):
    """(grade_id or cell number, top-level module) for every import in a code cell."""
    found = []
    for number, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        where = cell.metadata.get("nbgrader", {}).get("grade_id", f"cell {number}")
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Import):
                found += [(where, alias.name.split(".")[0]) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                found.append((where, node.module.split(".")[0]))
    return found


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_notebooks_import_only_what_the_introduction_names(assignment):
    """The course's packages may only be tried (Chapter 4's compile report, which says how to
    install them where they are missing); anything else comes with Python or is named."""
    source, release = notebook_paths(assignment)
    for notebook in (nbformat.read(release, as_version=4), filled_submission(release, source)):
        other = [(where, module) for where, module in imported_modules(notebook)
                 if module not in sys.stdlib_module_names and module not in NAMED + COURSE_PACKAGES]
        assert not other, f"exercises/{assignment}/{release.name} imports what the introduction does not name: {other}"


def test_the_forward_kernel_chapter_4_carries_is_the_books():
    """Bit for bit, on strided views, ragged lengths, a padded head width, causal or not."""
    import torch

    from bookutils.triton_kernels import flash_forward

    _, release = notebook_paths("ch4_flash")
    namespace = {"__name__": "chapter4_given"}
    for cell in nbformat.read(release, as_version=4).cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") in ("setup", "flash_function"):
            name = f"<ch4_flash {cell.metadata.nbgrader.grade_id}>"       # @triton.jit reads the source
            linecache.cache[name] = (len(cell.source), None, cell.source.splitlines(keepends=True), name)
            exec(compile(cell.source, name, "exec"), namespace)
    gen, device = torch.Generator().manual_seed(0), namespace["DEVICE"]
    for n, d in ((37, 20), (70, 64)):
        both = torch.randn(2, n, 3, 2 * d, generator=gen).to(device)  # (B, N, H, D) projections as (B, H, N, D)
        q, k = both[..., :d].transpose(1, 2), both[..., d:].transpose(1, 2)
        v = torch.randn(2, 3, d, n, generator=gen).to(device).transpose(2, 3)  # the head dimension not contiguous
        for causal, scale in ((False, None), (True, 0.3)):
            carried, book = namespace["flash_forward"](q, k, v, causal, scale), flash_forward(q, k, v, causal, scale)
            assert all(torch.equal(a, b) for a, b in zip(carried, book)), f"n={n}, d={d}, causal={causal}"
