"""The memory of a student's processes as the kernel counts it.

Each student process is put, before any of its code runs, into a memory
cgroup of its own; whatever it starts later (threads, forked children, a
process started through ctypes) is born there too, and the cgroup is charged
for every page they touch: NumPy's and PyTorch's buffers, memory mappings,
files written to the memory-backed /tmp. Nothing in the student's process can
change what the kernel counts.

A measured call reads the growth of that charge over the call:

* cgroup v2 (the unified hierarchy with the memory controller): the student's
  processes move into a fresh child cgroup for the call, whose `memory.peak`
  then holds the call's peak (charges already made stay where they were);
* cgroup v1 (the memory controller mounted on its own): `memory.max_usage_in_bytes`
  is reset to the current usage before the call and read after it.

A call can also write, without a new charge, memory charged before it that
other processes or files share: files in /tmp and /dev/shm, shared mappings,
memory file descriptors. `shared()` is how much of it the student's processes
hold (the cgroup's `shmem`), which a measured call is charged with as well.

Where neither can be made (no root, a read-only /sys/fs/cgroup, as in some
containers) `create` returns None and says why; autograde.memory then falls
back to what /proc shows, which is coarser (see the instructors' guide)."""
import atexit
import contextlib
import itertools
import os
import time

ROOT = "/sys/fs/cgroup"
PREFIX = "attention-grader"
_SERIAL = itertools.count()
_MADE = []  # folders this process made, removed when it ends


def _read(path):
    with open(path) as fh:
        return fh.read()


def _write(path, text):
    with open(path, "w") as fh:
        fh.write(text)


def _own_path(controller):
    """This process's cgroup path for a v1 controller, or ('' for) v2's."""
    for line in _read("/proc/self/cgroup").splitlines():
        _, names, path = line.split(":", 2)
        if (controller is None and names == "") or (controller is not None and controller in names.split(",")):
            return path
    return None


def _v1_root():
    folder = os.path.join(ROOT, "memory")
    return folder if os.path.exists(os.path.join(folder, "memory.max_usage_in_bytes")) else None


def _v2_root():
    for folder in (ROOT, os.path.join(ROOT, "unified")):
        try:
            if "memory" in _read(os.path.join(folder, "cgroup.controllers")).split():
                return folder
        except OSError:
            continue
    return None


def _remove(folder):
    """rmdir, after the processes in it have ended (the kernel needs a moment)."""
    for _ in range(50):
        try:
            os.rmdir(folder)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.02)
    return False


@atexit.register
def _remove_all():
    for folder in reversed(_MADE):
        with contextlib.suppress(OSError):
            for child in os.listdir(folder):
                if os.path.isdir(os.path.join(folder, child)):
                    _remove(os.path.join(folder, child))
        _remove(folder)


def _stat(folder, name):
    """A field of the folder's memory.stat in bytes (0 if absent)."""
    for line in _read(os.path.join(folder, "memory.stat")).splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return int(value)
    return 0


def _procs(folder):
    try:
        return [int(p) for p in _read(os.path.join(folder, "cgroup.procs")).split()]
    except (OSError, ValueError):
        return []


def _move_all(source, target):
    """Move every process of `source` into `target`, again until none is left
    (one may fork while the others move)."""
    for _ in range(100):
        pids = _procs(source)
        if not pids:
            return True
        for pid in pids:
            with contextlib.suppress(OSError):
                _write(os.path.join(target, "cgroup.procs"), str(pid))
    return not _procs(source)


class _V1:
    kind = "cgroup v1"

    def __init__(self, folder):
        self.folder = folder
        self.before = 0

    def add(self, pid):
        _write(os.path.join(self.folder, "cgroup.procs"), str(pid))

    def begin(self):
        self.before = int(_read(os.path.join(self.folder, "memory.usage_in_bytes")))
        _write(os.path.join(self.folder, "memory.max_usage_in_bytes"), "0")  # restarts the peak from now

    def end(self):
        return max(int(_read(os.path.join(self.folder, "memory.max_usage_in_bytes"))) - self.before, 0)

    def shared(self):
        return _stat(self.folder, "shmem")

    def close(self):
        _remove(self.folder)


class _V2:
    """v2 lets only leaves hold processes: `idle` between calls, `call` during one."""
    kind = "cgroup v2"

    def __init__(self, folder):
        self.folder = folder
        _write(os.path.join(folder, "cgroup.subtree_control"), "+memory")
        self.idle = os.path.join(folder, "idle")
        os.mkdir(self.idle)
        self.call = None

    def add(self, pid):
        _write(os.path.join(self.idle, "cgroup.procs"), str(pid))

    def begin(self):
        self.call = os.path.join(self.folder, f"call-{next(_SERIAL)}")
        os.mkdir(self.call)
        if not _move_all(self.idle, self.call):
            raise OSError("the student's processes could not be moved for a measured call")

    def end(self):
        try:
            return int(_read(os.path.join(self.call, "memory.peak")))
        finally:
            _move_all(self.call, self.idle)
            _remove(self.call)
            self.call = None

    def shared(self):
        return _stat(self.folder, "shmem")  # v2's memory.stat counts the folder's children too

    def close(self):
        for leaf in (self.call, self.idle):
            if leaf:
                _remove(leaf)
        _remove(self.folder)


def _parent(root, own):
    """Our folder for student cgroups, under this process's own cgroup."""
    parent = os.path.join(root, own.lstrip("/"), f"{PREFIX}-{os.getpid()}")
    if not os.path.isdir(parent):
        os.mkdir(parent)
        _MADE.append(parent)
    return parent


def unavailable():
    """None when student processes can be measured by cgroup here, else why not."""
    meter, why = create()
    if meter is not None:
        meter.close()
    return why


def create():
    """(meter, None) for a new, empty memory cgroup of this machine's kind, or
    (None, why) where none can be made."""
    reasons = []
    v2 = _v2_root()
    if v2 is not None:
        try:
            own = _own_path(None) or "/"
            parent = _parent(v2, own)
            if "memory" not in _read(os.path.join(parent, "cgroup.controllers")).split():
                _write(os.path.join(v2, own.lstrip("/"), "cgroup.subtree_control"), "+memory")
                _write(os.path.join(parent, "cgroup.subtree_control"), "+memory")
            folder = os.path.join(parent, f"student-{next(_SERIAL)}")
            os.mkdir(folder)
            return _V2(folder), None
        except OSError as exc:
            reasons.append(f"cgroup v2 at {v2}: {exc.strerror or exc}")
    v1 = _v1_root()
    if v1 is not None:
        try:
            parent = _parent(v1, _own_path("memory") or "/")
            folder = os.path.join(parent, f"student-{next(_SERIAL)}")
            os.mkdir(folder)
            return _V1(folder), None
        except OSError as exc:
            reasons.append(f"cgroup v1 at {v1}: {exc.strerror or exc}")
    if not reasons:
        reasons.append(f"no memory cgroup controller is mounted under {ROOT}")
    return None, "; ".join(reasons)


__all__ = ["create", "unavailable"]
