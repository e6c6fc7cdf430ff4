"""Where Triton kernels run is decided once, before Triton is imported
(coursekit.triton_env). A module that imports Triton before that decision, on a
machine without a GPU and with TRITON_INTERPRET unset (an instructor's shell),
leaves Triton's own library (tl.max, tl.sum...) made for compiling; every
interpreted kernel that calls it then fails with "Cannot call @triton.jit'd
outside of the scope of a kernel", as the grader's worker once did."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("coursekit", "bookutils", "autograde", "student_runtime")
# Entry points that run a command when imported, and Sphinx's extension (needs Sphinx's app).
SKIP = {"autograde.__main__", "bookutils.sphinx_site"}

# Imports torch once (Triton is not imported by it), then forks a child per module:
# the child imports the module, then asks where kernels run, as any later code of
# the process does, and says whether Triton, if the module imported it, is in one
# mode with its library.
PROBE = r"""
import importlib, os, sys
import torch

for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
            from coursekit.triton_env import triton_device
            triton_device(quiet=True)
            language = sys.modules.get("triton.language")
            if language is None:
                print(name, "no-triton")
            else:
                from triton.runtime.interpreter import InterpretedFunction
                mixed = (os.environ.get("TRITON_INTERPRET") == "1") != isinstance(language.max, InterpretedFunction)
                print(name, "mixed" if mixed else "ok", flush=True)
        except Exception as exc:
            print(name, "error", type(exc).__name__, str(exc).replace("\n", " ")[:300], flush=True)
        sys.stdout.flush()
        os._exit(0)
    os.waitpid(pid, 0)
"""


def course_modules():
    names = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if name not in SKIP:
                names.append(name)
    return names


@pytest.mark.slow
def test_every_course_module_decides_before_importing_triton():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""          # a machine without a GPU, whatever this one has
    env["PYTHONPATH"] = str(REPO)
    modules = course_modules()
    proc = subprocess.run([sys.executable, "-c", PROBE, *modules], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=900)
    results = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert set(results) == set(modules), proc.stderr[-3000:]
    wrong = {name: result for name, result in results.items() if not result.startswith(("ok", "no-triton"))}
    assert not wrong, wrong
    assert sum(result == "ok" for result in results.values()) >= 5     # the probe saw Triton imported


def test_a_late_switch_to_the_interpreter_is_refused_with_a_message():
    code = ("import triton\nfrom coursekit.triton_env import triton_device, TritonModeError\n"
            "try:\n    triton_device(quiet=True)\nexcept TritonModeError as exc:\n    print('refused:', exc)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=300)
    assert "refused: Triton was imported before" in proc.stdout, proc.stdout + proc.stderr


# Triton's interpreter before 3.7 cannot run a loop over tensor bounds with NumPy 2.4 or later
# (seen with Triton 3.6.0 and NumPy 2.4.6: "only 0-dimensional arrays can be converted to Python
# scalars"; Triton 3.6.0 with NumPy 2.3.5, and Triton 3.7.0's interpreter, convert it).
VERSIONS = [("3.6.0", "2.4.6", True), ("3.5.1", "2.4.0", True), ("3.6.0", "2.3.5", False),
            ("3.7.0", "2.4.6", False), ("3.9.0", "2.5.0.dev0", False), ("3.6.0+git1234", "2.4.0rc1", True)]


@pytest.mark.parametrize("triton_version, numpy_version, broken", VERSIONS)
def test_a_triton_that_cannot_interpret_loops_with_this_numpy_is_named(monkeypatch, triton_version,
                                                                      numpy_version, broken):
    import importlib.metadata

    import numpy as np

    from coursekit.triton_env import interpreter_problem

    monkeypatch.setattr(importlib.metadata, "version", lambda name: {"triton": triton_version}[name])
    monkeypatch.setattr(np, "__version__", numpy_version)
    problem = interpreter_problem()
    assert (problem is not None) == broken, problem
    if broken:
        assert f"Triton {triton_version}" in problem and f"NumPy {numpy_version}" in problem and "numpy<2.4" in problem


def test_the_installed_triton_and_numpy_interpret_loops():
    from coursekit.triton_env import interpreter_problem

    assert interpreter_problem() is None


@pytest.mark.parametrize("triton_version, numpy_version, broken", VERSIONS)
def test_chapter_4s_setup_cell_names_the_same_versions(monkeypatch, capsys, triton_version, numpy_version, broken):
    """The notebook runs alone (Colab, a download), without coursekit: its setup cell has its own copy of the rule."""
    import nbformat
    import numpy as np
    import triton

    from tests.notebooks import nbgrader_meta

    cell = next(c for c in nbformat.read(REPO / "solutions" / "ch4_flash" / "flash.ipynb", as_version=4).cells
                if nbgrader_meta(c).get("grade_id") == "setup")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(triton, "__version__", triton_version)
    monkeypatch.setattr(np, "__version__", numpy_version)
    exec(compile(cell.source, "setup", "exec"), {})
    said = capsys.readouterr().out
    assert (f"Triton {triton_version}'s interpreter cannot run loops" in said) == broken, said
