"""What a student's process does that a notebook has no reason to do, seen by
a Python audit hook (sys.addaudithook) installed before any student code
runs; Python code cannot remove it. Each sighting is written as one JSON line
to a pipe whose other end the sandbox's template process holds, so what was
written cannot be taken back. The grader turns the lines into entries of the
integrity report; nothing here changes a score."""
import json
import os
import sys

INSTRUCTOR_PACKAGES = {"autograde", "solutions"}
PROCESS_EVENTS = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                  "os.forkpty", "pty.spawn"}
NETWORK_EVENTS = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"}
NATIVE_EVENTS = {"ctypes.dlopen", "ctypes.dlsym", "ctypes.addressof", "ctypes.cdata", "ctypes.string_at",
                 "ctypes.wstring_at", "ctypes.call_function"}
LIMIT = 200  # sightings written per process; past that the report is long enough


def install(fd, home, readable):
    """Start reporting to `fd`. `home` is the student's folder; files under
    `readable` (the Python installation, the system's libraries) are what
    any import reads."""
    written = [0]
    allowed = tuple(os.path.join(os.path.abspath(p), "") for p in (home, *readable))

    def student_cell():
        """The student's cell on the stack, if any: '<ipython-input-N-...>' names it."""
        frame = sys._getframe(2)
        while frame is not None:
            name = frame.f_code.co_filename
            if name.startswith("<ipython-input-"):
                return f"cell run {name.split('-')[2]}"
            frame = frame.f_back
        return None

    def report(what, detail):
        if written[0] >= LIMIT:
            return
        written[0] += 1
        line = json.dumps({"what": what, "detail": str(detail)[:300], "cell": student_cell() or ""}) + "\n"
        try:
            os.write(fd, line.encode())
        except OSError:
            pass

    def hook(event, args):
        if event == "import":
            if str(args[0]).split(".")[0] in INSTRUCTOR_PACKAGES:
                report("imports the instructor's package", args[0])
        elif event == "open":
            path = args[0]
            if isinstance(path, bytes):
                path = os.fsdecode(path)
            if isinstance(path, str) and not os.path.abspath(path).startswith(allowed):
                report("opens a file outside its folder", path)
        elif event in PROCESS_EVENTS:
            report("starts a process", event)
        elif event in NETWORK_EVENTS:
            report("uses the network", f"{event} {args[1:2]}")
        elif event in NATIVE_EVENTS:
            if student_cell():
                report("calls native code (ctypes)", event)
        elif event == "sys.addaudithook":
            report("adds an audit hook", "")

    sys.addaudithook(hook)
    sys.meta_path.insert(0, _ImportWatcher(report))  # importlib.import_module raises no audit event


class _ImportWatcher:
    """A finder that finds nothing and reports searches for the instructor's packages."""

    def __init__(self, report):
        self.report = report

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in INSTRUCTOR_PACKAGES:
            self.report("imports the instructor's package", name)
        return None
