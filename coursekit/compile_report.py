"""What a real GPU would get from a Triton kernel, found without one.

Triton's wheel ships its whole NVIDIA back end: the compiler, ptxas and
cuobjdump. For one kernel and one launch's specialisation (argument types,
constexpr values, integer and pointer alignment, num_warps, num_stages) this
module compiles the kernel for a T4 (sm_75), an A100 (sm_80), an L4 (sm_89) and
an H100 (sm_90a) and reports, per target: whether it compiles (or the compiler's
message and the kernel line it points at); registers per thread; bytes spilled
to local memory; shared memory against the target's per-block limit; the
tensor-core instructions by kind (HMMA, HGMMA); and theoretical occupancy
(coursekit.gpu_targets).

    with record_launches() as launches:           # any code that launches kernels
        flash_forward(q, k, v)
    for report in compile_reports(launches.distinct()):
        print(report.render())

or, for one launch given explicitly:

    compile_report(kernel, specialise(kernel, q, k, v, ..., BLOCK_M=64, num_warps=4))

Compiling happens in separate processes (coursekit.compile_worker), which need
only the Python installation and a writable temporary directory; they hand
over PTX, and what the binary holds is read in processes that run none of the
kernel's code (coursekit.binary_report). Results are
cached by kernel source and specialisation, in this process and, given a
directory (argument or COURSEKIT_COMPILE_CACHE), on disk."""
import contextlib
import dataclasses
import hashlib
import inspect
import json
import os
import queue
import select
import signal
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from coursekit.binary_report import REFUSED
from coursekit.compile_worker import backend_problem
from coursekit.gpu_targets import TARGETS, occupancy
from coursekit.kernel_source import _literal, describe, raw_function

TARGET_NAMES = ("T4", "A100", "L4", "H100")
REPORT_VERSION = 2          # bump when a record's fields, or how they are found, change: old cache entries are then ignored
OPTION_NAMES = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion", "launch_cooperative_grid",
                "launch_pdl")
DEFAULT_OPTIONS = {"num_warps": 4, "num_stages": 3}     # Triton's defaults for NVIDIA GPUs (CUDAOptions)
CACHE_ENV = "COURSEKIT_COMPILE_CACHE"


# ---------------------------------------------------------------- one launch's specialisation

@dataclasses.dataclass(frozen=True)
class Specialisation:
    """What Triton compiles one kernel for: the type of each argument ('*fp16' for a
    pointer to float16, 'i32', 'fp32', 'constexpr'), the constexpr values, the
    arguments known to be multiples of 16 (pointers aligned to 16 bytes), and the
    launch options (num_warps, num_stages)."""
    kernel: str
    signature: tuple              # ((name, type), ...) in argument order
    constexprs: tuple             # ((name, value), ...)
    divisible_by_16: tuple        # names
    options: tuple                # ((name, value), ...)

    @property
    def num_warps(self):
        return dict(self.options).get("num_warps", DEFAULT_OPTIONS["num_warps"])

    @property
    def num_stages(self):
        return dict(self.options).get("num_stages", DEFAULT_OPTIONS["num_stages"])

    def label(self):
        """A short description: element types, constexprs, warps and stages."""
        dtypes = sorted({t[1:] for _, t in self.signature if t.startswith("*")})
        consts = [f"{n}={v}" for n, v in self.constexprs]
        return ", ".join(dtypes + consts + [f"{self.num_warps} warps", f"{self.num_stages} stages"])

    def as_job(self, arg_names):
        index = {name: i for i, name in enumerate(arg_names)}
        return {"signature": dict(self.signature),
                "constexprs": [[[index[n]], _constant(v)] for n, v in self.constexprs],
                "attrs": [[[index[n]], [["tt.divisibility", 16]]] for n in self.divisible_by_16],
                "options": {**DEFAULT_OPTIONS, **dict(self.options)}}


def _constant(value):
    literal = _literal(value)
    if literal is not None:
        return literal
    if type(value).__name__ == "dtype":
        return {"dtype": str(value)}
    raise ValueError(f"a constexpr argument of type {type(value).__name__} cannot be compiled separately")


def specialise(kernel, *args, **kwargs):
    """The Specialisation Triton would compile for kernel[grid](*args, **kwargs),
    computed as Triton's launcher computes it; the arguments may be CPU tensors
    (only their dtype and alignment matter)."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import KernelParam, create_function_from_signature

    fn = raw_function(kernel)
    options = {k: kwargs.pop(k) for k in list(kwargs) if k in OPTION_NAMES}
    jit = kernel                  # the @triton.jit object, under any autotune or heuristics
    while type(jit).__name__ not in ("JITFunction", "InterpretedFunction") and hasattr(jit, "fn"):
        jit = jit.fn
    flags = getattr(jit, "kwargs", None) or {"do_not_specialize": getattr(jit, "do_not_specialize", None),
                                             "do_not_specialize_on_alignment":
                                                 getattr(jit, "do_not_specialize_on_alignment", None)}
    signature = inspect.signature(fn)
    dns = list(flags.get("do_not_specialize") or ())
    dnsa = list(flags.get("do_not_specialize_on_alignment") or ())
    params = [KernelParam(i, p, i in dns or p.name in dns, i in dnsa or p.name in dnsa)
              for i, p in enumerate(signature.parameters.values())]
    unknown = [k for k in kwargs if k not in signature.parameters]
    if unknown:
        raise TypeError(f"{fn.__name__} has no argument {unknown[0]!r}")
    bound, specialization, _ = create_function_from_signature(signature, params, BaseBackend)(*args, **kwargs)
    types, constexprs, divisible = [], [], []
    for param, (ty, attr) in zip(params, specialization):
        if isinstance(ty, tuple) or isinstance(attr, tuple):
            raise ValueError(f"{fn.__name__}: tuple arguments ({param.name}) are not supported by the compile report")
        types.append((param.name, ty))
        if ty == "constexpr":
            constexprs.append((param.name, bound[param.name]))
        elif isinstance(attr, str) and "D" in attr:
            divisible.append(param.name)
    return Specialisation(fn.__name__, tuple(types), tuple(constexprs), tuple(divisible),
                          tuple(sorted(options.items())))


# ---------------------------------------------------------------- launches recorded while code runs

@dataclasses.dataclass(frozen=True)
class Launch:
    kernel: object                # the kernel as the code launched it
    spec: Specialisation


class LaunchLog(list):
    def distinct(self):
        """One Launch per (kernel, specialisation), in the order first seen."""
        seen, out = set(), []
        for launch in self:
            key = (id(raw_function(launch.kernel)), launch.spec)
            if key not in seen:
                seen.add(key)
                out.append(launch)
        return out


@contextlib.contextmanager
def record_launches(execute=True):
    """Context manager yielding a LaunchLog of every kernel launch made while it is
    active, under Triton's interpreter or on a GPU. execute=False records the
    launches without running the kernels (their outputs stay as allocated)."""
    from triton.runtime.jit import JITFunction

    log = LaunchLog()
    owners = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction
        owners.append(InterpretedFunction)
    except ImportError:
        pass
    originals = [(owner, owner.run) for owner in owners]

    def wrap(original):
        def run(self, *args, grid, warmup, **kwargs):
            if not warmup:
                log.append(Launch(self, specialise(self, *args, **kwargs)))
                if not execute:
                    return None
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        return run

    for owner, original in originals:
        owner.run = wrap(original)
    try:
        yield log
    finally:
        for owner, original in originals:
            owner.run = original


# ---------------------------------------------------------------- reports

@dataclasses.dataclass(frozen=True)
class TargetReport:
    """What one GPU gets: see the module's docstring. Sizes in bytes."""
    target: str
    arch: str = ""
    compiles: bool | None = False       # None: could not be tried here (no NVIDIA back end)
    error: str | None = None            # the compiler's message, when it does not compile
    where: dict | None = None           # file, line, function, text of the line the message points at
    num_warps: int = 4
    num_stages: int = 3
    registers: int | None = None        # per thread
    spill_stores: int | None = None     # bytes of spill stores to local memory, as ptxas -v reports them
    spill_loads: int | None = None
    local_stores: int = 0               # STL / LDL instructions in the binary
    local_loads: int = 0
    stack: int | None = None
    local: int | None = None
    shared: int | None = None           # per program: Triton's dynamic allocation plus static shared memory
    mma: dict = dataclasses.field(default_factory=dict)    # tensor-core instruction -> count in the binary
    cpu_seconds: float | None = None    # what compiling and reading the binary cost
    artefacts: dict = dataclasses.field(default_factory=dict)

    @property
    def shared_limit(self):
        return TARGETS[self.target].shared_per_block

    @property
    def spills(self):
        return bool(self.spill_stores or self.spill_loads)

    @property
    def occupancy(self):
        if not self.compiles:
            return None
        return occupancy(self.target, self.registers, self.shared, self.num_warps)

    @property
    def mma_kind(self):
        """'HGMMA', 'HMMA', ... (the most frequent tensor-core instruction) or 'none'."""
        return max(self.mma, key=self.mma.get) if self.mma else "none"

    def refused(self):
        """Whether the compiling process said it made a kernel that coursekit.binary_report
        found no sign of: only code run in that process to change its report does that."""
        return not self.compiles and (self.error or "").startswith(REFUSED)

    def problem(self):
        """The error, or a resource the target lacks, in one line; None when fine."""
        if self.compiles is None:
            return "not compiled here: " + (self.error or "")
        if not self.compiles:
            if self.where:
                w = self.where
                return f"does not compile: {w['file']}:{w['line']} ({w['function']}): {w['message']}"
            return "does not compile: " + (self.error or "unknown error").strip().splitlines()[-1]
        if self.shared > self.shared_limit:
            return f"needs {self.shared} bytes of shared memory per program, over the {self.shared_limit} available"
        return None

    def summary(self):
        """One line for a reader: what this GPU gets, or why it gets nothing."""
        problem = self.problem()
        if not self.compiles:
            return f"{self.target} ({self.arch}): {problem}"
        occ = self.occupancy
        spills = (f"spills {self.spill_stores} bytes per thread to local memory" if self.spills
                  else "no spills")
        mma = ", ".join(f"{k} x{v}" for k, v in self.mma.items()) or "no tensor-core instructions"
        text = (f"{self.target} ({self.arch}): {self.registers} registers per thread, {spills}, "
                f"{_kib(self.shared)} of {_kib(self.shared_limit)} KiB shared memory, {mma}, "
                f"{occ.warps_per_sm} of {occ.max_warps_per_sm} warps resident per multiprocessor "
                f"(limited by {occ.limited_by})")
        return text + (f"; {problem}" if problem else "")


@dataclasses.dataclass(frozen=True)
class KernelReport:
    kernel: str
    spec: Specialisation
    targets: tuple                # TargetReport per target

    def __getitem__(self, target):
        return next(t for t in self.targets if t.target == target)

    @property
    def compiles(self):
        return all(t.compiles for t in self.targets)

    def render(self):
        return render([self])

    def feedback(self):
        """A few lines for a student: the kernel and its launch, then one line per GPU."""
        return "\n".join([f"{self.kernel} [{self.spec.label()}]"] + ["  " + t.summary() for t in self.targets])


def _kib(n):
    return f"{n / 1024:.1f}"


def render(reports):
    """A text table, one row per kernel and target, followed by the compiler's
    messages for what does not compile."""
    header = ("kernel", "target", "compiles", "regs", "spills st/ld B", "shared KiB (limit)", "MMA",
              "occupancy (limit)")
    rows, notes = [], []
    for report in reports:
        name = f"{report.kernel} [{report.spec.label()}]"
        for t in report.targets:
            if t.compiles:
                occ = t.occupancy
                rows.append((name, f"{t.target} {t.arch}", "yes", str(t.registers),
                             f"{t.spill_stores}/{t.spill_loads}", f"{_kib(t.shared)} ({_kib(t.shared_limit)})",
                             ", ".join(f"{k} {v}" for k, v in t.mma.items()) or "none",
                             f"{occ.warps_per_sm}/{occ.max_warps_per_sm} warps ({occ.limited_by})"))
            else:
                rows.append((name, f"{t.target} {t.arch}", "no" if t.compiles is False else "not tried",
                             "", "", "", "", ""))
            problem = t.problem()
            if problem:
                notes.append(f"{report.kernel} on {t.target}: {problem}")
            name = ""
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header] + rows]
    return "\n".join(lines + notes)


# ---------------------------------------------------------------- compiling, cached

_MEMORY = {}


def _without_location(description):
    """The description with the functions' files and line numbers left out (they
    change the compiler's messages, not what it makes of a kernel that compiles)."""
    order, todo = {}, [description["root"]]
    while todo:
        key = todo.pop(0)
        if key in order:
            continue
        order[key] = f"f{len(order)}"
        todo += [g["function"] for g in description["functions"][key]["globals"].values() if "function" in g]
    functions = {}
    for key, name in order.items():
        entry = description["functions"][key]
        functions[name] = {**{k: v for k, v in entry.items() if k not in ("filename", "firstlineno", "globals")},
                           "globals": {g: ({"function": order[v["function"]]} if "function" in v else v)
                                       for g, v in entry["globals"].items()}}
    return functions


def _cache_key(description, job_spec, target, artefacts, located=True):
    import triton

    kernel = description if located else _without_location(description)
    text = json.dumps([REPORT_VERSION, triton.__version__, kernel, job_spec, target, sorted(artefacts)],
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _disk_get(cache_dir, key):
    if cache_dir is None:
        return None
    try:
        return json.loads((Path(cache_dir) / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None


def _disk_put(cache_dir, key, record):
    if cache_dir is None:
        return
    path = Path(cache_dir)
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / f".{key}.{os.getpid()}.{threading.get_ident()}"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path / f"{key}.json")


class _Worker:
    """One process serving JSON jobs one at a time: `module`'s main() (coursekit.compile_worker
    or coursekit.binary_report). command(workdir), when given, is the argv that starts
    it (e.g. inside a sandbox); by default this Python runs the module from this tree."""

    _BOOT = "import sys; sys.path.insert(0, {root!r}); from {module} import main; main()"

    def __init__(self, workdir, command=None, module="coursekit.compile_worker"):
        self.workdir = workdir
        self.command = command
        self.module = module
        self.proc = None

    def _start(self):
        env = dict(os.environ)
        env.pop("TRITON_INTERPRET", None)
        env.pop("TRITON_DISABLE_LINE_INFO", None)       # the binary's check reads the PTX's line information
        env["TRITON_CACHE_DIR"] = os.path.join(self.workdir, "triton-cache")
        env["TRITON_HOME"] = self.workdir
        env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")     # Triton 3.9's default, stated to silence its warning
        root = str(Path(__file__).resolve().parent.parent)
        self.stderr = open(os.path.join(self.workdir, "worker-stderr.txt"), "w+")
        argv = (self.command(self.workdir) if self.command
                else [sys.executable, "-c", self._BOOT.format(root=root, module=self.module)])
        # a session of its own, so that stopping it also stops the ptxas it started
        self.proc = subprocess.Popen(argv, cwd=self.workdir, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True, start_new_session=True)

    def run(self, job, timeout):
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            line = self.proc.stdout.readline() if ready else None
        except (BrokenPipeError, OSError):
            line = ""
        if line:
            try:
                answer = json.loads(line)
            except ValueError:
                answer = None
            if isinstance(answer, dict) and answer.get("id") == job["id"] and isinstance(answer.get("record"), dict):
                return answer["record"]
            return {"target": job["target"], "compiles": False,
                    "error": f"{REFUSED}: the process answered something that is not a report for this job"}
        if line is None:
            self.close(kill=True)
            return {"target": job["target"], "compiles": False,
                    "error": f"compiling for {job['target']} took longer than {timeout:.0f} s and was stopped"}
        code = self.proc.wait()
        self.stderr.seek(0)
        tail = self.stderr.read()[-1500:]
        self.close()
        return {"target": job["target"], "compiles": False,
                "error": f"the compiler process stopped (exit code {code}) while compiling for {job['target']}"
                         + (f":\n{tail}" if tail.strip() else "")}

    def _kill(self):
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.kill()

    def close(self, kill=False):
        if self.proc is None:
            return
        if kill:
            self._kill()
        else:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        if self.proc.poll() is None:
            self._kill()
            self.proc.wait()
        self.stderr.close()
        self.proc = None


def _checked_fields(payload):
    """What a record says of its target and launch options, from the job, not from a process."""
    target, options = TARGETS[payload["target"]], {**DEFAULT_OPTIONS, **payload["spec"]["options"]}
    return {"target": target.name, "arch": target.arch, "num_warps": options["num_warps"],
            "num_stages": options["num_stages"]}


def _seconds(*records):
    return round(sum(r.get("cpu_seconds") for r in records if isinstance(r.get("cpu_seconds"), (int, float))), 2)


def _failure(record, payload):
    """A compiling process's refusal, kept to the fields (and types) a report has."""
    where = record.get("where")
    keys = {"file": str, "line": int, "function": str, "text": str, "message": str}
    if not (isinstance(where, dict) and all(isinstance(where.get(k), t) for k, t in keys.items())):
        where = None
    error = record.get("error")
    return {**_checked_fields(payload), "compiles": None if record.get("compiles") is None else False,
            "error": error if isinstance(error, str) else "the compiler gave no message", "where": where,
            "cpu_seconds": _seconds(record)}


def _with_binary(record, payload, binaries, timeout):
    """The compiling process's record (PTX, Triton's dynamic shared memory, IR texts)
    completed by coursekit.binary_report: every fact about the binary, and whether
    there is one, comes from a process that runs none of the kernel author's code."""
    description = payload["kernel"]
    root = description["functions"][description["root"]]
    target = TARGETS[payload["target"]]
    job = {"id": payload["id"], "target": payload["target"], "ptx": record.get("ptx"), "name": root["name"],
           "arch": target.arch, "capability": target.capability, "options": payload["spec"]["options"],
           "source": [root["filename"], root["firstlineno"],
                      root["firstlineno"] + len(root["source"].splitlines()) - 1],
           "sass": "sass" in payload["artefacts"]}
    binary = binaries.run(job, timeout)
    checked, seconds = _checked_fields(payload), _seconds(record, binary)
    if not binary.get("compiles"):
        return {**checked, "compiles": False, "error": binary.get("error"), "cpu_seconds": seconds}
    dynamic = record.get("shared")
    dynamic = dynamic if isinstance(dynamic, int) and dynamic >= 0 else 0     # advice only: no point rests on it
    artefacts = record.get("artefacts") if isinstance(record.get("artefacts"), dict) else {}
    artefacts = {k: v for k, v in artefacts.items() if k in payload["artefacts"] and k != "sass" and isinstance(v, str)}
    if "sass" in binary:
        artefacts["sass"] = binary.pop("sass")
    return {**checked, **{k: v for k, v in binary.items() if k != "static_shared"},
            "shared": dynamic + binary["static_shared"], "cpu_seconds": seconds, "artefacts": artefacts}


def default_workers():
    """Two compiling processes, or one on a single core: each also starts ptxas and
    cuobjdump, and a sandbox may limit how many processes a student's code has."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(2, cores))


def described(launches):
    """The launches as plain data (dicts of text and numbers) for compiling elsewhere:
    'kernel' (its name), 'label' (Specialisation.label), 'description'
    (coursekit.kernel_source.describe) and 'job' (Specialisation.as_job)."""
    descriptions, out = {}, []
    for launch in launches:
        fn = raw_function(launch.kernel)
        if id(fn) not in descriptions:
            descriptions[id(fn)] = describe(launch.kernel)
        out.append({"kernel": launch.spec.kernel, "label": launch.spec.label(), "description": descriptions[id(fn)],
                    "job": launch.spec.as_job(list(_arg_names(fn)))})
    return out


def compile_reports(launches, targets=TARGET_NAMES, artefacts=(), cache_dir=None, workers=None, timeout=600,
                    command=None):
    """A KernelReport per Launch (kernel and Specialisation), compiled for each
    target, `workers` compiling processes at a time. artefacts: texts to keep
    ('ttir', 'ttgir', 'llir', 'ptx', 'sass'). cache_dir: a directory for results
    (default: $COURSEKIT_COMPILE_CACHE, else none). command: see _Worker."""
    launches = list(launches)
    per_kernel = compile_described(described(launches), targets, artefacts, cache_dir, workers, timeout, command)
    return [KernelReport(launch.spec.kernel, launch.spec, reports) for launch, reports in zip(launches, per_kernel)]


def compile_described(kernels, targets=TARGET_NAMES, artefacts=(), cache_dir=None, workers=None, timeout=600,
                      command=None):
    """For kernels given as plain data (see described), a tuple of TargetReports each,
    one per target, in order."""
    cache_dir = cache_dir if cache_dir is not None else os.environ.get(CACHE_ENV) or None
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        raise ValueError(f"unknown target {unknown[0]!r}: choose from {', '.join(TARGETS)}")
    jobs, records = [], {}
    for i, kernel in enumerate(kernels):
        description, job_spec = kernel["description"], kernel["job"]
        for target in targets:
            # in this process by kernel, location and launch; on disk (successes only) without the location
            key = _cache_key(description, job_spec, target, artefacts)
            disk_key = _cache_key(description, job_spec, target, artefacts, located=False)
            record = _MEMORY.get(key) or _disk_get(cache_dir, disk_key)
            if record is not None:
                _MEMORY[key] = records[i, target] = record
            else:
                jobs.append(((i, target), (key, disk_key), {"id": key, "kernel": description, "spec": job_spec,
                                                            "target": target, "artefacts": list(artefacts)}))
    problem = backend_problem() if jobs else None
    if problem:                   # say so for every target, without starting anything
        for slot, _, payload in jobs:
            records[slot] = {"target": payload["target"], "arch": TARGETS[payload["target"]].arch,
                             "compiles": None, "error": problem}
        jobs = []
    if jobs:
        # slowest targets first, so that the last job to finish is a short one
        jobs.sort(key=lambda job: TARGETS[job[2]["target"]].capability)
        with tempfile.TemporaryDirectory(prefix="coursekit-compile-") as workdir:
            pool = queue.Queue()
            count = min(workers or default_workers(), len(jobs))
            for n in range(count):
                for kind in ("compile", "binary"):
                    os.makedirs(os.path.join(workdir, str(n), kind))
                pool.put((_Worker(os.path.join(workdir, str(n), "compile"), command),
                          _Worker(os.path.join(workdir, str(n), "binary"), module="coursekit.binary_report")))

            def run(job):
                slot, (key, disk_key), payload = job
                workers = pool.get()
                try:
                    record = workers[0].run(payload, timeout)
                    record = (_with_binary(record, payload, workers[1], timeout) if record.get("compiles")
                              else _failure(record, payload))
                finally:
                    pool.put(workers)
                # Only binaries are kept: whether a kernel failed is said by the process that ran its
                # author's code, which may have been told to say so of another author's identical kernel.
                if record.get("compiles"):
                    _MEMORY[key] = record
                    _disk_put(cache_dir, disk_key, record)
                return slot, record

            try:
                with ThreadPoolExecutor(count) as executor:
                    for slot, record in executor.map(run, jobs):
                        records[slot] = record
            finally:
                while not pool.empty():
                    for worker in pool.get():
                        worker.close()
    fields = {f.name for f in dataclasses.fields(TargetReport)}
    return [tuple(TargetReport(**{k: v for k, v in records[i, t].items() if k in fields}) for t in targets)
            for i in range(len(kernels))]


def _arg_names(fn):
    return inspect.signature(fn).parameters


def compile_report(kernel, spec, targets=TARGET_NAMES, **options):
    """The KernelReport of one kernel for one Specialisation (see specialise)."""
    return compile_reports([Launch(kernel, spec)], targets, **options)[0]
