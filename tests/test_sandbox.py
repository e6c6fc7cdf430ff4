"""The sandbox that runs student code, and the plain-data wire it answers on."""
import io
import json
import os
import pickle
import struct
import time

import numpy as np
import pytest
import torch

from student_runtime import wire
from autograde.compare import GradingFailure, expect_unchanged
from autograde.sandbox import Limits, Sandbox, SandboxLost, changed_in_place, student_function

AS_ROOT = os.geteuid() == 0


def roundtrip(value):
    blobs = []
    encoded = wire.encode(value, blobs, lambda v: pytest.fail(f"{v!r} should be plain data"))
    return wire.decode(json.loads(json.dumps(encoded, allow_nan=False)), blobs,
                       lambda m: pytest.fail(f"unexpected marker {m}"))


# ------------------------------------------------------------------ the wire

@pytest.mark.parametrize("value", [
    None, True, 0, -7, 10**30, 1.5, "text", (1, 2.0, "x"), [1, [2, (3,)]], {"a": 1, "b": (2, 3)},
    slice(1, None, 2), {(0, 1), (1, 0)}, frozenset({"a", 2}), set(),
])
def test_python_values_cross_unchanged(value):
    found = roundtrip(value)
    assert found == value and type(found) is type(value)


def test_a_set_of_unhashable_items_is_refused():
    forged = {"$": "set", "v": [{"$": "list", "v": [1]}]}
    with pytest.raises(wire.WireError, match="unhashable"):
        wire.decode(forged, [], lambda m: pytest.fail(f"unexpected marker {m}"))


@pytest.mark.parametrize("value", [float("inf"), float("-inf")])
def test_infinities_cross(value):
    assert roundtrip(value) == value


def test_nan_crosses():
    assert np.isnan(roundtrip(float("nan")))


@pytest.mark.parametrize("array", [
    np.arange(12.0).reshape(3, 4), np.arange(12.0).reshape(3, 4).T, np.array([True, False]),
    np.arange(6, dtype=np.int16), np.array([1 + 2j]), np.zeros((0, 3)), np.array(2.5, dtype=np.float32),
    np.array([np.inf, -np.inf, np.nan]),
])
def test_arrays_keep_dtype_shape_and_values(array):
    found = roundtrip(array)
    assert isinstance(found, np.ndarray) and found.dtype == array.dtype and found.shape == array.shape
    assert np.array_equal(found, array, equal_nan=True)


@pytest.mark.parametrize("scalar", [np.float32(1.25), np.float64(3.0), np.int64(-4), np.bool_(True)])
def test_numpy_scalars_keep_their_type(scalar):
    found = roundtrip(scalar)
    assert type(found) is type(scalar) and found == scalar


def test_tensor_views_keep_strides_and_offset():
    base = torch.randn(2, 5, 3, 4)
    view = base.transpose(1, 2)[:, 1:]
    found = roundtrip(view)
    assert found.stride() == view.stride() and found.storage_offset() == view.storage_offset()
    assert torch.equal(found, view) and not found.is_contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool])
def test_tensor_dtypes_cross(dtype):
    t = (torch.randn(3, 2) * 4).to(dtype)
    found = roundtrip(t)
    assert found.dtype == dtype and torch.equal(found, t)


def test_shapes_and_dtypes_of_torch_cross():
    assert roundtrip(torch.Size([2, 3])) == torch.Size([2, 3])
    assert roundtrip(torch.float16) is torch.float16


def test_a_generator_continues_where_it_was():
    rng = np.random.default_rng(5)
    rng.normal(size=3)
    copy = roundtrip(rng)
    assert np.array_equal(copy.normal(size=4), rng.normal(size=4))


def test_objects_are_not_data():
    class Custom:
        pass
    seen = []
    wire.encode([Custom(), np.array([object()])], [], lambda v: seen.append(type(v).__name__) or {"$": "x"})
    assert seen == ["Custom", "ndarray"]
    def refuse(value):
        raise wire.WireError(type(value).__name__)
    with pytest.raises(wire.WireError, match="ndarray"):
        wire.encode(np.array([None, 1], dtype=object), [], refuse)


def test_a_pickle_disguised_as_an_array_is_refused():
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(wire.WireError, match="not a plain .npy"):
        wire.decode({"$": "nd", "i": 0}, [buf.getvalue()], None)
    with pytest.raises(wire.WireError):
        wire.decode({"$": "nd", "i": 0}, [pickle.dumps([1, 2])], None)


def test_tensor_strides_that_reach_outside_the_data_are_refused():
    blobs = []
    encoded = wire.encode(torch.arange(4.0), blobs, None)
    encoded["stride"] = [100]
    with pytest.raises(wire.WireError, match="outside"):
        wire.decode(encoded, blobs, None)


def frame_reader(data, max_bytes=wire.MAX_FRAME_BYTES):
    return wire.Channel(io.BytesIO(data), None, max_bytes=max_bytes)


def test_frames_round_trip():
    out = io.BytesIO()
    wire.Channel(None, out).send({"kind": "x", "n": 1}, [b"abc", b""])
    assert frame_reader(out.getvalue()).receive() == ({"kind": "x", "n": 1}, [b"abc", b""])


@pytest.mark.parametrize("data, message", [
    (struct.pack(">QQ", 5, 0) + b"{oops", "malformed JSON"),
    (struct.pack(">QQ", 2, 0) + b"[]", "not an object"),
    (struct.pack(">QQ", 2, 1) + b"{}" + struct.pack(">Q", 10**9), "over"),
    (struct.pack(">QQ", 10**12, 0), "too large"),
])
def test_malformed_frames_are_refused(data, message):
    with pytest.raises(wire.WireError, match=message):
        frame_reader(data, max_bytes=2**20).receive()


def test_a_truncated_frame_is_the_end_of_the_channel():
    with pytest.raises(EOFError):
        frame_reader(struct.pack(">QQ", 50, 0) + b"{}").receive()


# ------------------------------------------------------------------ the student's process

@pytest.fixture()
def sandbox():
    with Sandbox(Limits(call_timeout_s=20, file_bytes=2**20)) as sb:
        yield sb


def ran(sb, source):
    reply = sb.run_cell(source)
    assert not reply.get("error"), reply["error"]["traceback"]
    return reply["stdout"]


def test_it_starts_in_an_empty_private_folder_that_is_removed(sandbox):
    home = sandbox.home
    listing = ran(sandbox, "import os\nprint(os.getcwd(), sorted(os.listdir('.')), oct(os.stat('.').st_mode & 0o777))")
    assert listing.split() == [home, "[]", "0o700"]
    sandbox.close()
    assert not os.path.exists(home)


def test_its_environment_has_no_grading_marker(sandbox):
    names = json.loads(ran(sandbox, "import os, json\nprint(json.dumps(sorted(os.environ)))"))
    assert not [n for n in names if "NBGRADER" in n or n.startswith("PYTEST") or n == "PYTHONPATH"]
    assert ran(sandbox, "import os\nprint(os.environ['HOME'] == os.getcwd())").strip() == "True"


def test_its_limits_are_set(sandbox):
    limits = json.loads(ran(sandbox, "import resource, json\nprint(json.dumps([resource.getrlimit(getattr(resource, n))[0] "
                                      "for n in ('RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_FSIZE', 'RLIMIT_NPROC')]))"))
    assert limits[0] == Limits().memory_bytes and limits[1] == Limits().cpu_s and limits[2] == 2**20
    assert 0 < limits[3] < 10_000


def test_a_file_over_the_size_limit_is_an_error_not_a_crash(sandbox):
    reply = sandbox.run_cell("open('big', 'wb').write(b'x' * 2**21)")
    assert reply["error"]["type"] in ("OSError", "IOError")
    assert ran(sandbox, "print('still here')").strip() == "still here"


@pytest.mark.skipif(not AS_ROOT, reason="user ids of their own need root")
def test_as_root_it_runs_as_another_user_who_cannot_read_private_folders(sandbox, tmp_path):
    private = tmp_path / "grading"
    private.mkdir(mode=0o700)
    (private / "gradebook.db").write_text("secret")
    uid = int(ran(sandbox, "import os\nprint(os.getuid())"))
    assert uid != 0
    reply = sandbox.run_cell(f"open({str(private / 'gradebook.db')!r}).read()")
    assert reply["error"]["type"] in ("PermissionError", "FileNotFoundError")


def test_student_exceptions_keep_their_family(sandbox):
    ran(sandbox, "class Bad(ValueError):\n    pass\n"
                 "def f(x):\n    raise Bad('no')\ndef g():\n    raise NotImplementedError()")
    with pytest.raises(ValueError, match="no") as info:
        student_function(sandbox, "f")(1)
    assert type(info.value).__name__ == "Bad" and "raise Bad" in info.value.student_traceback
    with pytest.raises(NotImplementedError):
        student_function(sandbox, "g")()


def test_in_place_changes_to_arguments_are_seen_but_never_reach_the_graders_copies(sandbox):
    ran(sandbox, "def scale(a, t, b):\n    a *= 2\n    t.mul_(3)\n    return None")
    a, t, b = np.ones(3), torch.ones(2, 2).t(), np.ones(2)
    student_function(sandbox, "scale")(a, t, b)
    assert np.array_equal(a, [1, 1, 1]) and torch.equal(t, torch.ones(2, 2))
    assert changed_in_place(a) and changed_in_place(t) and not changed_in_place(b)
    with pytest.raises(GradingFailure, match="modified its input"):
        expect_unchanged(np.ones(3), a, what="scale")


def test_functions_passed_to_student_code_run_here(sandbox):
    ran(sandbox, "def apply(f, x):\n    return f(x) + 1")
    seen = []
    result = student_function(sandbox, "apply")(lambda x: seen.append(x.shape) or x.sum(), np.ones((2, 3)))
    assert result == 7.0 and seen == [(2, 3)]


def test_objects_stay_in_the_student_process_behind_handles(sandbox):
    ran(sandbox, "class Box:\n    def __init__(self):\n        self.v = np.arange(3.0)\n"
                 "    def total(self):\n        return self.v.sum()\nimport numpy as np")
    box = student_function(sandbox, "Box")()
    assert type(box).__name__ == "Box" and "student's process" in repr(box)
    assert box.total() == 3.0
    assert isinstance(box.v.sum(), np.floating)


def test_a_call_that_never_returns_is_stopped(sandbox):
    sandbox.limits.call_timeout_s = 2
    ran(sandbox, "def spin():\n    while True:\n        pass")
    started = time.monotonic()
    with pytest.raises(SandboxLost, match="stopped answering"):
        student_function(sandbox, "spin")()
    assert time.monotonic() - started < 10


def test_an_exiting_process_is_described_and_replaced(sandbox):
    ran(sandbox, "def leave():\n    import os\n    os._exit(7)")
    stale = student_function(sandbox, "leave")
    with pytest.raises(SandboxLost, match="exited with status 7"):
        stale()
    sandbox.restart()
    with pytest.raises(SandboxLost, match="restarted"):
        stale()
    assert ran(sandbox, "print(1 + 1)").strip() == "2"


def test_a_fork_bomb_is_stopped_quickly(sandbox):
    started = time.monotonic()
    with pytest.raises(SandboxLost, match="fork bomb"):
        sandbox.run_cell("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    assert time.monotonic() - started < 10
    sandbox.restart()
    assert sandbox._processes() == 1


def test_asking_for_too_much_memory_is_a_memory_error():
    with Sandbox(Limits(memory_bytes=1536 * 2**20)) as sandbox:
        reply = sandbox.run_cell("import numpy as np\nnp.ones(2**40)")
        assert reply["error"]["type"] in ("MemoryError", "_ArrayMemoryError")
        reply = sandbox.run_cell("hoard = []\nwhile True:\n    hoard.append(bytearray(2**26))")
        assert reply["error"]["type"] == "MemoryError"
        assert ran(sandbox, "del hoard\nprint('recovered')").strip() == "recovered"


FORGE = """
import os, socket, struct
def forge(header):
    for fd in map(int, os.listdir('/proc/self/fd')):
        try:
            s = socket.socket(fileno=os.dup(fd))
            s.sendall(struct.pack('>QQ', len(header), 0) + header)
        except OSError:
            pass
"""


@pytest.mark.parametrize("header", [
    b"[" * 100_000 + b"]" * 100_000,                                   # nested past any recursion limit
    b'{"kind": "ran", "stdout": 5, "stderr": ""}',                      # text that is not text
    b'{"kind": "ran", "stdout": "", "stderr": "", "error": "boom"}',    # an error that is not an error
    b'{"kind": "value", "value": 1, "mirror": {"999": 1}}',             # an argument that does not exist
])
def test_forged_frames_lose_that_student_only(sandbox, header):
    ran(sandbox, FORGE + f"def call_me(x):\n    forge({header!r})\n    import time\n    time.sleep(5)\n")
    with pytest.raises(SandboxLost, match="malformed"):
        if b"mirror" in header:  # a forged answer to a call
            student_function(sandbox, "call_me")(np.ones(2))
        else:                    # a forged answer to a cell
            sandbox.run_cell("call_me(1)")
    sandbox.restart()
    assert ran(sandbox, "print('next student')").strip() == "next student"


def test_a_callback_cannot_be_handed_more_than_its_limit(sandbox):
    ran(sandbox, "import numpy as np\ndef ask(f):\n    try:\n        f(np.zeros(2**24))\n"
                 "    except RuntimeError as exc:\n        return str(exc)\n    return 'accepted'")
    seen = []
    answer = student_function(sandbox, "ask")(lambda x: seen.append(x.shape) or 0.0)
    assert "MiB" in answer and seen == []


def test_a_grader_callback_that_runs_out_of_room_fails_only_that_call():
    """A small input can make a grader-side function build something huge (an
    n x n array from an n given by the student). With the worker's memory
    bounded, and each callback's too, that call fails and the worker goes on."""
    import subprocess
    import sys

    script = """
import numpy as np
from autograde.sandbox import Limits, Sandbox, student_function
from autograde.worker import bound_memory

bound_memory(512 * 2**20)
with Sandbox(Limits(call_timeout_s=60)) as sb:
    sb.run_cell("def ask(f):\\n    try:\\n        f(12_000)\\n    except RuntimeError as exc:\\n        return str(exc)\\n"
                "    return 'built'")
    print(student_function(sb, "ask")(lambda n: float(np.ones((n, n)).sum())))
    print(float(np.ones((1000, 1000)).sum()))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    answer, after = proc.stdout.strip().splitlines()[-2:]
    assert "CallbackBound" in answer and "MiB" in answer
    assert after == "1000000.0"


SUMS = """
import numpy as np, torch
rng = np.random.default_rng(0)
a, b = rng.normal(size=(64, 300)).astype(np.float32), rng.normal(size=(300, 70)).astype(np.float32)
ta, tb = torch.from_numpy(a), torch.from_numpy(b)
print(float((a @ b).sum()).hex(), float((ta @ tb).sum()).hex(), float(torch.softmax(ta[0], 0).sum()).hex())
"""


@pytest.mark.parametrize("setting", ["avx2", "baseline"])
def test_student_code_computes_as_the_machines_own_python_does(setting):
    """The settings by which OpenBLAS, MKL, oneDNN and PyTorch pick their kernels
    (another machine's, here) reach the student's process: the same sums, to the
    last bit, inside the sandbox as in the grader's own Python on one thread (the
    sandbox's thread count; another splits the sums otherwise)."""
    import subprocess
    import sys

    from autograde.sandbox import THREADS
    from tests.conftest import outer_environ
    from tests.machine_settings import SETTINGS

    script = f"""
from autograde.sandbox import Limits, Sandbox
with Sandbox(Limits(call_timeout_s=60)) as sb:
    reply = sb.run_cell({SUMS!r})
    assert not reply.get("error"), reply["error"]
    print("inside", reply["stdout"].strip())
exec({SUMS!r}.replace("print(", "print('outside', "))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=outer_environ(**SETTINGS[setting], **THREADS))
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines() if line.startswith(("in", "out")))
    assert lines["inside"] == lines["outside"], lines
