"""The grader's measure of the peak memory of a student's call.

A student's function is measured twice. Inside its process, by tracemalloc
and PyTorch's dispatcher (student_runtime.probes.inside_peak), which explains
a small peak to the byte but which the student's code could patch. Then
outside it, by the kernel (autograde.cgroups, through Sandbox.measured_call),
in a second call: the growth of the charge of the process's memory cgroup,
which counts every page that the process, its threads and its children touch
for the first time, memory mappings and files written to /tmp included, and
the pages of memory allocated before the call (a buffer kept from a cell,
memory the allocator reuses) that the call writes. The answer is the larger
figure, so nothing the student's code does makes a peak smaller than what
the kernel counted; a kernel count well above the inside one is reported.

Without a cgroup (see autograde.cgroups) the kernel's count is replaced by
the growth of the process's resident set and the pages it touched (/proc),
which see threads, children and reused memory only above OUTSIDE_SLACK_BYTES:
grading says so, and the instructors' guide says what that leaves unseen."""
from coursekit.memory import traced_peak as _traced_peak_here
from student_runtime.audit import WRITES_FILE

# What the kernel may count beyond what a call allocates without a hidden
# allocation: charges come in batches of pages per CPU, the allocator keeps
# headers and whole pages (a few percent of large peaks), and the interpreter
# touches pages of its own (its rewrites are scattered pages, which the
# rewritten count leaves out). A strip of 64 x 4096 float64 scores (2 MiB, the
# smallest the checks look for) is well above it at the sizes checked.
SLACK_BYTES = 768 * 2**10
SLACK_FRACTION = 1 / 8


def _slack(inside):
    return SLACK_BYTES + int(inside * SLACK_FRACTION)
# The coarser measurements from /proc (resident set, pages touched) see the
# interpreter and the allocator at work too; only more than this is reported.
OUTSIDE_SLACK_BYTES = 48 * 2**20
INSIDE = "student_runtime.probes:inside_peak"


def _status(pid, field):
    """A field of /proc/<pid>/status in bytes (VmRSS, VmHWM), or None."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_peak(pid):
    """Start the process's peak resident set (VmHWM) again from its current
    size, and clear the accessed bits of its pages, so that both count from here."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as fh:
            fh.write("5")
        with open(f"/proc/{pid}/clear_refs", "w") as fh:
            fh.write("1")
        return True
    except OSError:
        return False


def _touched_writable(pid):
    """Bytes of the process's writable memory read or written since the
    accessed bits were cleared. A buffer allocated and touched before the
    measured call adds nothing to the resident set during it, but using it
    during the call sets its pages' accessed bits."""
    total, writable = 0, False
    try:
        with open(f"/proc/{pid}/smaps") as fh:
            for line in fh:
                head = line.split(None, 2)
                if "-" in head[0] and not head[0].endswith(":"):  # a mapping's header: range perms ...
                    writable = len(head) > 1 and "w" in head[1]
                elif writable and head[0] == "Referenced:":
                    total += int(head[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return total


def _report(sandbox, outside, inside, how):
    sandbox.sightings.append({"what": "memory measurements disagree", "cell": "",
                              "detail": f"{how} {outside / 2**20:.1f} MiB during a measured call; inside the "
                                        f"process {inside / 2**20:.1f} MiB were seen"})


def _number(value):
    """A byte count from the student's process, or 0 if it is not one (the
    measurement inside was tampered with; the kernel's stands)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def traced_peak(fn, *args, **kwargs):
    """(result, peak bytes allocated during fn(*args, **kwargs)), measured as
    described above when a student object is among the arguments (here, with
    coursekit.memory.traced_peak, otherwise)."""
    from student_runtime.probes import inside_peak

    return measured_peak(inside_peak, fn, args, kwargs)


def numpy_peak(fn, *args):
    """The same, with NumPy's allocations only seen inside the process (what
    the notebooks' peak_bytes measures, and quicker for code that runs many
    small PyTorch operators); the kernel's count sees everything."""
    from student_runtime.probes import inside_numpy_peak

    return measured_peak(inside_numpy_peak, fn, args, {})


def measured_peak(inside_probe, fn, args, kwargs):
    from autograde.sandbox import find_remote, forfeit, in_student_process

    remote = find_remote([fn, *args, *kwargs.values()])
    if remote is None:
        return _traced_peak_here(fn, *args, **kwargs)
    sandbox = remote._sandbox
    if sandbox.meter is None:
        return _from_proc(sandbox, inside_probe, fn, *args, **kwargs)
    _, inside = in_student_process(inside_probe, fn, *args, **kwargs)
    inside = _number(inside)
    sandbox.drain()
    result, measured = sandbox.measured_call(fn, args, kwargs)
    files = [e.get("detail", "") for e in sandbox.drain() if e.get("what") == WRITES_FILE]
    if files:
        forfeit(remote, "writes or maps a file during a measured call",
                f"{files[0]}: memory held in files (/tmp is memory) can be used again unseen by the measurement")
    if measured is None:  # the cgroup went away with a restarted process
        return result, inside
    new, rewritten = measured
    found = inside
    if new > inside + _slack(inside):
        _report(sandbox, new, inside, "the kernel charged the student's processes")
        found = new
    if rewritten > found + _slack(found):
        _report(sandbox, rewritten, inside, "the call wrote memory allocated before it:")
        found = rewritten
    return result, found


def _from_proc(sandbox, inside_probe, fn, *args, **kwargs):
    """Without a cgroup: the inside measurement, checked against the resident
    set and the pages the call touched as /proc shows them."""
    from autograde.sandbox import in_student_process

    pid = sandbox.host
    before = _status(pid, "VmRSS") if pid and _reset_peak(pid) else None
    result, inside = in_student_process(inside_probe, fn, *args, **kwargs)
    inside = _number(inside)
    peak = _status(pid, "VmHWM") if before is not None else None
    touched = _touched_writable(pid) if before is not None else None
    if peak is None:
        return result, inside
    outside = max(peak - before, touched or 0)
    if outside > 2 * inside + OUTSIDE_SLACK_BYTES:
        _report(sandbox, outside, inside, "the process grew by or touched")
        return result, outside
    return result, inside
