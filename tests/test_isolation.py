"""What student code can see and do inside the grading sandbox (bubblewrap
namespaces): nothing of the course, the grader or other students, no network,
a bounded private folder of its own that is gone afterwards."""
import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from autograde.sandbox import Limits, Sandbox, namespaces_available, student_function
from tests.conftest import REPO, outer_environ

pytestmark = pytest.mark.skipif(namespaces_available() is not None, reason=f"{namespaces_available()}")


@pytest.fixture()
def sandbox():
    with Sandbox(Limits(call_timeout_s=30)) as sb:
        yield sb


def output(sb, source):
    reply = sb.run_cell(source)
    assert reply.get("error") is None, reply["error"]
    return reply["stdout"].strip()


@pytest.mark.parametrize("how", [
    "import autograde.reference.principles",
    "from autograde.checks import principles",
    "import importlib; importlib.import_module('autograde.reference.flash')",
    "__import__('autograde')",
])
def test_the_instructors_package_cannot_be_imported(sandbox, how):
    reply = sandbox.run_cell(how)
    assert reply["error"]["type"] in ("ModuleNotFoundError", "ImportError"), reply


def test_the_course_repository_is_not_in_view(sandbox):
    course = str(REPO)
    found = json.loads(output(sandbox, f"""
import json, os, sys
print(json.dumps([os.path.exists({course!r} + '/solutions'), os.path.exists({course!r} + '/autograde'),
                  os.path.exists({str(REPO / 'solutions' / 'ch1_principles' / 'principles.ipynb')!r})]))"""))
    assert found == [False, False, False]
    # What the student side can import is a private copy without autograde beside it.
    where = output(sandbox, "import coursekit, os\nprint(os.listdir(os.path.dirname(os.path.dirname(coursekit.__file__))))")
    assert "autograde" not in where and "solutions" not in where


def test_the_graders_processes_and_command_lines_are_not_in_view(sandbox):
    lines = json.loads(output(sandbox, """
import json, os
seen = []
for pid in os.listdir('/proc'):
    if pid.isdigit():
        try:
            seen.append(open(f'/proc/{pid}/cmdline', 'rb').read().replace(b'\\0', b' ').decode())
        except OSError:
            pass
print(json.dumps(seen))"""))
    assert lines and not [line for line in lines if "pytest" in line or "autograde" in line or str(REPO) in line]
    assert str(os.getpid()) not in output(sandbox, "import os\nprint(os.getppid())")


def test_no_network_not_even_the_loopback_address(sandbox):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    reply = sandbox.run_cell(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)")
    listener.close()
    assert reply["error"] is not None and not accepted


def test_scratch_files_and_helper_modules_work_and_are_private_to_the_student(sandbox):
    assert output(sandbox, "open('scratch.txt', 'w').write('mine')\n"
                           "open('helper_mod.py', 'w').write('def twice(x):\\n    return 2 * x\\n')\n"
                           "import helper_mod\nprint(helper_mod.twice(21), open('scratch.txt').read())") == "42 mine"
    sandbox.restart()  # the next student of this worker
    assert output(sandbox, "import os, tempfile\nprint(sorted(os.listdir('.')), os.listdir(tempfile.gettempdir()))") \
        == "[] []"


def test_the_disk_a_student_can_fill_is_bounded(sandbox):
    reply = sandbox.run_cell("i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'x' * 2**25)\n    i += 1")
    assert reply["error"]["type"] == "OSError"
    assert output(sandbox, "import os\nprint('still here', len(os.listdir('.')) > 1)") == "still here True"


def test_what_a_student_leaves_running_is_ended(sandbox):
    output(sandbox, "import subprocess\nsubprocess.Popen(['sleep', '300'], start_new_session=True)")
    sandbox.restart()
    assert output(sandbox, "import os\nprint(sum(1 for p in os.listdir('/proc') if p.isdigit() and "
                           "b'sleep' in open(f'/proc/{p}/cmdline', 'rb').read()))") == "0"


def test_a_worker_leaves_no_folder_behind(tmp_path):
    code = ("from autograde.sandbox import Sandbox, Limits\n"
            "with Sandbox(Limits()) as sb:\n    sb.run_cell('x = 1')\n")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="user ids of their own need root")
def test_two_grading_processes_never_share_a_student_user_id(sandbox):
    code = "from autograde.sandbox import _student_uid\nprint(_student_uid())"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert int(other.stdout) != sandbox.uid


@pytest.mark.parametrize("code, what", [
    ("try:\n    import autograde.reference.principles\nexcept ImportError:\n    pass", "imports the instructor's package"),
    ("import importlib\ntry:\n    importlib.import_module('autograde')\nexcept ImportError:\n    pass",
     "imports the instructor's package"),
    ("name = '/'.join(['', 'etc', 'host' + 'name'])\nopen(name).close()\ntry:\n"
     "    open('/' + 'root/x')\nexcept OSError:\n    pass", "opens a file outside its folder"),
    ("import subprocess\nsubprocess.run(['true'])", "starts a process"),
    ("import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\nexcept OSError:\n    pass",
     "uses the network"),
])
def test_the_audit_hook_reports_what_student_code_did(code, what):
    with Sandbox(Limits(call_timeout_s=30)) as sb:
        reply = sb.run_cell(code)
        assert reply.get("error") is None, reply["error"]
        sb.run_cell("import numpy as np\nimport matplotlib.pyplot as plt\nopen('notes.txt', 'w').write('mine')")
    whats = [s["what"] for s in sb.sightings]
    assert what in whats, sb.sightings
    assert whats.count("opens a file outside its folder") <= 2, sb.sightings  # honest work is not reported


def test_honest_work_is_not_reported():
    with Sandbox(Limits(call_timeout_s=60)) as sb:
        reply = sb.run_cell("import numpy as np, torch, math, tempfile, os\nimport matplotlib.pyplot as plt\n"
                            "plt.plot([1, 2]); plt.savefig('fig.png')\n"
                            "open(os.path.join(tempfile.gettempdir(), 'scratch'), 'w').write('x')\n"
                            "x = torch.randn(3, 3) @ torch.randn(3, 3)")
        assert reply.get("error") is None, reply["error"]
    assert sb.sightings == []


HONEST_AND_HIDDEN = """
import numpy as np
import tracemalloc

def blockwise(q, k, v):
    out = np.empty_like(q)
    for i in range(0, len(q), 64):
        s = q[i:i + 64] @ k.T
        w = np.exp(s - s.max(axis=1, keepdims=True))
        out[i:i + 64] = (w / w.sum(axis=1, keepdims=True)) @ v
    return out

def hidden(q, k, v):
    tracemalloc.get_traced_memory = lambda: (0, 0)     # the in-process measurement sees nothing from now on
    s = q @ k.T
    w = np.exp(s - s.max(axis=1, keepdims=True))
    return (w / w.sum(axis=1, keepdims=True)) @ v
"""


def test_memory_hidden_from_the_in_process_measurement_is_seen_from_outside():
    import numpy as np

    from autograde.memory import traced_peak
    from autograde.sandbox import student_function

    n = 4096
    q, k, v = (np.random.default_rng(i).normal(size=(n, 4)) for i in range(3))
    with Sandbox(Limits(call_timeout_s=120)) as sb:
        output(sb, HONEST_AND_HIDDEN)
        _, honest = traced_peak(student_function(sb, "blockwise"), q, k, v)
        _, hidden = traced_peak(student_function(sb, "hidden"), q, k, v)
    assert honest < 16 * 2**20
    assert hidden > n * n * 8 * 0.9  # one n x n float64 array at least
    assert [s["what"] for s in sb.sightings] == ["memory measurements disagree"]


PREPARED_BUFFER = """
import numpy as np

SCORES = np.zeros((4096, 4096))   # allocated and touched when the cell runs, before any measurement
SCORES[:] = 1.0

def prepared(q, k, v):
    s = np.matmul(q, k.T, out=SCORES)  # no allocation: neither tracemalloc nor the resident set grows
    s -= s.max(axis=1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=1, keepdims=True)
    return s @ v
"""


def test_memory_prepared_before_the_measurement_is_seen_when_used():
    """A score matrix allocated and touched by an earlier cell, then filled
    in place during the measured call: the pages the call reads and writes are
    counted from outside, so it costs what an n x n array costs."""
    import numpy as np

    from autograde.memory import traced_peak
    from autograde.sandbox import student_function

    n = 4096
    q, k, v = (np.random.default_rng(i).normal(size=(n, 4)) for i in range(3))
    with Sandbox(Limits(call_timeout_s=120)) as sb:
        output(sb, PREPARED_BUFFER)
        _, peak = traced_peak(student_function(sb, "prepared"), q, k, v)
    assert peak > n * n * 8 * 0.9
    assert [s["what"] for s in sb.sightings] == ["memory measurements disagree"]


def test_a_full_collection_during_an_honest_call_is_not_mistaken_for_memory():
    """The libraries' objects are frozen out of the collector in the template,
    so a full garbage collection inside a measured call touches little."""
    import numpy as np

    from autograde.memory import traced_peak
    from autograde.sandbox import student_function

    source = """
import gc
import numpy as np

def collects(q):
    gc.collect()
    return q.sum()
"""
    with Sandbox(Limits(call_timeout_s=120)) as sb:
        output(sb, source)
        _, peak = traced_peak(student_function(sb, "collects"), np.ones((64, 4)))
    assert peak < 16 * 2**20
    assert sb.sightings == []


def _honest_class(root, students):
    from tests.notebooks import filled_submission, write_submission

    source = REPO / "solutions" / "ch1_principles" / "principles.ipynb"
    release = REPO / "exercises" / "ch1_principles" / "principles.ipynb"
    for student in students:
        write_submission(root, student, "ch1_principles", "principles.ipynb", filled_submission(release, source))
    return root


def _grades(out):
    import csv

    with (out / "grades.csv").open() as fh:
        return {row["student_id"]: row for row in csv.DictReader(fh)}


def test_two_grading_commands_at_once_leave_each_other_alone(tmp_path):
    """Two assignments' worth of grading on one machine at the same time: no
    shared user id or folder, so no student of one is ended by the other."""
    commands = []
    for run_name in ("first", "second"):
        submitted = _honest_class(tmp_path / run_name / "submitted", [f"{run_name}_{i}" for i in range(3)])
        commands.append(subprocess.Popen(
            [sys.executable, "-m", "autograde", "grade", "ch1_principles", str(submitted),
             "--out", str(tmp_path / run_name / "out"), "--workers", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for proc in commands:
        output_text = proc.communicate(timeout=1200)[0]
        assert proc.returncode == 0, output_text[-3000:]
    from tests.notebooks import graded_test_cells

    points = graded_test_cells(REPO / "solutions" / "ch1_principles" / "principles.ipynb")
    for run_name in ("first", "second"):
        rows = _grades(tmp_path / run_name / "out")
        assert len(rows) == 3 and {r["status"] for r in rows.values()} == {"graded"}
        for row in rows.values():  # every autograded cell full; the written answer waits for a person
            assert {gid: float(row[f"principles:{gid}"]) for gid in points} == points, row


def test_grading_without_the_environments_bin_on_path(tmp_path):
    """Started with the course's interpreter but a PATH that lacks its bin/:
    nbgrader's tools are found beside the interpreter."""
    submitted = _honest_class(tmp_path / "submitted", ["alice"])
    env = {k: v for k, v in outer_environ().items() if k not in ("VIRTUAL_ENV",)}
    env["PATH"] = "/usr/bin:/bin"
    proc = subprocess.run([sys.executable, "-m", "autograde", "grade", "ch1_principles", str(submitted),
                           "--out", str(tmp_path / "out")], env=env, capture_output=True, text=True,
                          cwd=REPO, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert _grades(tmp_path / "out")["alice"]["status"] == "graded"


def test_an_mmap_backed_score_matrix_is_refused_or_counted():
    """Scores in a file mapped into memory: the file-size limit refuses one of
    n x n at the checks' sizes; with room for it, the file's pages are counted
    (by the kernel, or from /proc and the private /tmp without cgroups), and the
    function keeps its other tests."""
    import numpy as np

    from autograde.memory import traced_peak

    source = """
import numpy as np
def scores_in_a_file(q):
    s = np.memmap('scores.bin', dtype=np.float64, mode='w+', shape=(len(q), len(q)))
    for i in range(0, len(q), 64):
        s[i:i + 64] = q[i:i + 64] @ q.T
    return float(s.max())
"""
    with Sandbox(Limits(call_timeout_s=120)) as sb:
        output(sb, source)
        fn = student_function(sb, "scores_in_a_file")
        with pytest.raises(OSError, match="too large"):
            traced_peak(fn, np.ones((4096, 4)))
    with Sandbox(Limits(call_timeout_s=120, file_bytes=512 * 2**20)) as sb:
        output(sb, source)
        _, peak = traced_peak(student_function(sb, "scores_in_a_file"), np.ones((4096, 4)))
    assert peak > 4096 * 4096 * 8 * 0.9
    assert sb.forfeited == {}
    assert "memory measurements disagree" in [s["what"] for s in sb.sightings]


# ------------------------------------------------------------------ /tmp, as in Jupyter

def test_each_student_process_has_a_private_writable_tmp():
    """A scratch file at a fixed path under /tmp works, as in Jupyter; the next
    student of the worker, and the process without PyTorch beside it, do not see it."""
    with Sandbox(Limits(call_timeout_s=30)) as sb, Sandbox(Limits(call_timeout_s=30), torchless=True) as other:
        assert output(sb, "open('/tmp/notes.txt', 'w').write('mine')\nprint(open('/tmp/notes.txt').read())") == "mine"
        assert output(other, "import os\nprint(os.path.exists('/tmp/notes.txt'))") == "False"
        sb.restart()
        assert output(sb, "import os\nprint(os.path.exists('/tmp/notes.txt'))") == "False"
    assert "opens a file outside its folder" not in [s["what"] for s in sb.sightings]


# ------------------------------------------------------------------ the process without PyTorch

def test_pytorch_cannot_be_reached_in_the_process_without_it():
    """`import torch` gives a stand-in; PyTorch's files are not there to load by
    path or through ctypes; a thread reaching for it fails the same way, and is reported."""
    with Sandbox(Limits(call_timeout_s=60), torchless=True) as sb:
        found = json.loads(output(sb, """
import glob, importlib.util, json, os, threading
import torch
import numpy as np
where = os.path.dirname(importlib.util.find_spec('numpy').origin).replace('numpy', 'torch')
tried = {'files': glob.glob(where + '/**', recursive=True)[1:],
         'tensor': None, 'thread': None}
try:
    torch.tensor([1.0])
except AttributeError as exc:
    tried['tensor'] = type(exc).__name__
box = []
def work():
    try:
        torch.softmax(np.ones(3), 0)
    except AttributeError as exc:
        box.append(type(exc).__name__)
worker = threading.Thread(target=work)
worker.start(); worker.join()
tried['thread'] = box[0]
print(json.dumps(tried))"""))
        assert found == {"files": [], "tensor": "TorchUnavailable", "thread": "TorchUnavailable"}
        events = sb.drain()
    assert {e["detail"] for e in events if e["what"] == "uses PyTorch where the answer is graded as NumPy code"} \
        == {"torch.tensor", "torch.softmax"}


def test_a_cell_that_uses_pytorch_outside_its_function_still_defines_it():
    """Top-level uses of PyTorch (a seed, a comparison printed after the
    definition) are passed over without PyTorch; the cell's functions exist."""
    source = ("import numpy as np\nimport torch\ntorch.manual_seed(0)\n"
              "def twice(x):\n    return 2 * np.asarray(x)\n"
              "print(torch.tensor([1.0]))\ndef thrice(x):\n    return 3 * np.asarray(x)\n")
    with Sandbox(Limits(call_timeout_s=60), torchless=True) as sb:
        reply = sb.run_cell(source)
        assert reply.get("error") is None, reply["error"]
        assert list(student_function(sb, "thrice")([1.0])) == [3.0]


# ------------------------------------------------------------------ the grader's helpers in the student's process

def test_the_graders_helpers_are_the_ones_loaded_before_student_code():
    """A probe rebound by name, or its code replaced, measures as before: the
    server takes the helpers from its snapshot and puts back what changed."""
    import numpy as np

    from autograde.memory import traced_peak

    with Sandbox(Limits(call_timeout_s=60)) as sb:
        output(sb, "import numpy as np\nfrom student_runtime import probes as p\n"
                   "p.inside_peak = lambda fn, *a, **k: (fn(*a, **k), 0)\n"
                   "def square(x):\n    return np.outer(x, x)\n")
        _, peak = traced_peak(student_function(sb, "square"), np.ones(1024))
        assert peak >= 1024 * 1024 * 8
        output(sb, "def nothing(fn, *a, **k):\n    return fn(*a, **k), 0\n"
                   "import student_runtime.probes\nstudent_runtime.probes.inside_peak.__code__ = nothing.__code__")
        _, peak = traced_peak(student_function(sb, "square"), np.ones(1024))
        assert peak >= 1024 * 1024 * 8
        sb.drain()
    whats = [s["what"] for s in sb.sightings]
    assert "changes the grader's helpers in its process" in whats and "replaces the code of a function" in whats


# ------------------------------------------------------------------ memory, as the kernel counts it

needs_cgroups = pytest.mark.skipif(__import__("autograde.cgroups", fromlist=["x"]).unavailable() is not None,
                                   reason="memory cgroups cannot be made here (root and /sys/fs/cgroup needed)")

HIDDEN_SCORES = """
import ctypes, mmap, os, threading, tracemalloc
import numpy as np

tracemalloc.get_traced_memory = lambda: (0, 0)   # the in-process measurement sees nothing from here on
KEPT = np.ones((2048, 2048))                     # allocated and touched before any measured call

def in_a_thread(q):
    box = []
    worker = threading.Thread(target=lambda: box.append(float((q @ q.T).max())))
    worker.start(); worker.join()
    return box[0]

def in_a_forked_child(q):
    pid = ctypes.CDLL(None).fork()
    if pid == 0:
        (q @ q.T).max()
        os._exit(0)
    os.waitpid(pid, 0)
    return 0.0

def in_a_mapping(q):
    buf = mmap.mmap(-1, len(q) * len(q) * 8)
    s = np.frombuffer(buf, dtype=np.float64).reshape(len(q), len(q))
    np.matmul(q, q.T, out=s)
    return float(s.max())

def in_a_tmp_file(q):
    s = np.memmap('/tmp/scores.bin', dtype=np.float64, mode='w+', shape=(len(q), len(q)))
    np.matmul(q, q.T, out=s)
    return float(s.max())

def in_a_kept_buffer(q):
    s = KEPT[:len(q), :len(q)]
    np.matmul(q, q.T, out=s)
    return float(s.max())

def in_tiles(q):
    best = -np.inf
    for i in range(0, len(q), 64):
        best = max(best, float((q[i:i + 64] @ q.T).max()))
    return best

def in_tiles_with_notes(q):
    with open('/tmp/notes.txt', 'w') as fh:   # honest: a few bytes of notes in its own /tmp
        fh.write('tiles of 64 rows')
    return in_tiles(q)
"""

# Memory that an earlier cell charged and shares with a file or another mapping: a call
# can write it again without a new charge, and no page of it is copied.
KEPT_SHARED = """
import mmap, os, tracemalloc
import numpy as np

tracemalloc.get_traced_memory = lambda: (0, 0)
N = 2048

def _shared(buffer):
    return np.frombuffer(buffer, dtype=np.float64).reshape(N, N)

MAPPED = _shared(mmap.mmap(-1, N * N * 8)); MAPPED[:] = 1.0
FILE = np.memmap('/tmp/kept.bin', dtype=np.float64, mode='w+', shape=(N, N)); FILE[:] = 1.0
OPEN = open('/tmp/open.bin', 'w+b'); OPEN.write(bytes(N * N * 8)); OPEN.flush()
MEMFD = os.memfd_create('scores'); os.pwrite(MEMFD, bytes(N * N * 8), 0)

def _into(s, q):
    np.matmul(q, q.T, out=s)
    return float(s.max())

def in_a_kept_shared_mapping(q):
    return _into(MAPPED[:len(q), :len(q)], q)

def in_a_kept_mapped_file(q):
    return _into(FILE[:len(q), :len(q)], q)

def _through(fd, q):
    best = -np.inf
    for i in range(0, len(q), 64):                 # scores written a strip at a time, read back the same way
        os.pwrite(fd, (q[i:i + 64] @ q.T).tobytes(), i * len(q) * 8)
    for i in range(0, len(q), 64):
        best = max(best, np.frombuffer(os.pread(fd, 64 * len(q) * 8, i * len(q) * 8)).max())
    return float(best)

def through_a_file_kept_open(q):
    return _through(OPEN.fileno(), q)

def through_a_kept_memory_fd(q):
    return _through(MEMFD, q)
"""


@needs_cgroups
@pytest.mark.parametrize("where", ["in_a_thread", "in_a_forked_child", "in_a_mapping", "in_a_kept_buffer"])
def test_memory_hidden_from_the_process_is_counted_by_the_kernel(where):
    """An n x n matrix built where tracemalloc (here patched to see nothing)
    cannot see it: in a thread, a child forked through libc, a memory mapping,
    a buffer kept from an earlier cell."""
    import numpy as np

    from autograde.memory import traced_peak

    n = 2048
    with Sandbox(Limits(call_timeout_s=120)) as sb:
        output(sb, HIDDEN_SCORES)
        _, peak = traced_peak(student_function(sb, where), np.random.default_rng(0).normal(size=(n, 4)))
    assert peak > n * n * 8 * 0.9
    assert "memory measurements disagree" in [s["what"] for s in sb.sightings]


KEPT_SHARED_CALLS = ["in_a_kept_shared_mapping", "in_a_kept_mapped_file", "through_a_file_kept_open",
                     "through_a_kept_memory_fd"]


def _without_cgroups(monkeypatch):
    """Sandboxes made from here on measure memory as on a machine without cgroups."""
    from autograde import cgroups

    monkeypatch.setattr(cgroups, "create", lambda: (None, "cgroups left out by the test"))


@pytest.mark.parametrize("cgroups", [pytest.param(True, marks=needs_cgroups), False], ids=["cgroup", "proc"])
@pytest.mark.parametrize("where", KEPT_SHARED_CALLS)
def test_memory_shared_with_files_or_mappings_is_counted(where, cgroups, monkeypatch):
    """An n x n matrix written, during the call, into memory an earlier cell
    charged and shares (a shared mapping, a mapped file, a file or a memory file
    descriptor kept open): no new charge and no copied page, but it is the
    student's files and shared memory, which every measured call is charged with."""
    import numpy as np

    from autograde.memory import traced_peak

    if not cgroups:
        _without_cgroups(monkeypatch)
    n = 2048
    with Sandbox(Limits(call_timeout_s=120, file_bytes=64 * 2**20)) as sb:
        output(sb, KEPT_SHARED)
        _, peak = traced_peak(student_function(sb, where), np.random.default_rng(0).normal(size=(n, 4)))
    assert peak > n * n * 8 * 0.9
    assert sb.forfeited == {}
    assert "memory measurements disagree" in [s["what"] for s in sb.sightings]


@pytest.mark.parametrize("cgroups", [pytest.param(True, marks=needs_cgroups), False], ids=["cgroup", "proc"])
def test_files_written_during_a_call_cost_only_their_memory(cgroups, monkeypatch):
    """/tmp is memory: a call that writes an n x n matrix to a file is charged
    with it, and keeps its other tests; honest notes written during a call cost
    their few bytes, and nothing is reported."""
    import numpy as np

    from autograde.memory import SLACK_BYTES, traced_peak

    if not cgroups:
        _without_cgroups(monkeypatch)
    with Sandbox(Limits(call_timeout_s=120)) as sb:
        output(sb, HIDDEN_SCORES.replace("tracemalloc.get_traced_memory = lambda: (0, 0)", ""))
        _, honest = traced_peak(student_function(sb, "in_tiles_with_notes"), np.ones((256, 4)))
        reported = list(sb.sightings)
        _, in_a_file = traced_peak(student_function(sb, "in_a_tmp_file"), np.random.default_rng(0).normal(size=(2048, 4)))
    assert honest < 64 * 256 * 8 + SLACK_BYTES
    assert reported == []
    assert in_a_file > 2048 * 2048 * 8 * 0.9
    assert sb.forfeited == {}
    assert "memory measurements disagree" in [s["what"] for s in sb.sightings]


@needs_cgroups
def test_honest_memory_is_measured_close_to_what_it_allocates():
    """Tiles of 64 rows, whatever the process did before: the kernel's count
    stays within its slack of the in-process one, the arguments' transfer is
    not counted, and nothing is reported."""
    import numpy as np

    from autograde.memory import SLACK_BYTES, traced_peak

    n = 4096
    q = np.random.default_rng(0).normal(size=(n, 4))
    with Sandbox(Limits(call_timeout_s=120)) as sb:
        output(sb, HIDDEN_SCORES.replace("tracemalloc.get_traced_memory = lambda: (0, 0)", "")
               + "\nJUNK = [list(range(100)) for _ in range(20000)]\n")
        peaks = [traced_peak(student_function(sb, "in_tiles"), q)[1] for _ in range(3)]
        _, echo = traced_peak(student_function(sb, "in_tiles"), np.ones((2 * n, 512)))  # 32 MiB in
    assert max(peaks) < 64 * n * 8 + SLACK_BYTES, peaks
    assert echo < 8 * 2**20
    assert sb.sightings == []


# ------------------------------------------------------------------ the grader's own time and memory

def test_a_grader_function_called_back_is_bounded_in_time_and_memory():
    """A student's code that makes a grader function compute far too much gets
    an error back within the bounds, and the student is reported."""
    import time

    import numpy as np

    from autograde.sandbox import CALLBACK_SECONDS

    def scores(q):
        return q @ np.swapaxes(q, -1, -2)  # 8 x 3000 x 3000 floats for a 192 KB input

    def slow(x):
        while True:
            x = x + 1

    with Sandbox(Limits(call_timeout_s=60)) as sb:
        output(sb, "import numpy as np\ndef probe(f, x):\n    try:\n        f(x)\n    except Exception as exc:\n"
                   "        return str(exc)\n    return 'computed'")
        started = time.monotonic()
        big = student_function(sb, "probe")(scores, np.ones((8, 3000, 1)))
        endless = student_function(sb, "probe")(slow, 0)
        elapsed = time.monotonic() - started
    assert "MiB" in big and "ran past" in endless
    assert elapsed < CALLBACK_SECONDS + 20
    assert [s["what"] for s in sb.sightings].count("makes a grader function exceed its bounds") == 2


# ------------------------------------------------------------------ PyTorch's attention layers

def test_pytorch_attention_layers_are_reported_from_any_thread():
    import torch

    from autograde.sandbox import reported_during
    from student_runtime.layers import REPORT

    source = """
import threading
import torch

def via_thread(x):
    attn = torch.nn.MultiheadAttention(4, 2, batch_first=True)
    box = []
    worker = threading.Thread(target=lambda: box.append(attn(x, x, x, need_weights=False)[0]))
    worker.start(); worker.join()
    return box[0]

def by_hand(x):
    w = torch.softmax(x @ x.transpose(1, 2) / 2.0, dim=-1)
    return w @ x
"""
    x = torch.randn(1, 3, 4)
    with Sandbox(Limits(call_timeout_s=60)) as sb:
        output(sb, source)
        _, threaded = reported_during(student_function(sb, "via_thread"), x, what_reported=REPORT)
        _, manual = reported_during(student_function(sb, "by_hand"), x, what_reported=REPORT)
    assert "MultiheadAttention.forward" in threaded and "multi_head_attention_forward" in threaded
    assert manual == []
