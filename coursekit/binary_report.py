"""The second half of a compile report, in a process that never runs the kernel
author's code: from the PTX that coursekit.compile_worker made, the binary a GPU
would get (Triton's own ptxas call) and what it holds (registers, spills, shared
memory, tensor-core instructions, read with cuobjdump).

Why two processes: rebuilding a kernel runs its author's Python (default
arguments, annotations, constexpr functions, and anything a kernel body reaches
through getattr while Triton's front end walks it), so the compiling process may
say anything about itself. This one reads only text: the PTX must declare the
kernel that was sent (its name, the target's architecture, line information
from the kernel's own source lines), and everything reported about the binary
comes from tools run here.

It serves jobs as coursekit.job_server says. It must run without Triton's
interpreter; coursekit.compile_report starts it."""
import collections
import contextlib
import io
import os
import re
import subprocess

from coursekit.job_server import MESSAGE_LIMIT, serve

REFUSED = "the compiler's output could not be checked"    # begins the error of PTX that is not the kernel's
PTX_LIMIT = 64 * 1024 * 1024     # bytes; Chapter 4's largest kernel is under 100 KiB of PTX
_OPCODE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)")
_REG = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")
_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_ENTRY = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([A-Za-z_$%][\w$]*)", re.M)
_TARGET = re.compile(r"^\s*\.target\s+([\w]+)", re.M)
_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+("[^"]*"(?:\s*,?\s*"[^"]*")?)', re.M)
_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s", re.M)


def sass_opcodes(sass):
    """How many times each SASS instruction (opcode without modifiers) appears in a listing."""
    return collections.Counter(m.group(1) for line in sass.splitlines() if (m := _OPCODE.match(line)))


def tensor_core_instructions(opcodes):
    """The matrix-multiply-accumulate instructions: HMMA (warp-level, sm_70 on), HGMMA
    (warpgroup-level, sm_90), and their integer and 8-bit float relatives."""
    return {op: n for op, n in sorted(opcodes.items()) if op.endswith("MMA")}


def ptx_problem(ptx, name, arch, source):
    """Why this PTX is not the kernel that was sent, or None. source: (file, first
    line, last line) of the kernel's own source; Triton's line information cites
    it in every kernel it compiles."""
    if not isinstance(ptx, str) or not ptx:
        return "the compiling process returned no PTX"
    if len(ptx) > PTX_LIMIT:
        return f"the compiling process returned {len(ptx)} bytes of PTX, more than the {PTX_LIMIT} accepted"
    entries = _ENTRY.findall(ptx)
    if entries != [name]:
        return f"the PTX declares the kernels {entries}, not {name!r} alone"
    targets = _TARGET.findall(ptx)
    if targets != [arch]:
        return f"the PTX is for {', '.join(targets) or 'no target'}, not {arch}"
    filename, first, last = source
    files = {number for number, path in _FILE.findall(ptx) if _path(path) == filename}
    if not any(f in files and first <= int(line) <= last for f, line in _LOC.findall(ptx)):
        return f"the PTX has no line information from {name}'s source ({filename}, lines {first}-{last})"
    return None


def _path(quoted):
    """The file a .file directive names: "path", or "directory" "name" (DWARF 5)."""
    parts = re.findall(r'"([^"]*)"', quoted)
    return parts[0] if len(parts) == 1 else os.path.join(*parts)


def _spills(ptxas_log):
    stack = stores = loads = 0
    found = False
    for m in _SPILLS.finditer(ptxas_log):
        found = True
        stack, stores, loads = max(stack, int(m.group(1))), stores + int(m.group(2)), loads + int(m.group(3))
    return (stack, stores, loads) if found else None


def _assemble(ptx, capability, options):
    """(cubin, ptxas's log) from Triton's own ptxas call for this target and options."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend

    backend = CUDABackend(GPUTarget("cuda", capability, 32))
    opt = backend.parse_options(dict(options))
    knobs.nvidia.dump_ptxas_log = True
    log = io.StringIO()
    with contextlib.redirect_stdout(log):       # Triton prints ptxas's log, and on failure the PTX
        cubin = backend.make_cubin(ptx, {}, opt, capability)
    return cubin, log.getvalue()


def _read_binary(cubin, workdir):
    from triton import knobs

    path = os.path.join(workdir, "kernel.cubin")
    with open(path, "wb") as f:
        f.write(cubin)
    tool = knobs.nvidia.cuobjdump.path
    usage = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True, check=True).stdout
    sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
    m = _REG.search(usage)
    registers, stack, static_shared, local = (int(g) for g in m.groups()) if m else (None, None, 0, None)
    return registers, stack, static_shared, local, sass


def binary_job(job, workdir):
    """The record's binary fields, or compiles False with why the PTX was refused or
    did not assemble. job: ptx, name, arch, capability, options, source, sass (bool)."""
    problem = ptx_problem(job["ptx"], job["name"], job["arch"], tuple(job["source"]))
    if problem:
        return {"compiles": False, "error": f"{REFUSED}: {problem}"}
    try:
        cubin, log = _assemble(job["ptx"], job["capability"], job["options"])
    except Exception as e:          # noqa: BLE001 - ptxas's refusal, reported to the reader
        return {"compiles": False, "error": f"ptxas did not assemble the PTX: {type(e).__name__}: {e}"[
            :MESSAGE_LIMIT]}
    registers, stack, static_shared, local, sass = _read_binary(cubin, workdir)
    spills = _spills(log)
    opcodes = sass_opcodes(sass)
    record = {"compiles": True, "registers": registers, "stack": stack, "local": local,
              "static_shared": static_shared, "spill_stores": spills[1] if spills else None,
              "spill_loads": spills[2] if spills else None, "local_stores": opcodes.get("STL", 0),
              "local_loads": opcodes.get("LDL", 0), "mma": tensor_core_instructions(opcodes)}
    if job.get("sass"):
        record["sass"] = sass
    return record


def main():
    serve(binary_job, "reading the binary failed: ")


if __name__ == "__main__":
    main()
