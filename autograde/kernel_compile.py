"""Compiling a student's Triton kernels for real GPUs, without one.

A kernel that runs in Triton's interpreter may still not compile: NumPy or a
plain Python function called inside @triton.jit runs on the interpreter's NumPy
arrays, and the GPU compiler rejects it. The kernels' launches are recorded in
the student's process without running them (student_runtime.probes.launched_kernels):
one launch per kernel, as plain data (its source, the globals it reads, the
launch's specialisation). Rebuilding a kernel from its source runs the student's
code, so the compiling processes (coursekit.compile_worker, started by
coursekit.compile_report) run as student code does, in a jail of their own
(autograde.sandbox.jailed_python), never in the grader. What they report is
not believed: coursekit.binary_report, in a process of the grader's that runs
no student code, checks their PTX and makes and reads the binary.

Kernels are compiled once per grading process: what compiled is kept on disk
(COURSEKIT_COMPILE_CACHE, or a folder of this process) under the kernel's source
and specialisation, so that identical kernels (a class's shared starting code,
the planted submissions of the tests) compile once."""
import atexit
import os
import shutil
import tempfile

from autograde.sandbox import find_remote, jailed_python
from coursekit.compile_report import CACHE_ENV, compile_described

TARGETS = ("A100", "H100")       # sm_80 and sm_90: the GPUs a course on FlashAttention is run on
TIMEOUT_S = 300                  # one kernel for one target; the compiler and ptxas take seconds
_BOOT = "from coursekit.compile_worker import main; main()"


_CACHE = None


def _cache_dir():
    global _CACHE
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    if _CACHE is None:
        _CACHE = tempfile.mkdtemp(prefix="grader-compiled-")
        atexit.register(shutil.rmtree, _CACHE, True)
    return _CACHE


def compile_kernels(owner, kernels, targets=TARGETS):
    """A tuple of coursekit.compile_report.TargetReports per kernel (plain data from
    launched_kernels), compiled in jailed processes as the user of the student
    whose object `owner` is."""
    remote = find_remote([owner])
    uid = remote._sandbox.uid if remote is not None else None
    return compile_described(kernels, targets, cache_dir=_cache_dir(), timeout=TIMEOUT_S,
                             command=lambda workdir: jailed_python(_BOOT, uid))
