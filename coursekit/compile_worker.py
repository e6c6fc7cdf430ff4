"""The compiling process behind coursekit.compile_report: it serves jobs (a kernel
described by coursekit.kernel_source, one launch's specialisation, one target)
as coursekit.job_server says, answering each with the PTX Triton's compiler
made of the kernel for that GPU, or the compiler's message and the kernel line
it points at.

Rebuilding and compiling a kernel runs its author's code, so nothing this
process says about the binary is believed: coursekit.binary_report, in a process
that runs no such code, assembles the PTX and reads the binary.

It must run without Triton's interpreter (TRITON_INTERPRET unset), in a process
of its own: coursekit.compile_report starts it so."""
import contextlib
import os
import sys

from coursekit.gpu_targets import TARGETS
from coursekit.job_server import MESSAGE_LIMIT, serve
from coursekit.kernel_source import _value, rebuild


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


def _without_binary(*args):
    """Triton's stages hook: stop at PTX (the binary is made by coursekit.binary_report).
    Triton calls it with no arguments for a cache key, then with the stages among them."""
    if not args:
        return "without-binary", "without-binary"
    stages = next(a for a in args if isinstance(a, dict))
    stages["cubin"] = lambda src, metadata: b""
    return None


def compile_job(job, workdir):
    """One record: the PTX, the kernel's name and Triton's dynamic shared memory, or
    the compiler's message; the IR texts asked for."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = TARGETS[job["target"]]
    spec = job["spec"]
    record = {"compiles": False}        # the target, its name and the options are the caller's to say
    try:
        # rebuilt for every job: Triton checks a function's references once and
        # remembers it, so a kernel compiled again would fail with another message
        kernel = rebuild(job["kernel"])
    except Exception as e:          # noqa: BLE001 - reported to the reader, whatever it is
        record["error"] = f"the kernel could not be rebuilt for compiling: {type(e).__name__}: {e}"[:MESSAGE_LIMIT]
        return record
    constexprs = {tuple(path): _value(value, {}) for path, value in spec["constexprs"]}
    attrs = {tuple(path): value for path, value in spec["attrs"]}
    stderr_path = os.path.join(workdir, "stderr.txt")
    if hasattr(knobs.runtime, "add_stages_inspection_hook"):     # older Triton makes the binary, unused
        knobs.runtime.add_stages_inspection_hook = _without_binary
    _locate_dependency_errors()
    try:
        with _stderr_to(stderr_path):
            compiled = triton.compile(ASTSource(kernel, spec["signature"], constexprs, attrs),
                                      target=GPUTarget("cuda", target.capability, 32), options=spec["options"])
    except Exception as e:          # noqa: BLE001
        with open(stderr_path) as f:
            diagnostics = f.read().strip()
        record["where"] = _location(e, _sources(kernel))
        text = str(e).strip() or type(e).__name__
        if diagnostics and "PassManager" in text:
            text = diagnostics[-MESSAGE_LIMIT // 2:] + "\n" + text
        record["error"] = f"{type(e).__name__}: {text}"[:MESSAGE_LIMIT]
        return record
    record.update(compiles=True, name=compiled.name, ptx=compiled.asm["ptx"], shared=compiled.metadata.shared)
    wanted = set(job.get("artefacts", ()))
    if wanted:
        texts = {k: v for k, v in compiled.asm.items() if isinstance(v, str)}
        record["artefacts"] = {k: texts[k] for k in wanted if k in texts}
    return record


def main():
    """Serve jobs (coursekit.job_server); without an NVIDIA back end, say why for each."""
    problem = backend_problem()
    if problem:
        serve(lambda job, workdir: {"compiles": None, "error": problem}, "")
    else:
        serve(compile_job, "the compile report failed: ")


if __name__ == "__main__":
    main()
