"""The instructor's Chapter 4 kernels (the solutions of the backward-pass and
decoding exercises), loaded from the solution notebook for the benchmark.

They are answers, so they live only in the instructor's repository:
bookutils.benchmark asks for them here and omits their rows where this package
is absent (the student release)."""
import contextlib
import io
import json
import linecache
import types

from autograde.course import SOLUTIONS, without_solution_markers

NOTEBOOK = SOLUTIONS / "ch4_flash" / "flash.ipynb"


def _run(code, namespace, label):
    # @triton.jit reads its function's source through inspect, which needs linecache
    filename = f"<solution {label}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
    exec(compile(code, filename, "exec"), namespace)


def _code_cells(path):
    """(nbgrader metadata, source) of each code cell. The notebook's JSON is read
    directly: a GPU machine that runs the benchmark with PYTHONPATH alone has no
    nbformat (or any of Jupyter)."""
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "code":
            source = cell["source"]     # a string, or nbformat's list of lines
            yield cell.get("metadata", {}).get("nbgrader", {}), "".join(source)


def chapter4_kernels():
    """A namespace with the notebook's setup and every solution cell run in order:
    flash_attention_backward, FlashAttention (the book's forward kernel with that
    backward, as an autograd function) and decode_attention among them."""
    namespace = {"__name__": "chapter4_solutions"}
    with contextlib.redirect_stdout(io.StringIO()):   # the setup cell reports the Triton mode
        for meta, source in _code_cells(NOTEBOOK):
            if meta.get("grade_id") == "setup":
                _run(source, namespace, "setup")
            elif meta.get("solution") or meta.get("grade_id") == "flash_function":
                _run(without_solution_markers(source), namespace, meta["grade_id"])
    return types.SimpleNamespace(**{name: namespace[name] for name in
                                    ("flash_attention_backward", "FlashAttention", "decode_attention")})
