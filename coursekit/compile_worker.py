"""The compiling process behind coursekit.compile_report: reads jobs (a kernel
described by coursekit.kernel_source, one launch's specialisation, one target)
as JSON lines on stdin and answers each with one JSON line: what Triton's
compiler made of the kernel for that GPU, read from ptxas's report and from the
binary with cuobjdump (both ship inside Triton's wheel).

It must run without Triton's interpreter (TRITON_INTERPRET unset), in a process
of its own: coursekit.compile_report starts it so."""
import collections
import contextlib
import io
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import traceback

from coursekit.gpu_targets import TARGETS
from coursekit.kernel_source import _value, rebuild

_OPCODE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)")
_REG = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")
_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_MESSAGE_LIMIT = 4000


def backend_problem():
    """None where Triton can compile for NVIDIA GPUs here, else why not, in words."""
    try:
        import triton
        from triton import knobs
        from triton.backends import backends
    except Exception as e:       # noqa: BLE001 - any failure to import means the same to the reader
        return f"Triton cannot be imported ({type(e).__name__}: {e})"
    if "nvidia" not in backends:
        return (f"this Triton {triton.__version__} installation has no NVIDIA back end "
                "(triton/backends/nvidia is missing), so nothing can be compiled for NVIDIA GPUs here")
    try:
        for tool in (knobs.nvidia.ptxas, knobs.nvidia.ptxas_blackwell, knobs.nvidia.cuobjdump):
            tool.path
    except RuntimeError as e:
        return f"Triton's NVIDIA back end lacks a tool it ships with ({e})"
    return None


def sass_opcodes(sass):
    """How many times each SASS instruction (opcode without modifiers) appears in a listing."""
    return collections.Counter(m.group(1) for line in sass.splitlines() if (m := _OPCODE.match(line)))


def tensor_core_instructions(opcodes):
    """The matrix-multiply-accumulate instructions: HMMA (warp-level, sm_70 on), HGMMA
    (warpgroup-level, sm_90), and their integer and 8-bit float relatives."""
    return {op: n for op, n in sorted(opcodes.items()) if op.endswith("MMA")}


def _spills(ptxas_log):
    stack = stores = loads = 0
    found = False
    for m in _SPILLS.finditer(ptxas_log):
        found = True
        stack, stores, loads = max(stack, int(m.group(1))), stores + int(m.group(2)), loads + int(m.group(3))
    return (stack, stores, loads) if found else None


def _locate_dependency_errors():
    """Triton checks the functions a kernel calls before generating any code, and
    its message ("Unsupported function referenced: ...") names no line. Make that
    check remember the innermost node it was visiting, and the function's source."""
    from triton.runtime import jit

    if getattr(jit.DependenciesFinder, "_locates", False):
        return
    original = jit.DependenciesFinder

    class LocatingDependenciesFinder(original):
        _locates = True

        def __init__(self, name, globals, nonlocals, src):
            super().__init__(name, globals, nonlocals, src)
            self._source = src

        def visit(self, node):
            try:
                return super().visit(node)
            except Exception as e:
                if getattr(e, "node", None) is None and hasattr(node, "lineno"):
                    e.node, e.src, e.error_message = node, self._source, str(e)
                raise

    jit.DependenciesFinder = LocatingDependenciesFinder


def _location(error, sources):
    """(filename, line, function, text) of the innermost compiler error: from
    Triton's CompilationError, or from the dependency check above."""
    chain, e = [], error
    while e is not None:
        if getattr(e, "node", None) is not None and getattr(e, "src", None) is not None:
            chain.append(e)
        e = e.__cause__ or e.__context__
    for e in reversed(chain):
        node = getattr(e, "node", None)
        if node is None or not hasattr(node, "lineno") or e.src not in sources:
            continue
        filename, def_line, name = sources[e.src]
        line = def_line + node.lineno - 1
        text = e.src.split("\n")[node.lineno - 1].strip() if node.lineno <= e.src.count("\n") + 1 else ""
        return {"file": filename, "line": line, "function": name, "text": text,
                "message": (e.error_message or "").strip() or type(e).__name__}
    return None


def _sources(kernel):
    """Each rebuilt JIT function's source text -> (file, line of its def, name)."""
    from triton.runtime.jit import JITCallable

    found, todo = {}, [kernel]
    while todo:
        fn = todo.pop()
        if fn._src in found:
            continue
        found[fn._src] = (fn.file_name, fn.def_file_line_number, fn.fn.__name__)
        todo += [v for v in fn.fn.__globals__.values() if isinstance(v, JITCallable) and hasattr(v, "_src")
                 and (v.fn.__module__ or "").split(".")[0] != "triton"]     # rebuilt functions have no module
    return found


@contextlib.contextmanager
def _stderr_to(path):
    """Send file descriptor 2 (where MLIR and ptxas print) to a file while compiling."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "w") as f:
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _binary_report(cubin, name, workdir):
    from triton import knobs

    path = os.path.join(workdir, name + ".cubin")
    with open(path, "wb") as f:
        f.write(cubin)
    tool = knobs.nvidia.cuobjdump.path
    usage = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True, check=True).stdout
    sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
    m = _REG.search(usage)
    registers, stack, static_shared, local = (int(g) for g in m.groups()) if m else (None, None, 0, None)
    return registers, stack, static_shared, local, sass


def compile_job(job, workdir):
    """One record: compiles or not (with the compiler's message), registers, spills,
    shared memory, tensor-core instructions; the IR and SASS texts asked for."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = TARGETS[job["target"]]
    spec = job["spec"]
    record = {"target": target.name, "arch": target.arch, "num_warps": spec["options"].get("num_warps", 4),
              "num_stages": spec["options"].get("num_stages", 3), "compiles": False}
    try:
        # rebuilt for every job: Triton checks a function's references once and
        # remembers it, so a kernel compiled again would fail with another message
        kernel = rebuild(job["kernel"])
    except Exception as e:          # noqa: BLE001 - reported to the reader, whatever it is
        record["error"] = f"the kernel could not be rebuilt for compiling: {type(e).__name__}: {e}"[:_MESSAGE_LIMIT]
        return record
    constexprs = {tuple(path): _value(value, {}) for path, value in spec["constexprs"]}
    attrs = {tuple(path): value for path, value in spec["attrs"]}
    log, stderr_path = io.StringIO(), os.path.join(workdir, "stderr.txt")
    knobs.nvidia.dump_ptxas_log = True
    _locate_dependency_errors()
    try:
        with contextlib.redirect_stdout(log), _stderr_to(stderr_path):
            compiled = triton.compile(ASTSource(kernel, spec["signature"], constexprs, attrs),
                                      target=GPUTarget("cuda", target.capability, 32), options=spec["options"])
    except Exception as e:          # noqa: BLE001
        with open(stderr_path) as f:
            diagnostics = f.read().strip()
        record["where"] = _location(e, _sources(kernel))
        text = str(e).strip() or type(e).__name__
        if diagnostics and "PassManager" in text:
            text = diagnostics[-_MESSAGE_LIMIT // 2:] + "\n" + text
        record["error"] = f"{type(e).__name__}: {text}"[:_MESSAGE_LIMIT]
        return record
    registers, stack, static_shared, local, sass = _binary_report(compiled.asm["cubin"], compiled.name, workdir)
    spills = _spills(log.getvalue())
    opcodes = sass_opcodes(sass)
    record.update(compiles=True, registers=registers, stack=stack, local=local,
                  shared=compiled.metadata.shared + static_shared,
                  spill_stores=spills[1] if spills else None, spill_loads=spills[2] if spills else None,
                  local_stores=opcodes.get("STL", 0), local_loads=opcodes.get("LDL", 0),
                  mma=tensor_core_instructions(opcodes))
    wanted = set(job.get("artefacts", ()))
    if wanted:
        texts = {k: v for k, v in compiled.asm.items() if isinstance(v, str)}
        texts["sass"] = sass
        record["artefacts"] = {k: texts[k] for k in wanted if k in texts}
    return record


def _cpu_seconds():
    """CPU time of this process and of the tools it ran (ptxas, cuobjdump)."""
    own, tools = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + tools.ru_utime + tools.ru_stime


def main():
    """Serve jobs from stdin until it closes. Results go to the original stdout;
    anything else printed (by Triton, ptxas or MLIR) is kept out of it."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    problem = backend_problem()
    with tempfile.TemporaryDirectory() as workdir:
        for line in sys.stdin:
            job = json.loads(line)
            if problem:
                record = {"target": job["target"], "compiles": None, "error": problem}
            else:
                try:
                    before = _cpu_seconds()
                    record = compile_job(job, workdir)
                    record["cpu_seconds"] = round(_cpu_seconds() - before, 2)
                except Exception:   # noqa: BLE001 - a fault here must not lose the other jobs
                    record = {"target": job["target"], "compiles": False,
                              "error": "the compile report failed: " + traceback.format_exc()[-_MESSAGE_LIMIT:]}
            out.write(json.dumps({"id": job["id"], "record": record}) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
