"""The loop of the processes that coursekit.compile_report starts (coursekit.compile_worker
and coursekit.binary_report): JSON jobs, one a line, on stdin; one JSON line
{"id", "record"} per job on the original stdout, where nothing else is written
(Triton, ptxas and MLIR print to stdout and stderr; both go to stderr)."""
import json
import os
import resource
import sys
import tempfile
import traceback

MESSAGE_LIMIT = 4000            # characters of an error message a record keeps


def _cpu_seconds():
    """CPU time of this process and of the tools it ran (ptxas, cuobjdump)."""
    own, tools = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + tools.ru_utime + tools.ru_stime


def serve(answer, failure):
    """answer(job, workdir) -> record for each job until stdin closes, with the CPU seconds it
    took; a fault becomes a record that does not compile, its message after `failure`, so
    that it does not lose the other jobs. workdir: a scratch folder kept for the process."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    with tempfile.TemporaryDirectory() as workdir:
        for line in sys.stdin:
            job = json.loads(line)
            before = _cpu_seconds()
            try:
                record = answer(job, workdir)
            except Exception:       # noqa: BLE001 - whatever it is, the reader is told
                record = {"compiles": False, "error": failure + traceback.format_exc()[-MESSAGE_LIMIT:]}
            record["cpu_seconds"] = round(_cpu_seconds() - before, 2)
            out.write(json.dumps({"id": job["id"], "record": record}) + "\n")
            out.flush()
