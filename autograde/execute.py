"""Execute one (normalized) notebook for grading.

The student's cells run in a sandboxed process (autograde.sandbox). The test
cells, whose source comes from the instructor's notebook, run here in the
grader's process, where the student's functions are proxies: whatever the
student's code does to its own process (patching numpy.allclose, returning an
object whose == is always True, installing input transformers), the checks and
their comparisons run in a process it never touched, on plain data.

The exercises that a chapter grades as NumPy code (NUMPY_GRADED in its
checks module) are graded by the hidden tests in a second student process in
which PyTorch does not exist: it runs the same cells, and the hidden test
cells call those functions there. Visible tests call the first process, as
the student's own Jupyter did.

A test cell earns nothing when an integrity check on a function it calls
failed (autograde.sandbox.forfeit, from this cell or another), or when the
grader's helpers in the student's process were changed while it ran.

The result is the notebook with outputs (test cells: this process's output or
the check's error), so nbgrader's own scoring, gradebook and feedback follow."""
import builtins
import contextlib
import importlib
import io
import linecache
import re
import time
import traceback
import warnings
from dataclasses import dataclass, field

import nbformat

from autograde import draws
from autograde.sandbox import EnvironmentFailure, Remote, Sandbox, SandboxLost, student_function
from autograde.structure import is_test, nbgrader_of
from student_runtime.torchless import USE as TORCH_USE

HIDDEN_MARKER = "### BEGIN HIDDEN TESTS"
# Reports that the grader's helpers in the student's process were changed:
# the test cell during which one is made earns nothing.
TAMPERING = {"changes the grader's helpers in its process", "replaces the code of a function",
             "rebinds an attribute of the grader's helpers"}

MAX_RESTARTS = 20  # each costs at most a cell's time limit; the notebook's limit bounds them all

# A student's `len` or `print` must not replace the builtin that the grader's visible tests
# call: names the student defines are bound in the test namespace only where they are not builtins.
BUILTIN_NAMES = frozenset(vars(builtins))


@dataclass
class Execution:
    notebook: object
    scores: dict = field(default_factory=dict)  # grade_id -> (score, points)
    events: list = field(default_factory=list)  # (kind, cell, detail): crashes, time limits
    messages: dict = field(default_factory=dict)  # grade_id -> failure message
    sightings: list = field(default_factory=list)  # (what, cell, detail): the audit hook's, for the report only


def _nb(cell):
    meta = nbgrader_of(cell)
    return meta if isinstance(meta, dict) else {}


def is_test_cell(cell):
    return cell.cell_type == "code" and is_test(cell)


def is_setup_cell(cell):
    meta = _nb(cell)
    return cell.cell_type == "code" and bool(meta.get("locked")) and not meta.get("grade") \
        and not meta.get("solution")


def _stream(name, text):
    return nbformat.v4.new_output("stream", name=name, text=text)


def _error(ename, evalue, tb_lines):
    return nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=tb_lines)


def _not_run(reason):
    return _error("NotRun", reason, [f"NotRun: {reason}"])


def _measuring_setup_helpers(ns):
    """The notebooks' setup defines peak_bytes(fn, *args) (and Chapter 4's
    new_tensors(fn, *args)); measured here they would see only the proxy, so a
    student function is measured as the hidden tests measure it: in its own
    process, and peak memory by the kernel (autograde.memory)."""
    from autograde.memory import numpy_peak
    from autograde.sandbox import find_remote

    if callable(ns.get("peak_bytes")):
        local = ns["peak_bytes"]

        def peak_bytes(fn, *args):
            if find_remote([fn, *args]) is not None:
                return numpy_peak(fn, *args)[1]
            return local(fn, *args)
        ns["peak_bytes"] = peak_bytes
    if callable(ns.get("new_tensors")):   # Chapter 4: the tensors a launcher's PyTorch code makes
        local_new = ns["new_tensors"]

        def new_tensors(fn, *args, **kwargs):
            if find_remote([fn, *args, *kwargs.values()]) is not None:
                from autograde.sandbox import in_student_process
                from student_runtime import probes

                return tuple(in_student_process(probes.new_tensors_during, fn, list(args), dict(kwargs)))
            return local_new(fn, *args, **kwargs)
        ns["new_tensors"] = new_tensors


def numpy_graded(notebook):
    """Names of the functions that the notebook's hidden tests grade as NumPy
    code: NUMPY_GRADED of each checks module its test cells import."""
    names = set()
    for cell in notebook.cells:
        if is_test_cell(cell):
            for module in re.findall(r"\bautograde\.checks\.(\w+)", cell.source):
                names.update(getattr(importlib.import_module(f"autograde.checks.{module}"), "NUMPY_GRADED", ()))
    return names


class _NotInTorchless:
    """Stands for a NumPy-graded function that the process without PyTorch
    does not have: calling it fails with the reason."""

    def __init__(self, name, lost=None):
        self.name, self.lost = name, lost

    def __call__(self, *args, **kwargs):
        from autograde.compare import GradingFailure

        if self.lost:
            raise GradingFailure(f"{self.name} is graded as NumPy code, in a second process without PyTorch, and "
                                 f"{self.lost}.")
        raise GradingFailure(
            f"{self.name} is graded as NumPy code, in a process where PyTorch cannot be imported, and it is not "
            f"defined there: its cell stopped before `def {self.name}` (as a cell that needs PyTorch to run does). "
            "Compute with NumPy (or plain Python).")


def _failure_lines(exc):
    """The traceback a student needs: the test cell's own lines, then, when the
    error came from their function, where it happened in their code."""
    lines = ["Traceback (most recent call last):"]
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename.startswith("<"):  # the test cell, not the grader's machinery
            lines += [f'  File "{frame.filename}", line {frame.lineno}', f"    {frame.line}"]
    student = getattr(exc, "student_traceback", "")
    if student:
        ours = ("autograde/sandbox_server.py", "autograde/compare.py")
        kept = [ln for ln in student.splitlines() if ln.strip()]
        lines.append("In your code:")
        skip = False
        for ln in kept[1:]:
            if ln.startswith('  File "'):
                skip = any(part in ln for part in ours)
            if not skip:
                lines.append(ln)
    else:
        lines.append(f"{type(exc).__name__}: {exc}")
    return lines


class NotebookRun:
    def __init__(self, notebook, *, cell_timeout=120, notebook_timeout=1800, limits=None):
        self.nb = nbformat.from_dict(notebook)
        self.cell_timeout = cell_timeout
        self.deadline = time.monotonic() + notebook_timeout
        self.notebook_timeout = notebook_timeout
        self.sandbox = Sandbox(limits)
        self.numpy_names = numpy_graded(self.nb)
        # The second process, without PyTorch, for the NumPy-graded functions' hidden tests.
        self.torchless = Sandbox(limits, torchless=True) if self.numpy_names else None
        self.sandbox.twin = self.torchless
        self.ns = {"__name__": "__main__"}
        self.ran = []  # sources of student/setup cells that ran, replayed after a restart
        self.dead = None  # why nothing more can run
        self.torchless_dead = None  # why the process without PyTorch is gone
        self.restarts = 0
        self.result = Execution(notebook=self.nb)
        self.calls = {}  # test cell label -> names of the student functions it called
        self.flags = []  # sightings of this run's own judgement (tampering, PyTorch in a graded call)

    def _sandboxes(self):
        return [sb for sb in (self.sandbox, self.torchless) if sb is not None]

    # ------------------------------------------------------------ helpers
    def _time_left(self):
        return self.deadline - time.monotonic()

    def _cell_time(self):
        """Seconds the next cell (or call) may take: its own limit, within the notebook's."""
        return max(min(self.cell_timeout, self._time_left()), 1)

    def _event(self, kind, cell, detail):
        self.result.events.append((kind, cell, detail))

    def _recover(self, cell_id):
        """After the student's process was lost: a fresh one, with the cells so far."""
        failure = self._restore(self.sandbox, cell_id, "", "the student's process")
        if failure:
            self.dead = f"not run: {failure}"

    def _recover_torchless(self, cell_id):
        """The same for the process without PyTorch, whose losses count with the other's."""
        failure = self._restore(self.torchless, cell_id, "(without PyTorch) ", "the process without PyTorch")
        if failure:
            self.torchless_dead = failure

    def _restore(self, sandbox, cell_id, note, name):
        """Restart a lost `sandbox` and run the cells so far in it again; None, or why it could not be."""
        self._event("process-lost", cell_id, f"{note}{sandbox.lost}")
        if self.restarts >= MAX_RESTARTS:
            return f"{name} was lost {self.restarts + 1} times"
        self.restarts += 1
        try:
            sandbox.restart()
            for source in self.ran:
                sandbox.run_cell(source, timeout=self._cell_time())
        except SandboxLost as exc:
            return f"{name} could not be restored ({exc})"
        return None

    # ------------------------------------------------------------ cells
    def _run_student_cell(self, cell, label):
        try:
            reply = self.sandbox.run_cell(cell.source, timeout=self._cell_time())
        except SandboxLost as exc:
            cell.outputs = [_error("ProcessLost", str(exc), [f"ProcessLost: {exc}"])]
            self._recover(label)
            return
        self.ran.append(cell.source)
        self._run_torchless(cell.source, label)
        outputs = []
        if reply.get("stdout"):
            outputs.append(_stream("stdout", reply["stdout"]))
        if reply.get("stderr"):
            outputs.append(_stream("stderr", reply["stderr"]))
        error = reply.get("error")
        if error:
            tb = str(error.get("traceback", "")).splitlines() or [f"{error.get('type')}: {error.get('message')}"]
            outputs.append(_error(str(error.get("type", "Error")), str(error.get("message", "")), tb))
        cell.outputs = outputs

    def _run_torchless(self, source, label):
        """The same cell in the process without PyTorch (its outputs are not the notebook's)."""
        if self.torchless is None or self.torchless_dead:
            return
        try:
            self.torchless.run_cell(source, timeout=self._cell_time())
        except SandboxLost:
            self._recover_torchless(label)

    def _bind_student_names(self, hidden):
        names = [name for name in self.sandbox.names() if name not in BUILTIN_NAMES]
        for name in names:
            current = self.ns.get(name)
            if current is None or isinstance(current, (Remote, _NotInTorchless)):
                self.ns[name] = student_function(self.sandbox, name)
        if not hidden or self.torchless is None:
            return
        there = set()
        if not self.torchless_dead:
            with contextlib.suppress(SandboxLost):
                there = set(self.torchless.names())
        for name in self.numpy_names & set(names):
            current = self.ns.get(name)
            if isinstance(current, (Remote, _NotInTorchless)):
                self.ns[name] = student_function(self.torchless, name) if name in there else \
                    _NotInTorchless(name, self.torchless_dead)

    def _run_here(self, cell, label):
        """Run trusted cell source in this process; returns the exception, if any."""
        filename = f"<{label}>"
        linecache.cache[filename] = (len(cell.source), None, cell.source.splitlines(True), filename)
        out = io.StringIO()
        for sb in self._sandboxes():
            sb.limits.call_timeout_s = self._cell_time()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()), \
                    warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(compile(cell.source, filename, "exec"), self.ns)
            return out.getvalue(), None
        except Exception as exc:  # a failed test is an exception; its message is the feedback
            return out.getvalue(), exc
        except SystemExit as exc:
            return out.getvalue(), RuntimeError(f"the test cell called exit({exc.code})")

    def _run_test_cell(self, cell, label):
        points = float(_nb(cell).get("points", 0))
        if self.dead or self._time_left() <= 0:
            reason = self.dead or f"not run: the notebook's time limit ({self.notebook_timeout} s) was reached"
            if not self.dead:
                self._event("time-limit", label, reason)
                self.dead = reason
            cell.outputs = [_not_run(reason)]
            self.result.scores[label] = (0.0, points)
            self.result.messages[label] = reason
            return
        try:
            self._bind_student_names(HIDDEN_MARKER in cell.source)
        except SandboxLost:
            pass  # reported by the call that needs the student's code
        for sb in self._sandboxes():
            sb.open_window()
        printed, exc = self._run_here(cell, label)
        seen = []
        for sb in self._sandboxes():
            seen += sb.close_window()
            self.calls.setdefault(label, set()).update(sb.called)
        judged = self._judged(seen, label)  # always: a failed cell's reports count too
        exc = exc or judged
        outputs = [_stream("stdout", printed)] if printed else []
        if exc is None:
            self.result.scores[label] = (points, points)
        else:
            message = f"{type(exc).__name__}: {exc}"
            outputs.append(_error(type(exc).__name__, str(exc), _failure_lines(exc)))
            self.result.scores[label] = (0.0, points)
            self.result.messages[label] = message
        cell.outputs = outputs
        if self.sandbox.lost:
            self._recover(label)
        if self.torchless is not None and self.torchless.lost and not self.torchless_dead:
            self._recover_torchless(label)

    def _judged(self, seen, label):
        """What the audit hooks reported while the test cell ran: a failure
        when the grader's helpers were changed, a flag when PyTorch was reached
        for in the process without it."""
        from autograde.compare import GradingFailure

        for event in seen:
            if event.get("what") == TORCH_USE:
                self.flags.append({"what": TORCH_USE, "cell": label, "detail": event.get("detail", "")})
        changed = [e for e in seen if e.get("what") in TAMPERING]
        if changed:
            return GradingFailure(f"no points: while this cell ran, the student's code changed the grader's code in "
                                  f"its process ({changed[0].get('detail', '')}).")
        return None

    def _forfeit(self):
        """Test cells that call a function whose integrity check failed earn nothing."""
        forfeited = {}
        for sb in self._sandboxes():
            forfeited.update(sb.forfeited)
        for cell in self.nb.cells:
            label = _nb(cell).get("grade_id")
            score, points = self.result.scores.get(label, (0.0, 0.0))
            failed = sorted(self.calls.get(label, set()) & set(forfeited))
            if not failed or score == 0:
                continue
            reason = (f"no points: {failed[0]} failed an integrity check ({forfeited[failed[0]]}), so no test of it "
                      "counts.")
            cell.outputs = list(cell.outputs) + [_error("IntegrityFailure", reason, [f"IntegrityFailure: {reason}"])]
            self.result.scores[label] = (0.0, points)
            self.result.messages[label] = reason

    def _run_setup_cell(self, cell, label):
        _, exc = self._run_here(cell, label)
        if exc is not None:
            raise EnvironmentFailure(f"the assignment's setup cell fails in the grader: {type(exc).__name__}: {exc}")
        _measuring_setup_helpers(self.ns)
        self._run_student_cell(cell, label)

    def run(self):
        draws.grading([cell.source for cell in self.nb.cells if cell.cell_type == "code"])
        for sb in self._sandboxes():
            sb.start()
        try:
            for index, cell in enumerate(self.nb.cells):
                if cell.cell_type != "code":
                    continue
                cell.execution_count = None
                label = _nb(cell).get("grade_id") or f"cell {index + 1}"
                if is_test_cell(cell):
                    self._run_test_cell(cell, label)
                elif self.dead or self._time_left() <= 0:
                    reason = self.dead or "not run: the notebook's time limit was reached"
                    cell.outputs = [_not_run(reason)]
                elif _not_run_when_graded(cell):
                    cell.outputs = []
                elif is_setup_cell(cell):
                    self._run_setup_cell(cell, label)
                else:
                    self._run_student_cell(cell, label)
        finally:
            for sb in self._sandboxes():
                sb.close()
            self._forfeit()
            seen = set()
            sightings = [s for sb in self._sandboxes() for s in sb.sightings]
            for sighting in sightings + self.flags:  # from the audit hooks in the student's processes
                key = (sighting.get("what"), sighting.get("detail"))
                if key not in seen:
                    seen.add(key)
                    self.result.sightings.append((sighting.get("what", "audit"), sighting.get("cell") or "notebook",
                                                  sighting.get("detail", "")))
        return self.result


NOT_RUN_TAG = "not-run-when-graded"


def _not_run_when_graded(cell):
    """A read-only cell (the instructor's, restored before grading) tagged as being for
    the student only, e.g. one that compiles the student's kernels for show: the hidden
    tests do the same in the grader's own way."""
    meta = _nb(cell)
    return meta.get("locked") and not meta.get("solution") and NOT_RUN_TAG in cell.get("metadata", {}).get("tags", [])


def execute_notebook(notebook, **options):
    """Run `notebook` (a dict or NotebookNode) as described above; an Execution."""
    return NotebookRun(notebook, **options).run()


def submitted_passes(notebook):
    """grade_id -> True for test cells that the submitted notebook shows as
    having run without error (the student's own run)."""
    passed = {}
    for cell in notebook.cells:
        if is_test_cell(cell) and cell.get("execution_count") is not None:
            errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            passed[_nb(cell).get("grade_id")] = not errors
    return passed


__all__ = ["Execution", "execute_notebook", "is_setup_cell", "is_test_cell", "submitted_passes"]
