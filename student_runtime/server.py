"""The process that runs a student's code (started by autograde.sandbox in the grader).

It runs the notebook's non-test cells in an IPython shell and then answers
requests from the grader: call a student function, read an attribute of an
object it returned, or run one of the measuring probes (student_runtime.probes) on the
student's function. Every answer is plain data (student_runtime.wire); an object
that is not data stays here and the grader gets a numbered handle to it.
Nothing here decides a grade: the tests run in the grader's process."""
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
            header, blobs = self.channel.receive()
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
            module, _, name = obj["v"].partition(":")
            target = importlib.import_module(module)
            for part in name.split("."):
                target = getattr(target, part)
            return target
        raise self.wire.WireError(f"unknown marker {tag!r}")

    def _refuse(self, value):
        raise self.wire.WireError(f"a {type(value).__name__} is not data")

    def _is_primitive(self, value):
        """Attributes that are values (numbers, shapes) cross as data; anything
        else, tensors included, stays here so that methods can mutate it."""
        import numpy as np

        if value is None or isinstance(value, (bool, int, float, str, complex, np.generic, np.dtype)):
            return True
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, (torch.Size, torch.dtype)):
            return True
        return type(value) is tuple and all(self._is_primitive(v) for v in value)

    # ------------------------------------------------------------ requests
    def run_cell(self, header, blobs):
        with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
            # With history each cell gets its own name in linecache, which
            # Triton's interpreter needs to read a kernel's source.
            result = self.shell.run_cell(header["source"], store_history=True)
        failed = result.error_before_exec or result.error_in_exec
        reply = {"kind": "ran", "stdout": _clip(out.getvalue()), "stderr": _clip(err.getvalue())}
        if failed is not None:
            reply["error"] = _exception(failed)
        return reply, []

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

            from coursekit.memory import traced_peak
            traced_peak(lambda: np.ones(4) + 1)
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
        torch = sys.modules.get("torch")
        if torch is not None and "handle" in header["target"]:
            grad_off = torch.no_grad()  # methods of returned objects, e.g. a layer's weight.copy_()
        with warnings.catch_warnings(), grad_off, \
                contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            value = target(*args, **kwargs)
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
            handler = {"run_cell": self.run_cell, "names": self.names, "call": self.call,
                       "getattr": self.getattr}.get(header.get("kind"))
            try:
                if handler is None:
                    raise ValueError(f"unknown request {header.get('kind')!r}")
                reply, out_blobs = handler(header, blobs)
            except BaseException as exc:  # the student's error (or SystemExit) is the answer
                reply, out_blobs = {"kind": "error", "error": _exception(exc)}, []
            try:
                self.channel.send(reply, out_blobs)
            except (self.wire.WireError, TypeError, ValueError) as exc:  # e.g. a NaN hidden in a dict
                self.channel.send({"kind": "error", "error": _exception(exc)})


# Loaded before the switch to an unprivileged user: the Python installation
# may live where that user cannot read (a root-only home), and these are what
# the course's notebooks and the grader's measuring helpers import.
PRELOAD = [
    "abc", "ast", "bdb", "bisect", "inspect", "linecache", "pdb", "tokenize", "traceback", "cmath", "collections", "contextlib", "copy", "dataclasses", "decimal", "enum",
    "fractions", "functools", "heapq", "itertools", "json", "math", "numbers", "operator", "random", "re",
    "statistics", "string", "textwrap", "time", "typing", "warnings",
    "numpy", "numpy.linalg", "numpy.random", "numpy.fft",
    "torch", "torch.nn", "torch.nn.functional", "torch.utils._python_dispatch", "torch.utils.flop_counter",
    "matplotlib", "matplotlib.pyplot",
    "student_runtime.calls", "student_runtime.probes", "coursekit.memory", "coursekit.torch_memory",
    "coursekit.triton_env",
]
# Importing Triton does not touch the GPU, so this template can still fork
# children that start CUDA themselves. coursekit.kernel_replay notes, as it is
# imported, the libraries a replay of kernels runs through: before any student code.
PRELOAD_TRITON = ["triton", "triton.language", "coursekit.triton_trace", "coursekit.kernel_replay"]


def _preload():
    for name in PRELOAD + PRELOAD_TRITON:
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
    every process of its user id (as root), its folder, and /dev/shm."""
    import shutil
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
    shutil.rmtree(request["home"], ignore_errors=True)
    if os.path.isdir("/dev/shm") and request.get("isolated"):
        for entry in os.listdir("/dev/shm"):
            with contextlib.suppress(OSError):
                path = os.path.join("/dev/shm", entry)
                shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)


def _sightings(fd):
    """The audit lines a student process has written so far."""
    import json

    data = b""
    while fd is not None and len(data) < 2**20:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        data += chunk
    events = []
    for line in data.decode(errors="replace").splitlines()[:200]:
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict):
                events.append({k: str(event.get(k, ""))[:300] for k in ("what", "detail", "cell")})
    return events


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


def zygote(control_fd):
    """A process with the libraries loaded that forks one student process per
    request: each starts in a fraction of a second instead of importing
    PyTorch again. It also reaps them and reports how each ended."""
    import json
    import select
    import socket
    import time

    control = socket.socket(fileno=control_fd)
    server = Server(None)
    _preload()
    server.warm_up()
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

    def reply(message, fds=()):
        socket.send_fds(control, [json.dumps(message).encode() + b"\n"], list(fds))

    audits = {}  # student pid -> read end of its audit pipe
    reply({"ready": os.getpid()})
    buffer = b""
    while True:
        ready, _, _ = select.select([control], [], [], 0.2)
        reap()
        if not ready:
            continue
        data = control.recv(65536)
        if not data:
            os._exit(0)  # the grader is gone; its student processes end when their channels close
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
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
                        for fd in audits.values():
                            os.close(fd)
                        _student_process(server, request, theirs, report)
                    finally:
                        os._exit(0)
                os.close(report)
                os.set_blocking(sightings, False)
                audits[pid] = sightings
                theirs.close()
                reply({"pid": pid}, [ours.fileno()])
                ours.close()
            elif request["op"] == "audit":
                reply({"events": _sightings(audits.get(request["pid"]))})
            elif request["op"] == "sweep":
                with contextlib.suppress(OSError, TypeError):
                    os.close(audits.pop(request["pid"], None))
                _sweep(request)
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
    zygote(int(sys.argv[1]))


if __name__ == "__main__":
    main()
