"""Running a student's code in a separate, limited, isolated process.

Each grading worker keeps one template process with the libraries loaded
(student_runtime.server.zygote) and forks a student process from it per
notebook, so that PyTorch is not imported again for every student. The
template runs inside bubblewrap (`bwrap`): its own mount, PID, network, IPC
and UTS namespaces, a read-only view of the system and of the Python
installation, the student-side packages (student_runtime, coursekit,
bookutils) copied into a private folder, and a small private /tmp. The course
repository, the output folder, the gradebook, other students and the grader's
processes are not in that view, and the instructor-only package `autograde`
cannot be imported there.

Each student process gets a fresh private folder in that /tmp, a minimal
environment (no grading marker), limits on CPU time, address space, processes
and file size, and, when the grader runs as root, a user id of its own, held
for the life of the worker with a lock so that two grading commands on one
machine never share one. Without root the template runs in an unprivileged
user namespace and is started afresh for every student.

A second kind of template never imports PyTorch, and its sandbox hides
PyTorch's files (`torchless`): the exercises graded as NumPy code are graded
in student processes forked from it (autograde.execute), where no thread,
dispatch mode or trick can reach PyTorch. /tmp in the sandbox is the
student's to write, as in Jupyter, and is emptied between students.

Each student process is put in a memory cgroup of its own before any of its
code runs (autograde.cgroups): `measured_call` reads the kernel's count of
the memory a call used, threads, children and mappings included, and the
memory its files and shared mappings held as the call began (which it may
write again without a new charge). `files_bytes` reads, from outside, what the
files in its private /tmp and /dev/shm take.

Requests and answers are plain data (student_runtime.wire). The tests run here, in
the grader: a student function appears as a `Remote` proxy whose calls are
answered by the student process. What the student's process hands back to a
grader function (a callback) runs here under a time and a memory bound.
"""
import atexit
import contextlib
import fcntl
import importlib.util
import json
import os
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from autograde import cgroups
from student_runtime import wire
from student_runtime.layers import REPORT as LAYER_REPORT
from student_runtime.processes import count_processes
from student_runtime.server import FLOOD as AUDIT_FLOOD
from student_runtime.torchless import BLOCKED as TORCH_PACKAGES, USE as TORCH_USE

STARTUP_TIMEOUT_S = 120
WATCH_INTERVAL_S = 0.25
MAX_PROCESSES = 8  # a notebook has no reason to start more; more is a fork bomb, stopped at once
# Packages whose functions the grader may ask the student process to run by
# name: they hold no answer and are importable there.
STUDENT_SIDE = ("student_runtime", "coursekit")
BASE_UID = 610000  # student user ids are taken from BASE_UID up, one per worker (when root)
UID_RANGE = 4096
LOCK_DIR = "/run/lock" if os.path.isdir("/run/lock") else tempfile.gettempdir()
STUDENT_PACKAGES = ("student_runtime", "coursekit", "bookutils")  # importable in the sandbox, nothing else of the course
TMP_BYTES = 512 * 2**20  # the disk (memory-backed) all of a worker's student files may fill
VENV_VIEW = "/opt/course-python"  # where the sandbox sees the grader's virtual environment
MAX_CALLBACK_BYTES = 16 * 2**20  # what a student may hand to a grader-side function in one call
CALLBACK_SECONDS = 10  # the most one call of a grader-side function may take (within the call's own limit)
CALLBACK_MEMORY_BYTES = 512 * 2**20  # and the most it may add to the grader's heap
GRADER_FRAME_BYTES = 256 * 2**20  # the most one answer of a student's process may bring into the grader


# Reports of the audit hook that mean something only for the call or test cell
# during which they are made (drain's callers judge them): a PyTorch layer run
# (DecoderLayer's rule), PyTorch reached for where it does not exist (a flag
# when a graded call did it).
CALL_SCOPED = {LAYER_REPORT, TORCH_USE}
# The student's memory-backed filesystems, private to its sandbox (bwrap's --tmpfs).
PRIVATE_FILESYSTEMS = ("/tmp", "/dev/shm")


class SandboxLost(Exception):
    """The student's process died or stopped answering; the reason is the message."""


class EnvironmentFailure(Exception):
    """The grading environment itself is broken (not the student's fault)."""


@dataclass
class Limits:
    cpu_s: int = 1800
    memory_bytes: int = 4 * 2**30
    processes: int = 64  # the hard limit; the watchdog stops a notebook at MAX_PROCESSES already
    file_bytes: int = 64 * 2**20
    call_timeout_s: float = 120
    isolate: bool = True  # namespaces (bwrap); False: process limits only, by the instructor's explicit choice


def _process_limit(limits, uid):
    """RLIMIT_NPROC counts every process of the user, so as the grader's own
    user leave room for the processes it already has."""
    if uid is not None:
        return limits.processes
    return limits.processes + count_processes(uid=os.getuid(), zombies=True)  # zombies count for the kernel too


def _ns_pids(pid):
    """The pid in every PID namespace it belongs to, outermost first (NSpid)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except OSError:
        pass
    return []


def _children(pid):
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                found += [int(x) for x in fh.read().split()]
    except OSError:
        pass
    return found


def _writable_ranges(pid):
    ranges = []
    with open(f"/proc/{pid}/maps") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) > 1 and "w" in fields[1]:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def _frames(pagemap, start, end):
    import numpy as np

    pagemap.seek(start // 4096 * 8)
    entries = np.frombuffer(pagemap.read((end - start) // 4096 * 8), dtype=np.uint64)
    present = (entries >> np.uint64(63)) & np.uint64(1)
    return np.where(present == 1, entries & np.uint64((1 << 55) - 1), np.uint64(0))


REWRITE_RUN_PAGES = 16  # 64 KiB: runs this long are a buffer written, shorter ones the interpreter's objects


def page_frames(pid):
    """{(start, end): page frame numbers} of the writable mappings of `pid`
    (0 where a page is not in memory). Needs root; {} otherwise."""
    frames = {}
    try:
        with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
            for start, end in _writable_ranges(pid):
                frames[(start, end)] = _frames(pagemap, start, end)
    except (OSError, ValueError):
        return {}
    if not any(f.any() for f in frames.values()):
        return {}  # frame numbers hidden from this user
    return frames


def rewritten_bytes(before, after, run=1):
    """Bytes of pages present in both snapshots whose page frame changed, in
    runs of at least `run` adjacent pages: with a process holding the memory
    as it was (copy-on-write), the pages written in between."""
    import numpy as np

    total = 0
    for span, old in before.items():
        new = after.get(span)
        if new is None or len(new) != len(old):
            continue
        changed = (old != 0) & (new != 0) & (old != new)
        if run > 1 and changed.any():
            edges = np.diff(np.concatenate([[0], changed.astype(np.int8), [0]]))
            starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
            lengths = ends - starts
            total += int(lengths[lengths >= run].sum()) * 4096
        else:
            total += int(changed.sum()) * 4096
    return total


def _used_bytes(path):
    """Bytes in use on the filesystem at `path` (statvfs: the kernel's own count)."""
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


class Measured(NamedTuple):
    """A measured call, as the kernel counted it (Sandbox.measured_call)."""
    new: int        # the peak growth of the charge over the call, less the pages it rewrote
    rewritten: int  # bytes of memory from before the call that it wrote, in runs (a buffer)
    shared: int     # bytes of files and shared memory the student's processes held as it began


def host_pid(root, inner):
    """The pid, as this process sees it, of the descendant of `root` whose pid
    inside its own namespace is `inner`: the sandbox reports inner pids."""
    queue = [root]
    while queue:
        pid = queue.pop(0)
        if pid != root and (_ns_pids(pid) or [None])[-1] == inner:
            return pid
        queue += _children(pid)
    return None


def namespaces_available():
    """None when bwrap can make the sandbox's namespaces here, else why not."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    probe = _bwrap_prefix(tempfile.gettempdir()) + ["--", "/bin/true"]
    try:
        proc = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not run: {exc}"
    if proc.returncode != 0:
        return f"bwrap cannot create namespaces here: {proc.stderr.strip() or proc.returncode}"
    return None


def _sandbox_path(path):
    """Where the sandbox sees a file of this machine's Python installation."""
    if sys.prefix != sys.base_prefix and (path + os.sep).startswith(sys.prefix + os.sep):
        return VENV_VIEW + path[len(sys.prefix):]
    return path


def _torch_folders():
    """The installed folders of PyTorch and of what needs it, as the sandbox sees them."""
    folders = []
    for name in TORCH_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for folder in (spec.submodule_search_locations or []) if spec else []:
            folders.append(_sandbox_path(os.path.realpath(folder)))
    return folders


def _bwrap_prefix(lib, torchless=False):
    """bwrap's arguments: new namespaces and a read-only view of the system and
    of Python, the student-side packages from `lib`, a private /tmp; with
    `torchless`, PyTorch's folders (and those of what needs it) are empty."""
    args = ["bwrap", "--die-with-parent", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try"]
    if os.geteuid() != 0:
        args.append("--unshare-user")  # unprivileged: the namespaces need a user namespace of their own
    args += ["--ro-bind", "/usr", "/usr"]
    for path in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc"):
        args += ["--ro-bind-try", path, path]
    binds = [(path, path) for path in sorted({sys.base_prefix,
                                              os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))})
             if not path.startswith("/usr/")]
    if sys.prefix != sys.base_prefix:  # a virtual environment: seen at a neutral place, not where the course is
        binds.append((sys.prefix, VENV_VIEW))
    binds.append((lib, "/course/lib"))
    for source, target in binds:
        # Folders bwrap makes on the way are private to root unless told otherwise.
        parents = [str(parent) for parent in reversed(Path(target).parents) if str(parent) != "/"]
        for parent in parents:
            args += ["--perms", "0755", "--dir", parent]
        args += ["--ro-bind", source, target]
    if torchless:
        for folder in _torch_folders():
            args += ["--tmpfs", folder, "--remount-ro", folder]
    args += ["--proc", "/proc", "--dev", "/dev"]
    for device in sorted(os.listdir("/dev")):  # a GPU, where there is one
        if device.startswith("nvidia"):
            args += ["--dev-bind", f"/dev/{device}", f"/dev/{device}"]
    args += ["--size", str(TMP_BYTES), "--tmpfs", "/tmp", "--tmpfs", "/dev/shm", "--dir", "/tmp/template",
             "--chdir", "/tmp/template"]
    return args


def _options_pipe(options):
    """A pipe's read end holding bwrap's options, NUL-separated."""
    read, write = os.pipe()
    data = b"".join(arg.encode() + b"\0" for arg in options)
    if len(data) > 60_000:  # a pipe buffer holds 64 KiB; bwrap reads it before starting anything
        raise EnvironmentFailure("the sandbox's options do not fit a pipe")
    os.write(write, data)
    os.close(write)
    return read


def _stage_student_packages(folder):
    """Copy the student-side packages where the sandbox reads them: a copy, so
    that nothing else of the course is reachable from there."""
    lib = os.path.join(folder, "lib")
    for name in STUDENT_PACKAGES:
        source = os.path.dirname(__import__(name).__file__)
        shutil.copytree(source, os.path.join(lib, name), ignore=shutil.ignore_patterns("__pycache__"))
    for root, dirs, files in os.walk(folder):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    return lib


def _server_command(lib, fd, python=sys.executable, torchless=False):
    """Python running student_runtime.server from `lib`, with no PYTHONPATH
    in the environment for student code to read."""
    start = f"import sys; sys.path.insert(0, {lib!r}); from student_runtime.server import main; main()"
    return [python, "-c", start, str(fd)] + (["torchless"] if torchless else [])


def _sandbox_python():
    """The interpreter as the sandbox sees it."""
    if sys.prefix == sys.base_prefix:
        return sys.executable
    return os.path.join(VENV_VIEW, os.path.relpath(sys.executable, sys.prefix))


# Student code runs in namespaces unless the instructor explicitly chose
# process limits only (`--no-namespaces`), which the report then says.
ISOLATE = True


class _Zygote:
    """One per grading worker and kind: a process with the course's libraries
    loaded (inside the sandbox) that forks each student process on request."""

    def __init__(self, torchless=False):
        self.home = tempfile.mkdtemp(prefix="grader-template-")
        ours, theirs = socket.socketpair()
        log = open(os.path.join(self.home, "log"), "wb")
        fds = [theirs.fileno()]
        if ISOLATE:
            lib = _stage_student_packages(self.home)
            env = _environment("/tmp/template")
            options = _bwrap_prefix(lib, torchless)[1:] + ["--clearenv"] + \
                [arg for name, value in env.items() for arg in ("--setenv", name, value)]
            # Through a pipe (--args), so that the sandbox's own command line,
            # readable inside it, names no path of the grader's machine.
            fds.append(_options_pipe(options))
            command = ["bwrap", "--args", str(fds[-1]), "--"] + \
                _server_command("/course/lib", theirs.fileno(), _sandbox_python(), torchless)
        else:
            env = _environment(self.home)
            command = _server_command(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), theirs.fileno(),
                                      torchless=torchless)
        try:
            self.proc = subprocess.Popen(
                command, pass_fds=fds, cwd=self.home, env=env,
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        except OSError as exc:
            raise EnvironmentFailure(f"could not start Python for student code: {exc}") from None
        finally:
            log.close()
            theirs.close()
            for fd in fds[1:]:
                os.close(fd)
        self.control = ours
        self.buffer = b""
        self.asked = 0   # the number of the last request; the template echoes it in its reply
        message, _ = self._receive(STARTUP_TIMEOUT_S)
        if "ready" not in message:
            raise EnvironmentFailure(f"the process for student code did not start:\n{self.log_tail()}")
        self.pid = host_pid(self.proc.pid, int(message["ready"])) if ISOLATE else self.proc.pid

    def host_pid(self, inner):
        return host_pid(self.pid, inner) if ISOLATE else inner

    def log_tail(self):
        try:
            with open(os.path.join(self.home, "log"), "rb") as fh:
                return fh.read()[-3000:].decode(errors="replace")
        except OSError:
            return ""

    def _receive(self, timeout):
        deadline = time.monotonic() + timeout
        fds = []
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.control], [], [], left)[0]:
                raise EnvironmentFailure(f"the process for student code did not answer:\n{self.log_tail()}")
            data, new_fds, _, _ = socket.recv_fds(self.control, 65536, 4)
            if not data:
                raise EnvironmentFailure(f"the process for student code stopped:\n{self.log_tail()}")
            self.buffer += data
            fds += new_fds
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line), fds

    def _send(self, message):
        self.control.sendall(json.dumps(message).encode() + b"\n")

    def _ask(self, message, timeout):
        """The template's reply to this request. A reply to an earlier request that timed out
        (a student can keep the template busy for a while) arrives late: it is dropped, so
        that no later request is answered with it."""
        self.asked += 1
        self._send({**message, "id": self.asked})
        deadline = time.monotonic() + timeout
        while True:
            reply, fds = self._receive(max(0.0, deadline - time.monotonic()))
            if reply.get("id") == self.asked:
                return reply, fds
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def spawn(self, spec):
        """(pid, socket fd) of a new student process."""
        message, fds = self._ask({"op": "spawn", **spec}, 60)
        if "error" in message:
            raise EnvironmentFailure(str(message["error"]))
        if not fds:
            raise EnvironmentFailure("the process for student code could not start a student process")
        return int(message["pid"]), fds[0]

    def sweep(self, pid, uid, home):
        """Have the template end the student's processes and remove its folder."""
        try:
            self._ask({"op": "sweep", "pid": pid, "uid": -1 if uid is None else uid, "home": home,
                       "isolated": ISOLATE}, 60)
        except (OSError, EnvironmentFailure):
            pass

    def sightings(self, pid, since=0):
        """(what the audit hook of a student process reported after sequence
        number `since`, a list of dicts; the latest sequence number)."""
        try:
            message, _ = self._ask({"op": "audit", "pid": pid, "since": since}, 30)
        except (OSError, EnvironmentFailure):
            return [], since
        events = message.get("events")
        return (events if isinstance(events, list) else []), int(message.get("seq") or since)

    def exit_code(self, pid):
        try:
            message, _ = self._ask({"op": "ended", "pid": pid}, 10)
            return message.get("code")
        except (OSError, EnvironmentFailure):
            return None

    def alive(self):
        return self.proc.poll() is None

    def close(self):
        try:
            self.control.close()
        finally:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # bwrap and the namespace it holds
            self.proc.kill()
            self.proc.wait()
            shutil.rmtree(self.home, ignore_errors=True)


_ZYGOTES = {}  # torchless -> this process's zygote of that kind


def _zygote(torchless=False):
    """This process's zygote of a kind, started on first use (and again if it died)."""
    current = _ZYGOTES.get(torchless)
    if current is None or not current.alive():
        if current is not None:
            current.close()
        _ZYGOTES[torchless] = _Zygote(torchless)
    return _ZYGOTES[torchless]


def _forget_zygote(zygote):
    zygote.close()
    for kind, current in list(_ZYGOTES.items()):
        if current is zygote:
            del _ZYGOTES[kind]


@atexit.register
def _close_zygote():
    """Nothing of a worker is left behind when it ends: its template processes
    and their folders go with it."""
    for zygote in list(_ZYGOTES.values()):
        zygote.close()
    _ZYGOTES.clear()


# Settings by which the machine's numerical libraries choose their kernels (the
# processor's core type and cache sizes for OpenBLAS, the instruction sets of MKL,
# oneDNN and PyTorch's own kernels, NumPy's CPU features): a student's process
# computes as the machine's own Python does, so a grade does not depend on
# whether the code ran inside the sandbox. Thread counts are the grader's (below).
NUMERICAL_SETTINGS = ("OPENBLAS_", "GOTO_", "MKL_", "ONEDNN_", "DNNL_", "NPY_", "ATEN_CPU_CAPABILITY")
THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _environment(home):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "TMPDIR": home,
           "LANG": "C.UTF-8", "MPLBACKEND": "Agg", "MPLCONFIGDIR": home, "PYTHONDONTWRITEBYTECODE": "1"}
    env.update({name: value for name, value in os.environ.items() if name.startswith(NUMERICAL_SETTINGS)})
    env.update(THREADS)
    from coursekit.triton_env import triton_device

    # Decided before the student's process starts, because Triton reads it once
    # when it is imported (the setup cells of the notebooks decide the same way).
    triton_device(quiet=True)
    for name in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _describe_exit(code):
    if code is None:
        return "stopped answering"
    if code < 0:
        sig = -code
        return {signal.SIGKILL: "was killed (out of memory, or over a limit)",
                signal.SIGXCPU: "used up its CPU-time limit",
                signal.SIGSEGV: "crashed (segmentation fault)",
                signal.SIGABRT: "aborted"}.get(sig, f"was stopped by signal {signal.Signals(sig).name}")
    return f"exited with status {code} (the code called exit or os._exit)"


class _TimedPipe:
    """A pipe end with a deadline, so a silent or flooding student process
    cannot hang the grader; while waiting it calls `watch` a few times a second."""

    def __init__(self, fd, watch=None):
        self.fd = fd
        self.deadline = None
        self.watch = watch
        os.set_blocking(fd, False)

    def _wait(self, readable):
        while True:
            left = None if self.deadline is None else self.deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError
            step = WATCH_INTERVAL_S if left is None else min(left, WATCH_INTERVAL_S)
            r, w, _ = select.select([self.fd] if readable else [], [] if readable else [self.fd], [], step)
            if r or w:
                return
            if self.watch:
                self.watch()

    def read(self, n):
        while True:
            try:
                return os.read(self.fd, n)
            except BlockingIOError:
                self._wait(True)

    def write(self, data):
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view):]
            except BlockingIOError:
                self._wait(False)
            except BrokenPipeError:
                raise EOFError("the student process closed its input") from None

    def flush(self):
        pass


_UID_LOCKS = {}  # kind -> (uid, open lock file) held by this worker process for its life


def _student_uid(kind=False):
    """A user id for this worker's students of one kind (the two kinds of
    student process run side by side) that no other worker, and no other
    grading command on this machine, uses at the same time (as root only)."""
    if os.geteuid() != 0:
        return None
    if kind not in _UID_LOCKS:
        taken = {uid for uid, _ in _UID_LOCKS.values()}
        for uid in range(BASE_UID, BASE_UID + UID_RANGE):
            if uid in taken:
                continue
            handle = open(os.path.join(LOCK_DIR, f"attention-course-grader-uid-{uid}.lock"), "a")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()
                continue
            if count_processes(uid=uid, zombies=True) == 0:  # not left running by a killed run
                _UID_LOCKS[kind] = (uid, handle)
                break
            handle.close()
        else:
            raise EnvironmentFailure(f"no free user id for student code in {BASE_UID}..{BASE_UID + UID_RANGE}")
    return _UID_LOCKS[kind][0]


class CallbackBound(Exception):
    """A grader function called back by the student's code reached its time or memory bound."""


def _stop_callback(signum, frame):
    raise CallbackBound("a grader function called by the student's code ran past its time limit")


@contextlib.contextmanager
def _bounded(seconds, data_limit):
    """Run a grader function called back by the student's code for at most
    `seconds`, with this process's heap bounded by `data_limit` bytes: past
    either bound it raises, and the student's call fails."""
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    bound = data_limit if soft == resource.RLIM_INFINITY else min(data_limit, soft)
    if signal.getsignal(signal.SIGALRM) is not _stop_callback:
        signal.signal(signal.SIGALRM, _stop_callback)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (bound, hard))
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def _data_bytes():
    try:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmData:"))
    except (OSError, StopIteration, ValueError):
        return 0


class Sandbox:
    """One student process at a time; `restart()` replaces it after a crash.
    With `torchless`, the process is one in which PyTorch does not exist."""

    def __init__(self, limits=None, torchless=False):
        global ISOLATE
        self.limits = limits or Limits()
        ISOLATE = self.limits.isolate  # one setting per grading run, so per worker process
        self.torchless = torchless
        self.uid = _student_uid(torchless)
        self.pid = None  # the student process (a child of this worker's zygote), as the zygote sees it
        self.host = None  # the same process as this one sees it (for /proc)
        self.zygote = None
        self.home = None
        self.lost = None  # why the current process was lost, if it was
        self.callbacks = {}
        self.sightings = []  # what the audit hooks of this sandbox's student processes reported
        self.audit_seq = 0  # the latest audit sequence number read from the current process
        self.generation = 0  # bumped at each restart; proxies of an old process are stale
        self.meter = None  # the current process's memory cgroup (autograde.cgroups), if one could be made
        self.unmetered = None  # why there is none
        self._files_at_start = None  # bytes in use on its private /tmp and /dev/shm when it started
        self.called = set()  # names of the student functions called since `called` was last emptied
        self.forfeited = {}  # name -> why: student functions whose integrity checks failed
        self.origins = {}  # handle id -> name of the student function whose call produced it
        self.twin = None  # the student's process without PyTorch, beside this one (autograde.execute)
        self.window = None  # audit reports collected while a test cell runs
        self.nested = 0  # grader functions running on behalf of the student's code (callbacks)
        self.callback_data_limit = None  # the heap those may grow this process to, set once per call
        self._origin_of_new = None  # the function whose answer is being decoded

    # ------------------------------------------------------------ lifecycle
    def start(self):
        self._kill_everything()  # nothing left over from an earlier student of this worker
        self.home = "/tmp/student" if ISOLATE else tempfile.mkdtemp(prefix="student-")
        spec = {"home": self.home, "uid": -1 if self.uid is None else self.uid,
                "nproc": _process_limit(self.limits, self.uid), "cpu_s": self.limits.cpu_s,
                "memory_bytes": self.limits.memory_bytes, "file_bytes": self.limits.file_bytes}
        self.zygote = _zygote(self.torchless)
        self.pid, fd = self.zygote.spawn(spec)
        self.host = self.zygote.host_pid(self.pid)
        self.audit_seq = 0
        self._files_at_start = self._private_files_used()
        self._meter()
        self.writer, self.reader = _TimedPipe(os.dup(fd), self._watch), _TimedPipe(fd, self._watch)
        self.channel = wire.Channel(self.reader, self.writer, max_bytes=GRADER_FRAME_BYTES)
        self.lost = None
        try:
            header, _ = self._receive(time.monotonic() + STARTUP_TIMEOUT_S)
        except SandboxLost as exc:
            raise EnvironmentFailure(f"a student process could not be started ({exc}):\n{self.zygote.log_tail()}") \
                from None
        if header.get("kind") != "ready":
            raise EnvironmentFailure(f"a student process sent {header.get('kind')!r} instead of ready")
        return self

    def _meter(self):
        """The new process into a memory cgroup of its own, before it runs any
        student code (it waits for its first request): what it starts is born there."""
        self.meter, self.unmetered = cgroups.create()
        if self.meter is None:
            return
        try:
            self.meter.add(self.host)
        except (OSError, TypeError) as exc:
            self.meter.close()
            self.meter, self.unmetered = None, f"the student's process could not be moved into its cgroup ({exc})"

    def _private_files_used(self):
        """Bytes in use on the sandbox's own /tmp and /dev/shm, seen from outside
        through the process's root; None without namespaces (its /tmp is the
        machine's, shared with everything else) or where /proc does not let us."""
        if not ISOLATE or self.host is None:
            return None
        try:
            return sum(_used_bytes(f"/proc/{self.host}/root{path}") for path in PRIVATE_FILESYSTEMS)
        except OSError:
            return None

    def files_bytes(self):
        """What the files the student's code wrote in its private /tmp and /dev/shm
        take now (the kernel's count: the process cannot change it); None where
        that cannot be read (see _private_files_used)."""
        used, start = self._private_files_used(), self._files_at_start
        return None if used is None or start is None else max(used - start, 0)

    def _shared_bytes(self):
        """Files and shared memory of the student's processes, which a call can
        write without a new charge: the cgroup's count, or what its files take if
        more (the cgroup's statistics are brought up to date in batches)."""
        return max(self.meter.shared(), self.files_bytes() or 0)

    def _processes(self):
        """How many live processes the student's code has: those of its own
        user (as root), or those in its session. Zombies do not count."""
        if self.uid is not None:
            return count_processes(uid=self.uid)
        return count_processes(session=self.host) if self.host is not None else 0

    def _watch(self):
        if self.pid is not None and self._processes() > MAX_PROCESSES:
            self._lose(f"started more than {MAX_PROCESSES} processes (a fork bomb?) and was stopped")

    def restart(self):
        self.close()
        self.generation += 1
        return self.start()

    def close(self):
        if self.pid is not None:
            for pipe in (getattr(self, "reader", None), getattr(self, "writer", None)):
                if pipe is not None:
                    try:
                        os.close(pipe.fd)
                    except OSError:
                        pass
            self._kill_everything()
            self.pid = self.host = None
        if self.home and not ISOLATE:
            shutil.rmtree(self.home, ignore_errors=True)
        self.home = None

    def _kill_everything(self):
        if self.pid is None or self.zygote is None:
            return
        if self.host is not None:
            try:
                os.killpg(self.host, signal.SIGKILL)  # its session: it and what it started
            except OSError:
                pass
        self.drain()
        if ISOLATE and self.uid is None:
            # Without root every student shares the grader's user id, so only
            # ending the whole namespace ends what a student left running.
            _forget_zygote(self.zygote)
        else:
            self.zygote.sweep(self.pid, self.uid, self.home)
        if self.meter is not None:
            self.meter.close()
            self.meter = None

    def drain(self):
        """What the current process's audit hook reported since the last drain
        (also added to the open window, and to `sightings` unless CALL_SCOPED)."""
        if self.pid is None or self.zygote is None:
            return []
        events, self.audit_seq = self.zygote.sightings(self.pid, self.audit_seq)
        self.sightings += [e for e in events if e.get("what") not in CALL_SCOPED]
        if self.window is not None:
            self.window += events
        return events

    def open_window(self):
        """Start collecting what the audit hook reports (a test cell starts)
        and which student functions are called."""
        self.drain()
        self.window = []
        self.called = set()

    def close_window(self):
        """What the audit hook reported since open_window."""
        self.drain()
        seen, self.window = self.window or [], None
        return seen

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------ exchange
    def _lose(self, reason):
        self._kill_everything()
        self.lost = f"the student's process {reason}"
        raise SandboxLost(self.lost)

    def _receive(self, deadline):
        self.reader.deadline = deadline
        try:
            return self.channel.receive()
        except TimeoutError:
            self._lose("stopped answering within the time limit and was stopped (an endless loop, or far too slow)")
        except (EOFError, ConnectionError):  # it closed its end: it exited or was killed
            code = self.zygote.exit_code(self.pid) if self.zygote else None
            self._lose(_describe_exit(code))
        except wire.WireError as exc:
            self._lose(f"sent malformed data ({exc}) and was stopped")
        except SandboxLost:
            raise  # the watchdog already stopped it, with its own reason
        except Exception as exc:  # a forged frame is the student's doing, never a grader failure
            self._lose(f"sent malformed data ({type(exc).__name__}) and was stopped")

    def request(self, header, blobs=(), timeout=None):
        """Send one request; serve the callbacks it makes; return the answer."""
        if self.lost:
            raise SandboxLost(self.lost)
        deadline = time.monotonic() + (timeout or self.limits.call_timeout_s)
        self.writer.deadline = deadline
        try:
            self.channel.send(header, list(blobs))
        except (TimeoutError, EOFError, OSError):
            self._lose("stopped reading requests")
        while True:
            reply, reply_blobs = self._receive(deadline)
            if reply.get("kind") != "callback":
                return reply, reply_blobs
            self._serve_callback(reply, reply_blobs, deadline)

    def _serve_callback(self, reply, blobs, deadline):
        fn = self.callbacks.get(reply.get("id"))
        try:
            size = sum(len(blob) for blob in blobs)
            if size > MAX_CALLBACK_BYTES:
                raise ValueError(f"the student's code passed {size // 2**20} MiB to a grader function "
                                 f"(at most {MAX_CALLBACK_BYTES // 2**20} MiB)")
            if not callable(fn):
                raise ValueError("no such grader function")
            args = self.decode(reply.get("args"), blobs)
            kwargs = self.decode(reply.get("kwargs"), blobs)
            if self.callback_data_limit is None:  # once per call: what the grader holds now, and the bound
                self.callback_data_limit = _data_bytes() + CALLBACK_MEMORY_BYTES
            self.nested += 1
            try:
                with _bounded(min(CALLBACK_SECONDS, deadline - time.monotonic()), self.callback_data_limit):
                    value = fn(*args, **kwargs)
            finally:
                self.nested -= 1
            out = []
            answer = {"kind": "callback_result", "value": self.encode(value, out)}
        except Exception as exc:  # a grader function given bad data: the student's call fails
            if isinstance(exc, MemoryError) or "can't allocate memory" in str(exc):  # NumPy's, PyTorch's
                exc = CallbackBound(f"a grader function called by the student's code needed more than "
                                    f"{CALLBACK_MEMORY_BYTES // 2**20} MiB")
            if isinstance(exc, CallbackBound):
                self.sightings.append({"what": "makes a grader function exceed its bounds", "cell": "",
                                       "detail": str(exc)})
            answer, out = {"kind": "callback_error", "message": f"{type(exc).__name__}: {exc}"}, []
        self.writer.deadline = deadline
        try:
            self.channel.send(answer, out)
        except (TimeoutError, EOFError, OSError):
            self._lose("stopped reading answers")

    # ------------------------------------------------------------ data
    def encode(self, value, blobs):
        return wire.encode(value, blobs, self._outgoing)

    def _outgoing(self, value):
        if isinstance(value, Remote) and value._sandbox is self:
            value._check_alive()
            return value._marker  # (a Remote of the other process is a callback, below)
        module = getattr(value, "__module__", "") or ""
        qualname = getattr(value, "__qualname__", "")
        if callable(value) and module.split(".")[0] in STUDENT_SIDE and "<" not in qualname:
            return {"$": "ref", "v": f"{module}:{qualname}"}  # runs there, e.g. a measuring helper
        if callable(value):
            key = len(self.callbacks) + 1
            self.callbacks[key] = value
            return {"$": "callback", "id": key}
        raise wire.WireError(f"a {type(value).__name__} cannot be sent to the student's code")

    def decode(self, obj, blobs):
        try:
            return wire.decode(obj, blobs, self._incoming)
        except wire.WireError:
            raise
        except Exception as exc:  # an index out of range, a wrong type inside a tag
            raise wire.WireError(f"malformed data ({type(exc).__name__}: {exc})") from None

    def _incoming(self, obj):
        if obj.get("$") == "handle":
            if self._origin_of_new:
                self.origins.setdefault(int(obj["id"]), self._origin_of_new)
            return Remote._for(self, {"handle": int(obj["id"])}, str(obj.get("type", "object")),
                               tuple(map(str, obj.get("mro", ()))), bool(obj.get("callable")))
        raise wire.WireError(f"unexpected marker {obj.get('$')!r} from the student's process")

    # ------------------------------------------------------------ operations
    def run_cell(self, source, timeout=None):
        reply, _ = self.request({"kind": "run_cell", "source": source}, timeout=timeout)
        if reply.get("kind") == "error":  # the server itself failed on this cell
            reply = {"stdout": "", "stderr": "", "error": reply.get("error")}
        return self._checked_cell_reply(reply)

    def _checked_cell_reply(self, reply):
        """A cell's reply as the grader reads it: text where text belongs, an
        error as a dict of text. Anything else was forged, and the student's doing."""
        error = reply.get("error")
        fields = ("type", "message", "traceback")
        well_formed = isinstance(reply.get("stdout", ""), str) and isinstance(reply.get("stderr", ""), str) and (
            error is None or (isinstance(error, dict) and all(isinstance(error.get(f, ""), str) for f in fields)
                              and isinstance(error.get("mro", []), list)))
        if not well_formed:
            self._lose("sent a malformed reply and was stopped")
        return reply

    def names(self):
        reply, _ = self.request({"kind": "names"}, timeout=30)
        return [n for n in reply.get("names", []) if isinstance(n, str) and n.isidentifier()]

    def call(self, target, args, kwargs, replace=None):
        """target(*args, **kwargs) in the student's process; `replace` maps
        names of the function's globals to values (a grader function, say)
        that stand in for them during the call."""
        if not self.nested:
            self.callbacks = {}
            self.callback_data_limit = None
        _CHANGED_IN_PLACE.clear()
        self._note_called(target)
        blobs = []
        header = {"kind": "call", "target": target, "args": self.encode(list(args), blobs),
                  "kwargs": self.encode(dict(kwargs), blobs)}
        if replace:
            header["replace"] = self.encode(dict(replace), blobs)
        reply, reply_blobs = self.request(header, blobs)
        return self._answer(reply, reply_blobs, list(args) + list(kwargs.values()), self._origin(target))

    def keep(self, value):
        """A Remote for `value` as the student's process holds it now (a student
        function by name, say), whatever that name is bound to later."""
        blobs = []
        reply, _ = self.request({"kind": "stage", "values": self.encode([value], blobs)}, blobs)
        handles = reply.get("handles") if reply.get("kind") == "staged" else None
        if not (isinstance(handles, list) and len(handles) == 1 and isinstance(handles[0], int)):
            self._lose("sent a malformed reply and was stopped")
        self.origins.setdefault(handles[0], self._origin(value._target) if isinstance(value, Remote) else None)
        return Remote._for(self, {"handle": handles[0]}, "function")

    def measured_call(self, fn, args, kwargs):
        """(value, Measured or None): fn(*args, **kwargs) in the student's
        process, measured by the kernel over the call alone (the arguments are
        sent before and the answer fetched after the measurement): `new` is the
        peak growth of the charge of the process's memory cgroup, threads and
        children included, less the pages the call rewrote; `rewritten` the bytes
        of memory that existed before the call and that the call wrote in runs of
        at least REWRITE_RUN_PAGES pages (a buffer), seen as the pages it copied
        from a process that holds the memory as it was (student_runtime.server's
        `hold`); `shared` the files and shared memory the student's processes
        held as the call began, whose pages no copy reveals (_shared_bytes).
        None where the process has no cgroup (`unmetered` says why)."""
        self.callbacks, self.callback_data_limit = {}, None
        values = list(args) + list(kwargs.values())
        target = self._target_of(fn)
        self._note_called(target)
        blobs = []
        staged, _ = self.request({"kind": "stage", "values": self.encode(values, blobs)}, blobs)
        handles = staged.get("handles") if staged.get("kind") == "staged" else None
        if not (isinstance(handles, list) and len(handles) == len(values) and all(isinstance(h, int) for h in handles)):
            self._lose("sent a malformed reply and was stopped")
        markers = [{"$": "handle", "id": h} for h in handles]
        header = {"kind": "call", "target": target, "keep": True,
                  "args": {"$": "list", "v": markers[:len(args)]},
                  "kwargs": {"$": "dict", "v": dict(zip(kwargs, markers[len(args):]))}}
        meter, holder = self.meter, None
        if meter is not None:
            held, _ = self.request({"kind": "hold"})
            holder = self.zygote.host_pid(held["pid"]) if isinstance(held.get("pid"), int) else None
            if holder is None or holder not in _children(self.host):
                self.forfeited.setdefault(self._origin(target) or "", "measured without holding its memory")
                self.sightings.append({"what": "changes the grader's helpers in its process", "cell": "",
                                       "detail": "a measured call ran without the process that holds its memory"})
            frames = page_frames(self.host)
            shared = self._shared_bytes()
            meter.begin()
        try:
            reply, _ = self.request(header)
        finally:
            measured = None
            if meter is not None and self.meter is meter:
                charged = meter.end()
                after = page_frames(self.host) if holder else {}
                # Every copied page was charged; only runs of them are a buffer being
                # written (the interpreter's own writes are scattered pages).
                copied = rewritten_bytes(frames, after)
                measured = Measured(max(charged - copied, 0), rewritten_bytes(frames, after, REWRITE_RUN_PAGES),
                                    shared)
            if holder:
                with contextlib.suppress(OSError):
                    os.kill(holder, signal.SIGKILL)
        if reply.get("kind") == "error":
            raise remote_exception(reply.get("error") or {})
        kept = (reply.get("value") or {}).get("id") if isinstance(reply.get("value"), dict) else None
        if reply.get("kind") != "value" or not isinstance(kept, int):
            self._lose("sent a malformed reply and was stopped")
        answer, answer_blobs = self.request({"kind": "fetch", "handle": kept, "release": handles + [kept]})
        return self._answer(answer, answer_blobs, [], self._origin(target)), measured

    def _target_of(self, fn):
        if isinstance(fn, Remote) and fn._sandbox is self:
            fn._check_alive()
            return fn._target
        marker = self._outgoing(fn)
        if marker.get("$") != "ref":
            raise ValueError(f"{fn!r} cannot run in the student's process")
        return {"ref": marker["v"]}

    def _note_called(self, target):
        name = self._origin(target)
        if name:
            self.called.add(name)

    def _origin(self, target):
        """The name of the student function a call target comes from."""
        if "name" in target:
            return target["name"]
        return self.origins.get(target.get("handle"))

    def getattr(self, handle, name):
        self._note_called({"handle": handle})
        reply, reply_blobs = self.request({"kind": "getattr", "handle": handle, "name": name})
        return self._answer(reply, reply_blobs, [], self.origins.get(handle))

    def _answer(self, reply, blobs, sent, origin=None):
        if not isinstance(reply.get("mirror") or {}, dict) or not isinstance(reply.get("error") or {}, dict):
            self._lose("sent a malformed reply and was stopped")
        if reply.get("kind") == "error":
            raise remote_exception(reply.get("error") or {})
        if reply.get("kind") != "value":
            raise SandboxLost(f"the student's process answered {reply.get('kind')!r}")
        for key, encoded in (reply.get("mirror") or {}).items():
            if not (isinstance(key, str) and key.isdigit() and int(key) < len(sent)):
                self._lose("sent a malformed reply and was stopped")
            original = sent[int(key)]
            if _differs(original, self.decode(encoded, blobs)):
                _CHANGED_IN_PLACE[id(original)] = original
        self._origin_of_new = origin
        return self.decode(reply.get("value"), blobs)


# Arguments that a student's call changed in place. The grader's own objects
# are never changed: what a student does to its arguments cannot change what
# it is compared with. Checks ask `changed_in_place` instead.
_CHANGED_IN_PLACE = {}


def _differs(original, after):
    import numpy as np

    torch = sys.modules.get("torch")
    if isinstance(original, np.ndarray):
        return not (isinstance(after, np.ndarray) and original.shape == after.shape
                    and np.array_equal(original, after, equal_nan=True))
    if torch is not None and isinstance(original, torch.Tensor):
        if not (isinstance(after, torch.Tensor) and original.shape == after.shape):
            return True
        return not torch.equal(original, after.to(device=original.device, dtype=original.dtype))
    return False


def changed_in_place(obj):
    """Whether a student's call changed this argument (the grader's copy is intact)."""
    return _CHANGED_IN_PLACE.get(id(obj)) is obj


_EXCEPTION_TYPES = {}


def remote_exception(info):
    """An exception for the grader that carries the student's exception's name
    and message and is an instance of the same built-in exception family
    (ValueError, NotImplementedError, ...), so checks can tell them apart."""
    import builtins

    from autograde.compare import GradingFailure

    name = str(info.get("type", "Exception"))[:100]
    message = str(info.get("message", ""))
    mro = [str(m) for m in info.get("mro", [])]
    if "student_runtime.calls.GradingFailure" in mro:
        return GradingFailure(message)
    base = Exception
    for qual in mro:
        module, _, short = qual.rpartition(".")
        candidate = getattr(builtins, short, None)
        if module == "builtins" and isinstance(candidate, type) and issubclass(candidate, Exception):
            base = candidate
            break
    key = (name, base)
    if key not in _EXCEPTION_TYPES:
        _EXCEPTION_TYPES[key] = type(name if name.isidentifier() else "StudentError", (base,), {})
    exc = _EXCEPTION_TYPES[key](message)
    exc.student_traceback = str(info.get("traceback", ""))  # the student's own code: fine to show them
    return exc


class Remote:
    """A student's function, class or object, living in the student's process."""

    __slots__ = ("_sandbox", "_target", "_marker", "_generation", "_remote_mro")

    @classmethod
    def _for(cls, sandbox, target, type_name, mro=(), is_callable=True):
        name = type_name if type_name.isidentifier() else "object"
        sub = _REMOTE_TYPES.setdefault((name, is_callable),
                                       type(name, (RemoteCallable if is_callable else Remote,), {"__slots__": ()}))
        obj = object.__new__(sub)
        object.__setattr__(obj, "_sandbox", sandbox)
        object.__setattr__(obj, "_target", target)
        marker = {"$": "student", "name": target["name"]} if "name" in target else {"$": "handle", "id": target["handle"]}
        object.__setattr__(obj, "_marker", marker)
        object.__setattr__(obj, "_generation", sandbox.generation)
        object.__setattr__(obj, "_remote_mro", tuple(mro))
        return obj

    def _check_alive(self):
        if self._generation != self._sandbox.generation:
            raise SandboxLost("this object belonged to a student process that has since been restarted")

    def __getattr__(self, name):
        if name.startswith("__") or "handle" not in self._target:
            raise AttributeError(name)
        self._check_alive()
        return self._sandbox.getattr(self._target["handle"], name)

    def __setattr__(self, name, value):
        raise AttributeError("objects in the student's process are read through calls only")

    def __repr__(self):
        return f"<{type(self).__name__} in the student's process>"


class RemoteCallable(Remote):
    __slots__ = ()

    def __call__(self, *args, **kwargs):
        self._check_alive()
        return self._sandbox.call(self._target, args, kwargs)


_REMOTE_TYPES = {}


def student_function(sandbox, name):
    return Remote._for(sandbox, {"name": name}, "function")


def find_remote(values):
    for value in values:
        if isinstance(value, Remote):
            return value
    return None


def in_student_process(helper, *args, **kwargs):
    """helper(*args, **kwargs), run where the student's code lives: in the
    sandbox when a student object is among the arguments (measurements such as
    peak memory or kernel launches must be taken in the process that runs the
    code), here otherwise. `helper` must be a module-level function of a
    student-side package (STUDENT_SIDE): autograde itself is not importable there."""
    remote = find_remote(list(args) + list(kwargs.values()))
    if remote is None:
        return helper(*args, **kwargs)
    return remote._sandbox.call({"ref": f"{helper.__module__}:{helper.__qualname__}"}, args, kwargs)


_JAIL_LIB = None  # the student-side packages staged for helper processes (jailed_python)


def jailed_python(code, uid=None):
    """argv of a Python process that runs `code` as student code runs: the
    student-side packages importable, a minimal environment, in namespaces of its
    own with a private writable /tmp/work (unless the instructor chose process
    limits only), and, when the grader is root, as `uid`. For helper processes that
    evaluate a student's code outside the student's process, such as the compiler
    of its kernels (autograde.kernel_compile)."""
    global _JAIL_LIB
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"] if uid is not None else []
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp/work", "TMPDIR": "/tmp/work", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    if not ISOLATE:
        lib = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        return ["env", "-i", *(f"{k}={v}" for k, v in {**env, "HOME": tempfile.gettempdir(),
                                                        "TMPDIR": tempfile.gettempdir()}.items()),
                *drop, sys.executable, "-c", f"import sys; sys.path.insert(0, {lib!r}); {code}"]
    if _JAIL_LIB is None:
        _JAIL_LIB = _stage_student_packages(tempfile.mkdtemp(prefix="grader-jail-"))
        atexit.register(shutil.rmtree, os.path.dirname(_JAIL_LIB), True)
    options = _bwrap_prefix(_JAIL_LIB) + ["--perms", "01777", "--dir", "/tmp/work", "--chdir", "/tmp/work",
                                          "--clearenv"]
    for name, value in env.items():
        options += ["--setenv", name, value]
    return options + ["--", *drop, _sandbox_python(), "-c", f"import sys; sys.path.insert(0, '/course/lib'); {code}"]


def note_sighting(value, what, detail):
    """Put `what` in the integrity report of the student whose object `value`
    is (a check saw something a person should look at); nothing for a local object."""
    remote = find_remote([value])
    if remote is not None:
        remote._sandbox.sightings.append({"what": what, "cell": "", "detail": detail})


def forfeit(value, what, detail):
    """An integrity check on the student's function (or object) `value`
    failed: report it like note_sighting, and let no test cell that calls this
    function earn its points, before this one or after (autograde.execute
    applies it when the notebook is done). Nothing for a local object."""
    remote = find_remote([value])
    if remote is None:
        return
    sandbox = remote._sandbox
    sandbox.sightings.append({"what": what, "cell": "", "detail": detail})
    name = sandbox._origin(remote._target)
    if name:
        sandbox.forfeited.setdefault(name, f"{what}: {detail}")


def reported_during(fn, *args, what_reported, **kwargs):
    """(fn(*args, **kwargs), details of the audit reports `what_reported` that
    the student's process made while it ran, from any thread). The reports go
    to a pipe held outside the student's process (student_runtime.audit)."""
    remote = find_remote([fn, *args, *kwargs.values()])
    if remote is None:  # a local call: only PyTorch's layers can be marked here
        from student_runtime import layers

        if what_reported != layers.REPORT:
            return fn(*args, **kwargs), []
        with layers.recorded_here() as seen:
            result = fn(*args, **kwargs)
        return result, sorted(set(seen))
    sandbox = remote._sandbox
    sandbox.drain()
    try:
        result = fn(*args, **kwargs)
    finally:
        # A flood of the audit pipe during the call may hide the reports behind it: it counts as one.
        seen = sorted({e.get("detail", "") or e.get("what", "") for e in sandbox.drain()
                       if e.get("what") in (what_reported, AUDIT_FLOOD)})
    return result, seen


def is_instance(value, cls):
    """isinstance that also recognises objects living in the student's process."""
    if isinstance(value, Remote):
        return f"{cls.__module__}.{cls.__qualname__}" in value._remote_mro
    return isinstance(value, cls)


__all__ = ["EnvironmentFailure", "Limits", "Remote", "Sandbox", "SandboxLost", "find_remote", "forfeit",
           "in_student_process", "is_instance", "jailed_python", "note_sighting", "reported_during",
           "student_function"]
