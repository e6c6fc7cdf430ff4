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

from autograde.sandbox import Limits, Sandbox, namespaces_available
from tests.conftest import REPO

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
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV",)}
    env["PATH"] = "/usr/bin:/bin"
    proc = subprocess.run([sys.executable, "-m", "autograde", "grade", "ch1_principles", str(submitted),
                           "--out", str(tmp_path / "out")], env=env, capture_output=True, text=True,
                          cwd=REPO, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert _grades(tmp_path / "out")["alice"]["status"] == "graded"


def test_an_mmap_backed_score_matrix_is_refused_or_seen():
    """Scores in a file mapped into memory: the file-size limit refuses one of
    n x n at the checks' sizes, and what is mapped and touched is resident,
    which the outside measurement sees."""
    import numpy as np

    from autograde.memory import traced_peak
    from autograde.sandbox import student_function

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
    assert "memory measurements disagree" in [s["what"] for s in sb.sightings]
