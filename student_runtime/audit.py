"""What a student's process does that a notebook has no reason to do, seen by
a Python audit hook (sys.addaudithook) installed before any student code
runs; Python code cannot remove it. Each sighting is written as one JSON line
to a pipe whose other end the sandbox's template process holds and reads as
it comes, so what was written cannot be taken back. The grader turns the
lines into entries of the integrity report, and reads some of them (REPORTED,
raised by the grader's own code in this process) around each graded call: a
call during which the grader's helpers were changed, PyTorch was reached for
in a process that has none, or PyTorch's attention layers ran, is judged by
that. The hook keeps its own references to what it uses, so rebinding
os.write or json.dumps afterwards does not silence it."""
import json
import os
import sys

INSTRUCTOR_PACKAGES = {"autograde", "solutions"}
GRADER_SIDE = {"student_runtime", "coursekit"}  # the grader's helpers loaded in this process
PROCESS_EVENTS = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                  "os.forkpty", "pty.spawn"}
NETWORK_EVENTS = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"}
NATIVE_EVENTS = {"ctypes.dlopen", "ctypes.dlsym", "ctypes.addressof", "ctypes.cdata", "ctypes.string_at",
                 "ctypes.wstring_at", "ctypes.call_function"}
# Raised with sys.audit(REPORTED, what, detail) by the grader's code in this
# process (student_runtime.server, .torchless, .layers); never limited in number.
REPORTED = "student_runtime.report"
LIMIT = 200  # sightings of each other kind written per process; past that the report is long enough


def install(fd, home, readable):
    """Start reporting to `fd`. `home` is the student's folder (and /tmp is
    theirs too); files under `readable` (the Python installation, the system's
    libraries) are what any import reads."""
    written = {}
    allowed = tuple(os.path.join(os.path.abspath(p), "") for p in (home, *readable))
    write, dumps, abspath, fsdecode, getframe = os.write, json.dumps, os.path.abspath, os.fsdecode, sys._getframe
    exists, dirname = os.path.lexists, os.path.dirname

    def outside(path, args):
        """Outside the student's folders: /tmp is theirs, but a file there that
        is read before anything wrote it, or written in a folder nothing made,
        is a path of another machine."""
        path = abspath(path)
        if path.startswith(allowed):
            return False
        if not path.startswith("/tmp/") or exists(path):
            return not path.startswith("/tmp/")
        return not _writes(args) or not exists(dirname(path))

    def student_cell():
        """The student's cell on the stack, if any: '<ipython-input-N-...>' names it."""
        frame = getframe(2)
        while frame is not None:
            name = frame.f_code.co_filename
            if name.startswith("<ipython-input-"):
                return f"cell run {name.split('-')[2]}"
            frame = frame.f_back
        return None

    def report(what, detail, limited=True):
        if limited:
            if written.get(what, 0) >= LIMIT:
                return
            written[what] = written.get(what, 0) + 1
        line = dumps({"what": what, "detail": str(detail)[:300], "cell": student_cell() or ""}) + "\n"
        data = line.encode()
        while data:  # blocking: the template reads the pipe as it fills, so nothing is dropped
            try:
                data = data[write(fd, data):]
            except InterruptedError:
                continue
            except OSError:
                return

    def hook(event, args):
        if event == REPORTED:
            report(str(args[0]), args[1] if len(args) > 1 else "", limited=False)
        elif event == "import":
            if str(args[0]).split(".")[0] in INSTRUCTOR_PACKAGES:
                report("imports the instructor's package", args[0])
        elif event == "open":
            path = args[0]
            if isinstance(path, bytes):
                path = fsdecode(path)
            if isinstance(path, str) and outside(path, args):
                report("opens a file outside its folder", path)
        elif event in PROCESS_EVENTS:
            if event != "os.fork" or student_cell():  # the server forks to hold memory for a measurement
                report("starts a process", event)
        elif event in NETWORK_EVENTS:
            report("uses the network", f"{event} {args[1:2]}")
        elif event in NATIVE_EVENTS:
            if student_cell():
                report("calls native code (ctypes)", event)
        elif event == "object.__setattr__":
            _changes_code(report, student_cell, args)
        elif event == "sys.addaudithook":
            report("adds an audit hook", "")

    sys.addaudithook(hook)
    sys.meta_path.insert(0, _ImportWatcher(report))  # importlib.import_module raises no audit event


def _changes_code(report, student_cell, args):
    """By the student's code: a function's code replaced, or an attribute set
    on a class of the grader's helpers. (Libraries patch their own classes as
    they run, Triton's interpreter at every launch: those are not reported.)"""
    obj, name = args[0], args[1]
    if name == "__code__" and student_cell():
        report("replaces the code of a function", getattr(obj, "__qualname__", "?"))
    elif isinstance(obj, type) and str(getattr(obj, "__module__", "")).split(".")[0] in GRADER_SIDE \
            and student_cell():
        report("rebinds an attribute of the grader's helpers", f"{obj.__module__}.{obj.__qualname__}.{name}")


def _writes(args):
    """Whether an open() audit event's mode or flags ask to write."""
    mode, flags = (args[1] if len(args) > 1 else None), (args[2] if len(args) > 2 else 0)
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC))


class _ImportWatcher:
    """A finder that finds nothing and reports searches for the instructor's packages."""

    def __init__(self, report):
        self.report = report

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in INSTRUCTOR_PACKAGES:
            self.report("imports the instructor's package", name)
        return None
