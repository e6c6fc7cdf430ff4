"""Execute one (normalized) notebook for grading.

The student's cells run in a sandboxed process (autograde.sandbox). The test
cells, whose source comes from the instructor's notebook, run here in the
grader's process, where the student's functions are proxies: whatever the
student's code does to its own process (patching numpy.allclose, returning an
object whose == is always True, installing input transformers), the checks and
their comparisons run in a process it never touched, on plain data.

The result is the notebook with outputs (test cells: this process's output or
the check's error), so nbgrader's own scoring, gradebook and feedback follow."""
import contextlib
import io
import linecache
import time
import traceback
import warnings
from dataclasses import dataclass, field

import nbformat

from autograde import draws
from autograde.sandbox import EnvironmentFailure, Remote, Sandbox, SandboxLost, find_remote, student_function
from autograde.structure import is_test, nbgrader_of

MAX_RESTARTS = 20  # each costs at most a cell's time limit; the notebook's limit bounds them all


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
    """The notebooks' setup defines peak_bytes(fn, *args); measured here it would
    see only the proxy, so a student function is measured in its own process."""
    from student_runtime.probes import numpy_peak
    from autograde.sandbox import in_student_process

    if callable(ns.get("peak_bytes")):
        local = ns["peak_bytes"]

        def peak_bytes(fn, *args):
            if find_remote([fn, *args]) is not None:
                return in_student_process(numpy_peak, fn, *args)
            return local(fn, *args)
        ns["peak_bytes"] = peak_bytes


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
        self.ns = {"__name__": "__main__"}
        self.ran = []  # sources of student/setup cells that ran, replayed after a restart
        self.dead = None  # why nothing more can run
        self.restarts = 0
        self.result = Execution(notebook=self.nb)

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
        reason = self.sandbox.lost
        self._event("process-lost", cell_id, reason)
        if self.restarts >= MAX_RESTARTS:
            self.dead = f"not run: the student's process was lost {self.restarts + 1} times"
            return
        self.restarts += 1
        try:
            self.sandbox.restart()
            for source in self.ran:
                self.sandbox.run_cell(source, timeout=self._cell_time())
        except SandboxLost as exc:
            self.dead = f"not run: the student's process could not be restored ({exc})"

    # ------------------------------------------------------------ cells
    def _run_student_cell(self, cell, label):
        try:
            reply = self.sandbox.run_cell(cell.source, timeout=self._cell_time())
        except SandboxLost as exc:
            cell.outputs = [_error("ProcessLost", str(exc), [f"ProcessLost: {exc}"])]
            self._recover(label)
            return
        self.ran.append(cell.source)
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

    def _bind_student_names(self):
        for name in self.sandbox.names():
            current = self.ns.get(name)
            if current is None or isinstance(current, Remote):
                self.ns[name] = student_function(self.sandbox, name)

    def _run_here(self, cell, label):
        """Run trusted cell source in this process; returns the exception, if any."""
        filename = f"<{label}>"
        linecache.cache[filename] = (len(cell.source), None, cell.source.splitlines(True), filename)
        out = io.StringIO()
        self.sandbox.limits.call_timeout_s = self._cell_time()
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
            self._bind_student_names()
        except SandboxLost:
            pass  # reported by the call that needs the student's code
        printed, exc = self._run_here(cell, label)
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

    def _run_setup_cell(self, cell, label):
        _, exc = self._run_here(cell, label)
        if exc is not None:
            raise EnvironmentFailure(f"the assignment's setup cell fails in the grader: {type(exc).__name__}: {exc}")
        _measuring_setup_helpers(self.ns)
        self._run_student_cell(cell, label)

    def run(self):
        draws.grading([cell.source for cell in self.nb.cells if cell.cell_type == "code"])
        self.sandbox.start()
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
            self.sandbox.close()
            seen = set()
            for sighting in self.sandbox.sightings:  # from the audit hook in the student's process
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
