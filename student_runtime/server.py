"""The process that runs a student's code (started by autograde.sandbox in the grader).

It runs the notebook's non-test cells in an IPython shell and then answers
requests from the grader: call a student function, read an attribute of an
object it returned, or run one of the measuring probes (student_runtime.probes) on the
student's function. Every answer is plain data (student_runtime.wire); an object
that is not data stays here and the grader gets a numbered handle to it.
Nothing here decides a grade: the tests run in the grader's process.

The probes are taken from a snapshot made before any student code ran
(student_runtime.integrity), and the snapshot is checked before and after
every request. The template comes in two kinds: one with PyTorch (and Triton)
loaded, whose attention layers report their calls (student_runtime.layers),
and one in which PyTorch does not exist (student_runtime.torchless), for the
exercises graded as NumPy code."""
import contextlib
import gc
import importlib
import io
import os
import signal
import sys
import traceback
import warnings

MAX_TEXT = 20_000  # characters of a cell's printed output kept for the feedback


def _clip(text):
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "\n... (output cut)"


def _mro(value):
    """Qualified names of the value's classes, so the grader can recognise their families."""
    return [f"{c.__module__}.{c.__qualname__}" for c in type(value).__mro__]


def _exception(exc):
    return {"type": type(exc).__name__, "mro": _mro(exc), "message": _clip(str(exc))[:4000],
            "traceback": _clip("".join(traceback.format_exception(exc)))}


class Server:
    def __init__(self, channel):
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config

        from student_runtime import wire

        self.wire = wire
        self.channel = channel
        config = Config()
        config.HistoryManager.hist_file = ":memory:"
        self.shell = InteractiveShell.instance(config=config)
        self.shell.showtraceback = self._remember_traceback
        self.initial = set(self.shell.user_ns)
        self.handles = {}
        self.snapshot = None  # the grader's helpers as loaded (student_runtime.integrity), set by the template
        self.torchless = False
        self.holding = None  # (pid, pipe) of the process holding memory during a measured call
        self._audit = sys.audit  # kept before student code runs, which could rebind sys.audit

    # ------------------------------------------------------------ encoding
    def _handle(self, value):
        key = len(self.handles) + 1
        self.handles[key] = value
        return {"$": "handle", "id": key, "type": type(value).__name__, "mro": _mro(value),
                "callable": callable(value)}

    def _callback(self, key):
        def callback(*args, **kwargs):
            blobs = []
            payload = {"kind": "callback", "id": key,
                       "args": self.wire.encode(list(args), blobs, self._handle),
                       "kwargs": self.wire.encode(kwargs, blobs, self._handle)}
            self.channel.send(payload, blobs)
            while True:
                header, blobs = self.channel.receive()
                if header.get("kind") in ("callback_result", "callback_error"):
                    break
                self._answer_request(header, blobs)  # the grader's function asks this process something first
            if header.get("kind") == "callback_error":
                raise RuntimeError(header.get("message", "the grader's function failed"))
            return self.wire.decode(header["value"], blobs, self._marker)
        return callback

    def _marker(self, obj):
        tag = obj.get("$")
        if tag == "student":
            name = obj["name"]
            if name not in self.shell.user_ns:
                raise NameError(f"name '{name}' is not defined")
            return self.shell.user_ns[name]
        if tag == "handle":
            return self.handles[obj["id"]]
        if tag == "callback":
            return self._callback(obj["id"])
        if tag == "ref":
            return self._helper(obj["v"])
        raise self.wire.WireError(f"unknown marker {tag!r}")

    def _helper(self, spec):
        """A helper of the grader's, as it was before any student code ran."""
        if self.snapshot is not None:
            return self.snapshot.resolve(spec)
        module, _, name = spec.partition(":")
        target = importlib.import_module(module)
        for part in name.split("."):
            target = getattr(target, part)
        return target

    def _check_helpers(self):
        """Put back any of the grader's helpers the student's code changed, and say so."""
        if self.snapshot is None:
            return
        changed = self.snapshot.restore()
        if changed:
            self._audit("student_runtime.report", "changes the grader's helpers in its process",
                        ", ".join(changed[:8]))

    def _refuse(self, value):
        raise self.wire.WireError(f"a {type(value).__name__} is not data")

    def _is_primitive(self, value):
        """Attributes that are values (numbers, shapes) cross as data; anything
        else, tensors included, stays here so that methods can mutate it."""
        import numpy as np

        if value is None or isinstance(value, (bool, int, float, str, complex, np.generic, np.dtype)):
            return True
        torch = self.wire.real_torch()
        if torch is not None and isinstance(value, (torch.Size, torch.dtype)):
            return True
        return type(value) is tuple and all(self._is_primitive(v) for v in value)

    # ------------------------------------------------------------ requests
    def run_cell(self, header, blobs):
        source = header["source"]
        with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
            # With history each cell gets its own name in linecache, which
            # Triton's interpreter needs to read a kernel's source.
            result = self.shell.run_cell(source, store_history=True)
            for _ in range(100):
                rest = self._after_torch_use(source, result.error_in_exec)
                if rest is None:
                    break
                source = rest
                result = self.shell.run_cell(rest, store_history=True)
        failed = result.error_before_exec or result.error_in_exec
        reply = {"kind": "ran", "stdout": _clip(out.getvalue()), "stderr": _clip(err.getvalue())}
        if failed is not None:
            reply["error"] = _exception(failed)
        return reply, []

    def _after_torch_use(self, source, error):
        """Without PyTorch, a cell's top-level statement that used it is passed
        over and the statements after it still run, as they did where PyTorch
        exists (a setup cell's `torch.manual_seed(0)`, a comparison with PyTorch
        after a definition): the source of the rest, or None."""
        from student_runtime.torchless import TorchUnavailable

        if not self.torchless or not isinstance(error, TorchUnavailable):
            return None
        line = None
        tb = error.__traceback__
        while tb is not None and line is None:
            if tb.tb_frame.f_code.co_filename.startswith("<ipython-input-"):
                line = tb.tb_lineno  # the outermost frame of the cell: a top-level statement
            tb = tb.tb_next
        if line is None:
            return None
        import ast

        code = self.shell.transform_cell(source)
        try:
            statements = ast.parse(code).body
        except SyntaxError:
            return None
        ends = [node.end_lineno for node in statements if node.lineno <= line <= node.end_lineno]
        if not ends:
            return None
        lines = code.splitlines()
        rest = lines[ends[0]:]
        return "\n" * ends[0] + "\n".join(rest) if any(ln.strip() for ln in rest) else None

    def _remember_traceback(self, *args, **kwargs):
        pass  # the error is reported in the reply; nothing is printed

    def warm_up(self):
        """Run the shell's own machinery once (cell execution, display, errors,
        magics) so the modules it imports on first use are loaded."""
        for source in ("pass", "1", "1 / 0", "%matplotlib inline", "import numpy as _np\n_np.ones(2)"):
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                self.shell.run_cell(source, store_history=False)
        self.initial = set(self.shell.user_ns)
        try:  # the measuring helpers import parts of PyTorch on first use
            import numpy as np

            from student_runtime.probes import inside_peak
            inside_peak(lambda: np.ones(4) + 1)
        except Exception:
            pass

    def names(self, header, blobs):
        import types

        found = []
        for name, value in list(self.shell.user_ns.items()):
            if name.startswith("_") or name in self.initial or isinstance(value, types.ModuleType):
                continue
            if callable(value):
                found.append(name)
        return {"kind": "names", "names": found}, []

    def _target(self, spec):
        if "name" in spec:
            return self._marker({"$": "student", "name": spec["name"]})
        if "handle" in spec:
            return self.handles[spec["handle"]]
        return self._marker({"$": "ref", "v": spec["ref"]})

    def call(self, header, blobs):
        target = self._target(header["target"])
        args = self.wire.decode(header["args"], blobs, self._marker)
        kwargs = self.wire.decode(header["kwargs"], blobs, self._marker)
        grad_off = contextlib.nullcontext()
        torch = self.wire.real_torch()
        if torch is not None and "handle" in header["target"]:
            grad_off = torch.no_grad()  # methods of returned objects, e.g. a layer's weight.copy_()
        replace = self.wire.decode(header.get("replace") or {"$": "dict", "v": {}}, blobs, self._marker)
        namespace = getattr(target, "__globals__", None) if replace else None
        saved = {name: namespace.get(name, _MISSING) for name in replace} if namespace is not None else {}
        if namespace is not None:
            namespace.update(replace)  # e.g. a helper the function calls, replaced by the grader's recorder
        try:
            with warnings.catch_warnings(), grad_off, \
                    contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                warnings.simplefilter("ignore")
                value = target(*args, **kwargs)
        finally:
            for name, old in saved.items():
                if old is _MISSING:
                    namespace.pop(name, None)
                else:
                    namespace[name] = old
        if header.get("keep"):  # a measured call: the answer crosses later, outside the measurement
            return {"kind": "value", "value": self._handle(value), "mirror": {}}, []
        out_blobs = []
        mirror = {}
        for i, arg in enumerate(list(args) + list(kwargs.values())):
            if hasattr(arg, "shape"):  # arrays and tensors go back, in case the call changed them
                try:
                    mirror[str(i)] = self.wire.encode(arg, out_blobs, self._refuse)
                except Exception:  # not data (or an object whose attributes fail): it stays here
                    pass
        return {"kind": "value", "value": self.wire.encode(value, out_blobs, self._handle),
                "mirror": mirror}, out_blobs

    def stage(self, header, blobs):
        """Keep values here and answer with handles to them, so that a measured
        call's arguments arrive before its measurement starts."""
        values = self.wire.decode(header["values"], blobs, self._marker)
        return {"kind": "staged", "handles": [self._handle(v)["id"] for v in values]}, []

    def hold(self, header, blobs):
        """Fork a process that holds this one's memory as it is now, and only
        waits, while a measured call runs: every page of this process is then
        shared with it, so a page the call writes, allocated before it or not
        (a buffer kept from an earlier cell, memory the allocator reuses), is
        copied, and the kernel charges the copy to the call."""
        gc.collect()
        gc.freeze()  # a collection during the call then writes only to what the call made (they stay frozen)
        _trim()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(write)
            os.read(read, 1)  # until the measured call is over and this end is closed
            os._exit(0)
        os.close(read)
        self.holding = (pid, write)
        return {"kind": "held", "pid": pid}, []

    def _release_hold(self):
        if self.holding is not None:
            pid, write = self.holding
            self.holding = None
            os.close(write)
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)

    def fetch(self, header, blobs):
        """A kept value, as data; then forget the handles named in `release`."""
        self._release_hold()
        value = self.handles[header["handle"]]
        out_blobs = []
        encoded = self.wire.encode(value, out_blobs, self._handle)
        for key in header.get("release", []):
            self.handles.pop(key, None)
        return {"kind": "value", "value": encoded, "mirror": {}}, out_blobs

    def getattr(self, header, blobs):
        value = getattr(self.handles[header["handle"]], header["name"])
        out_blobs = []
        encoded = self.wire.encode(value, out_blobs, self._handle) if self._is_primitive(value) \
            else self._handle(value)
        return {"kind": "value", "value": encoded, "mirror": {}}, out_blobs

    def serve(self):
        self.channel.send({"kind": "ready", "pid": os.getpid()})
        while True:
            try:
                header, blobs = self.channel.receive()
            except EOFError:
                return
            self._answer_request(header, blobs)

    def _answer_request(self, header, blobs):
        try:
            self._check_helpers()  # first: the handlers below are looked up after it
            handler = {"run_cell": self.run_cell, "names": self.names, "call": self.call, "stage": self.stage,
                       "hold": self.hold, "fetch": self.fetch, "getattr": self.getattr}.get(header.get("kind"))
            if handler is None:
                raise ValueError(f"unknown request {header.get('kind')!r}")
            reply, out_blobs = handler(header, blobs)
        except BaseException as exc:  # the student's error (or SystemExit) is the answer
            reply, out_blobs = {"kind": "error", "error": _exception(exc)}, []
        self._check_helpers()
        try:
            self.channel.send(reply, out_blobs)
        except (self.wire.WireError, TypeError, ValueError) as exc:  # e.g. a NaN hidden in a dict
            self.channel.send({"kind": "error", "error": _exception(exc)})


_MISSING = object()


def _trim():
    """Give the memory the allocator keeps free back to the system, so that
    reusing it is charged again."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None).malloc_trim(0)


# Loaded before the switch to an unprivileged user: the Python installation
# may live where that user cannot read (a root-only home), and these are what
# the course's notebooks and the grader's measuring helpers import.
PRELOAD = [
    "abc", "ast", "bdb", "bisect", "inspect", "linecache", "pdb", "tokenize", "traceback", "cmath", "collections", "contextlib", "copy", "dataclasses", "decimal", "enum",
    "fractions", "functools", "heapq", "itertools", "json", "math", "numbers", "operator", "random", "re",
    "statistics", "string", "textwrap", "time", "typing", "warnings",
    "numpy", "numpy.linalg", "numpy.random", "numpy.fft",
    "matplotlib", "matplotlib.pyplot",
    "student_runtime.calls", "student_runtime.probes", "student_runtime.capstone", "student_runtime.integrity",
    "coursekit.memory",
    "coursekit.triton_env",
]
PRELOAD_TORCH = ["torch", "torch.nn", "torch.nn.functional", "torch.utils._python_dispatch",
                 "torch.utils.flop_counter", "coursekit.torch_memory", "student_runtime.layers"]
# Importing Triton does not touch the GPU, so this template can still fork
# children that start CUDA themselves. coursekit.kernel_replay notes, as it is
# imported, the libraries a replay of kernels runs through: before any student code
# (and it makes the interpreter skip its wasted work first, coursekit.fast_interpreter).
PRELOAD_TRITON = ["triton", "triton.language", "coursekit.triton_trace", "coursekit.kernel_replay"]


def _preload(torchless):
    for name in PRELOAD + ([] if torchless else PRELOAD_TORCH + PRELOAD_TRITON):
        try:
            importlib.import_module(name)
        except Exception:  # a missing optional library is the notebook's problem, reported when it imports it
            pass


def _become(uid, nproc):
    import resource

    if uid >= 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _limit(spec):
    """In a new student process, before any of its code: limits and a session of its own."""
    import resource

    os.setsid()
    resource.setrlimit(resource.RLIMIT_CPU, (spec["cpu_s"], spec["cpu_s"] + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (spec["file_bytes"], spec["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if spec["memory_bytes"]:
        resource.setrlimit(resource.RLIMIT_AS, (spec["memory_bytes"], spec["memory_bytes"]))
    try:  # if the machine runs out of memory anyway, the kernel stops student code first
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")
    except OSError:
        pass


def _fresh_home(spec):
    """The student's private folder: new and empty, theirs alone."""
    import shutil

    home = spec["home"]
    shutil.rmtree(home, ignore_errors=True)
    os.makedirs(home, mode=0o700)
    if spec["uid"] >= 0:
        os.chown(home, spec["uid"], spec["uid"])
    os.chmod(home, 0o700)


def _sweep(request):
    """End everything a student started and remove what it wrote: its session,
    every process of its user id (as root), its folder, /tmp and /dev/shm, and the
    System V IPC objects of the sandbox."""
    import subprocess
    import time

    from student_runtime.processes import count_processes

    with contextlib.suppress(OSError):
        os.killpg(request["pid"], signal.SIGKILL)
    uid = request.get("uid", -1)
    if uid >= 0:
        # Children that left the session (setsid) still run as that uid; a fork
        # bomb may fork between two sweeps, so sweep until none is left.
        for _ in range(100):
            pid = os.fork()
            if pid == 0:
                try:
                    os.setuid(uid)
                    os.kill(-1, signal.SIGKILL)
                finally:
                    os._exit(0)
            os.waitpid(pid, 0)
            if count_processes(uid=uid) == 0:
                break
            time.sleep(0.05)
    _remove(request["home"])
    if not request.get("isolated"):
        return
    for folder, keep in (("/dev/shm", ()), ("/tmp", (TEMPLATE_FOLDER,))):
        for entry in os.listdir(folder) if os.path.isdir(folder) else ():
            path = os.path.join(folder, entry)
            if path not in keep:
                _remove(path)
    # System V shared memory, semaphores and message queues outlive their process: in the
    # sandbox's own IPC namespace, what one student made must not reach the next.
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["ipcrm", "--all"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)


def _remove(path):
    """Remove a file or a folder tree, however deep: a student can nest folders past
    Python's recursion limit, which shutil.rmtree would not survive. GNU rm walks any
    depth; shutil.rmtree is the fallback where it is missing."""
    import shutil
    import subprocess

    if not os.path.lexists(path):
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["rm", "-rf", "--", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    if os.path.lexists(path):
        with contextlib.suppress(Exception):
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)


TEMPLATE_FOLDER = "/tmp/template"  # the template's working folder in the sandbox (autograde.sandbox)
FLOOD = "floods its audit report"  # what AuditLog records for a process that keeps its pipe full


class AuditLog:
    """What the audit hook of one student process wrote (student_runtime.audit),
    read as it comes so that the hook never waits for long. Repeated lines are
    counted, not stored again; each entry remembers the sequence number of its
    latest sighting, so the grader can ask what happened since a moment it
    chose (before and after a graded call)."""

    DISTINCT = 2000  # different sightings kept per process; more is a flood, itself reported
    # Bytes read per call: a process that keeps the pipe full (of anything, even empty lines)
    # must not keep the template reading, which would leave the grader's requests unanswered.
    BUDGET = 1 << 20

    def __init__(self, fd):
        self.fd = fd
        self.partial = b""
        self.seq = 0
        self.entries = {}  # (what, detail) -> entry

    def read(self):
        import json

        taken = 0
        while self.fd is not None:
            if taken >= self.BUDGET:   # more is waiting: read on at the next call, and say so
                self._add({"what": FLOOD, "detail": "", "cell": ""})
                return
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:  # the process ended (or closed its end: what it does later is not seen)
                os.close(self.fd)
                self.fd = None
                return
            taken += len(chunk)
            *lines, self.partial = (self.partial + chunk).split(b"\n")
            if len(self.partial) > 4096:
                self.partial = b""
            for line in lines:
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if isinstance(event, dict):
                        self._add({k: str(event.get(k, ""))[:300] for k in ("what", "detail", "cell")})

    def _add(self, event):
        self.seq += 1
        key = (event["what"], event["detail"])
        if key not in self.entries and len(self.entries) >= self.DISTINCT:
            key = (FLOOD, "")
            event = {"what": key[0], "detail": "", "cell": event["cell"]}
        entry = self.entries.setdefault(key, {**event, "count": 0})
        entry["count"] += 1
        entry["seq"] = self.seq

    def since(self, seq):
        self.read()
        return [dict(e) for e in self.entries.values() if e["seq"] > seq], self.seq

    def close(self):
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


def _readable():
    """Folders any import or library reads: not worth a report."""
    return sorted({sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                   "/usr", "/etc", "/proc/self", "/sys", "/dev", "/lib", "/lib64", "/bin"})


def _student_process(server, spec, conn, audit_fd):
    """The forked child: becomes the student's process and serves until the grader hangs up."""
    from student_runtime import audit
    from student_runtime.wire import Channel

    import tempfile

    home = spec["home"]
    _limit(spec)
    os.chdir(home)
    for name in ("HOME", "TMPDIR", "MPLCONFIGDIR"):
        os.environ[name] = home
    tempfile.tempdir = home  # the template already asked once; the student's temporary files go home
    _become(spec["uid"], spec["nproc"])
    audit.install(audit_fd, home, _readable())  # before any of the student's code, for the rest of its life
    fd = conn.detach()
    server.channel = Channel(os.fdopen(fd, "rb", buffering=0), os.fdopen(os.dup(fd), "wb"))
    server.serve()


MIN_FREE_MEMORY = 256 * 2**20  # what a notebook needs at least beyond the loaded libraries


def _address_space():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def zygote(control_fd, torchless=False):
    """A process with the libraries loaded that forks one student process per
    request: each starts in a fraction of a second instead of importing
    PyTorch again. It also reaps them, reports how each ended and holds what
    their audit hooks wrote. Without PyTorch (`torchless`) it blocks PyTorch
    before anything is imported."""
    import json
    import select
    import socket
    import time

    from student_runtime import integrity, torchless as blocker

    if torchless:
        blocker.install()
    control = socket.socket(fileno=control_fd)
    server = Server(None)
    server.torchless = torchless
    _preload(torchless)
    if not torchless:
        from student_runtime import layers

        layers.install()
    server.warm_up()
    if os.path.isdir(TEMPLATE_FOLDER) and os.getcwd() == TEMPLATE_FOLDER:
        os.chmod("/tmp", 0o1777)  # in the sandbox: /tmp is the student's to write, as in Jupyter
    server.snapshot = integrity.Snapshot()  # the grader's helpers, before any student code
    # The libraries' objects are never freed: keeping them out of the collector
    # spares each student's copy-on-write memory, and a full collection during
    # a measured call then touches only the student's own objects.
    gc.collect()
    gc.freeze()
    ended = {}

    def reap():
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            ended[pid] = os.waitstatus_to_exitcode(status)

    asked = {"id": None}   # the request being answered: its number goes back with the reply

    def reply(message, fds=()):
        socket.send_fds(control, [json.dumps({**message, "id": asked["id"]}).encode() + b"\n"], list(fds))

    audits = {}  # student pid -> its AuditLog
    reply({"ready": os.getpid()})
    buffer = b""
    while True:
        watched = [log.fd for log in audits.values() if log.fd is not None]
        ready, _, _ = select.select([control] + watched, [], [], 0.2)
        reap()
        for log in audits.values():
            if log.fd is not None and log.fd in ready:
                log.read()
        if control not in ready:
            continue
        data = control.recv(65536)
        if not data:
            os._exit(0)  # the grader is gone; its student processes end when their channels close
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            asked["id"] = request.get("id")
            if request["op"] == "spawn":
                needed = _address_space() + MIN_FREE_MEMORY
                if request["memory_bytes"] and request["memory_bytes"] < needed:
                    reply({"error": f"the memory limit ({request['memory_bytes'] // 2**20} MiB) leaves no room: "
                                    f"the course's libraries alone take {_address_space() // 2**20} MiB of address "
                                    f"space; allow at least {needed // 2**20 + 1} MiB"})
                    continue
                _fresh_home(request)
                ours, theirs = socket.socketpair()
                sightings, report = os.pipe()
                pid = os.fork()
                if pid == 0:
                    try:
                        control.close()
                        ours.close()
                        os.close(sightings)
                        for log in audits.values():
                            log.close()
                        _student_process(server, request, theirs, report)
                    finally:
                        os._exit(0)
                os.close(report)
                os.set_blocking(sightings, False)
                audits[pid] = AuditLog(sightings)
                theirs.close()
                reply({"pid": pid}, [ours.fileno()])
                ours.close()
            elif request["op"] == "audit":
                log = audits.get(request["pid"])
                events, seq = log.since(int(request.get("since", 0))) if log else ([], 0)
                reply({"events": events, "seq": seq})
            elif request["op"] == "sweep":
                log = audits.pop(request["pid"], None)
                if log is not None:
                    log.close()
                try:
                    _sweep(request)
                except Exception:   # whatever a student left, the template lives on for the next one
                    pass
                reap()
                reply({"swept": True})
            elif request["op"] == "ended":
                for _ in range(30):  # it was just killed or exited: give the reaper a moment
                    reap()
                    if request["pid"] in ended:
                        break
                    time.sleep(0.1)
                reply({"pid": request["pid"], "code": ended.pop(request["pid"], None)})


def main():
    # A write past the file-size limit should fail with an error, not kill us.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    os.environ.setdefault("MPLBACKEND", "Agg")
    zygote(int(sys.argv[1]), torchless=sys.argv[2:3] == ["torchless"])


if __name__ == "__main__":
    main()
