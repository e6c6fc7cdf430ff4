"""The grader's measure of the peak memory of a student's call.

A student's function is measured twice. Inside its process, by tracemalloc
and PyTorch's dispatcher (student_runtime.probes.inside_peak), which explains
a small peak to the byte but which the student's code could patch. Then
outside it, by the kernel (autograde.cgroups, through Sandbox.measured_call),
in a second call: the growth of the charge of the process's memory cgroup,
which counts every page that the process, its threads and its children touch
for the first time, memory mappings and files written to /tmp included, and
the pages of memory allocated before the call (a buffer kept from a cell,
memory the allocator reuses) that the call writes; plus the memory that the
student's files and shared mappings held as the call began (/tmp is memory,
and a call can write a file or a shared mapping again without a new charge
or a copy). The answer is the larger figure, so nothing the student's code
does makes a peak smaller than what the kernel counted; a kernel count well
above the inside one is reported, and files cost only the memory they take.

Without a cgroup (see autograde.cgroups) the kernel's count is replaced by
the growth of the process's resident set and the pages it touched (/proc),
which see threads, children and reused memory only above OUTSIDE_SLACK_BYTES,
and files and shared memory are read from outside as well (the used blocks of
the private /tmp and /dev/shm, the process's shared pages and memory file
descriptors) and added to the inside count: grading says so, and the
instructors' guide says what that leaves unseen."""
import os
from typing import NamedTuple

from coursekit.memory import traced_peak as _traced_peak_here

# What the kernel may count beyond what a call allocates without a hidden
# allocation: charges come in batches of 64 pages on each CPU the call runs on,
# the allocator keeps headers and whole pages (a few percent of large peaks),
# and the interpreter touches pages of its own (its rewrites are scattered
# pages, which the rewritten count leaves out). Correct calls of a few hundred
# KiB have been charged a MiB more on a busy machine of two CPUs; a strip of P
# or an n x n matrix hidden from the process is several times the slack at the
# sizes the checks use.
SLACK_BYTES = 2 * 2**20
SLACK_FRACTION = 1 / 8
# What a budget judged on these peaks leaves above what correct code allocates,
# in any loop order: the kernel's count of a correct call can pass its slack (on
# more CPUs, or with a 2 MiB transparent huge page), and is then the figure
# judged. Each check picks sizes at which the mistakes it looks for (a strip of
# P, an n x n matrix) lie at least this far above its budget as well.
GRANULARITY_BYTES = 3 * 2**20


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


class Peak(NamedTuple):
    found: int   # what the checks judge: the inside figure, or a larger one counted outside the process
    inside: int  # what tracemalloc (and PyTorch's dispatcher) saw in the student's process


def traced_peak(fn, *args, **kwargs):
    """(result, peak bytes allocated during fn(*args, **kwargs)), measured as
    described above when a student object is among the arguments (here, with
    coursekit.memory.traced_peak, otherwise)."""
    result, peak = traced_peaks(fn, *args, **kwargs)
    return result, peak.found


def traced_peaks(fn, *args, **kwargs):
    """(result, Peak): the peak as traced_peak finds it, and the figure seen
    inside the process, exact to the byte for small peaks (a check of how a
    peak grows with n between sizes below GRANULARITY_BYTES needs it)."""
    from student_runtime.probes import inside_peak

    return measured_peak(inside_peak, fn, args, kwargs)


def numpy_peak(fn, *args):
    """The same, with NumPy's allocations only seen inside the process (what
    the notebooks' peak_bytes measures, and quicker for code that runs many
    small PyTorch operators); the kernel's count sees everything."""
    from student_runtime.probes import inside_numpy_peak

    result, peak = measured_peak(inside_numpy_peak, fn, args, {})
    return result, peak.found


def measured_peak(inside_probe, fn, args, kwargs):
    """(result, Peak) of fn(*args, **kwargs), measured as described above."""
    from autograde.sandbox import find_remote, in_student_process

    remote = find_remote([fn, *args, *kwargs.values()])
    if remote is None:
        return _measured_here(fn, *args, **kwargs)
    sandbox = remote._sandbox
    if sandbox.meter is None:
        return _from_proc(sandbox, inside_probe, fn, *args, **kwargs)
    _, inside = in_student_process(inside_probe, fn, *args, **kwargs)
    inside = _number(inside)
    result, measured = sandbox.measured_call(fn, args, kwargs)
    if measured is None:  # the cgroup went away with a restarted process
        return result, Peak(inside, inside)
    found = inside
    charged = measured.new + measured.shared
    if charged > inside + _slack(inside):
        _report(sandbox, charged, inside, _charged_how(measured.shared))
        found = charged
    if measured.rewritten > found + _slack(found):
        _report(sandbox, measured.rewritten, inside, "the call wrote memory allocated before it:")
        found = measured.rewritten
    return result, Peak(found, inside)


def _measured_here(fn, *args, **kwargs):
    """In this process (an instructor's shell, the in-process tests): tracemalloc
    and PyTorch's dispatcher, and the growth of this process's peak resident set
    over the call less the code it loaded (files mapped), which also sees memory
    maps and threads when it passes the slack."""
    from coursekit.torch_memory import warm_up

    warm_up()  # PyTorch's first use loads it: not the call's memory
    pid = os.getpid()
    start = _resident(pid, "VmRSS") if _reset_peak(pid) else None
    result, inside = _traced_peak_here(fn, *args, **kwargs)
    end = _resident(pid, "VmHWM") if start else None
    grown = end[0] - start[0] - max(end[1] - start[1], 0) if start and end else 0
    return result, Peak(grown if grown > inside + _slack(inside) else inside, inside)


def _resident(pid, field):
    """(bytes resident by `field`, VmRSS now or VmHWM at its peak; bytes of files
    mapped now, such as code loaded), or None where /proc does not say."""
    found = _status(pid, field), _status(pid, "RssFile")
    return None if None in found else found


def _charged_how(shared):
    if shared < SLACK_BYTES:
        return "the kernel charged the student's processes"
    return (f"the student's files and shared memory held {shared / 2**20:.1f} MiB as the call began (a call can "
            "write them again without a new charge); with what the kernel charged the student's processes, in all")


_FILES_HOW = ("the student's files and shared memory held {:.1f} MiB around the call (a call can write them "
              "without a new charge); with what the process allocated, in all")


def _from_proc(sandbox, inside_probe, fn, *args, **kwargs):
    """Without a cgroup: the inside measurement plus the files and shared
    memory the student holds (before or after the call, whichever is more),
    checked against the resident set and the pages the call touched as /proc
    shows them."""
    from autograde.sandbox import in_student_process

    pid = sandbox.host
    shared_before = _shared_from_proc(sandbox)
    before = _status(pid, "VmRSS") if pid and _reset_peak(pid) else None
    result, inside = in_student_process(inside_probe, fn, *args, **kwargs)
    inside = _number(inside)
    peak = _status(pid, "VmHWM") if before is not None else None
    touched = _touched_writable(pid) if before is not None else None
    shared = max(shared_before, _shared_from_proc(sandbox))
    found = inside
    if shared > _slack(inside):
        _report(sandbox, inside + shared, inside, _FILES_HOW.format(shared / 2**20))
        found = inside + shared
    if peak is None:
        return result, Peak(found, inside)
    outside = max(peak - before, touched or 0)
    if outside > 2 * inside + OUTSIDE_SLACK_BYTES and outside > found:
        _report(sandbox, outside, inside, "the process grew by or touched")
        found = outside
    return result, Peak(found, inside)


def _shared_from_proc(sandbox):
    """Without a cgroup: what the files in the student's private /tmp and /dev/shm
    take (statvfs, Sandbox.files_bytes), the shared pages its process has mapped
    (anonymous shared mappings, memory file descriptors: RssShmem), and the memory
    file descriptors it holds without mapping them. A file it has mapped counts
    twice: the estimate may count too much, never too little."""
    pid = sandbox.host
    return (sandbox.files_bytes() or 0) + (_status(pid, "RssShmem") or 0) + _memfd_bytes(pid)


def _memfd_bytes(pid):
    """Bytes held by the memory file descriptors (os.memfd_create) open in the process."""
    total = 0
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    for fd in fds:
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if os.readlink(path).startswith("/memfd:"):
                total += os.stat(path).st_blocks * 512
        except OSError:
            continue
    return total
