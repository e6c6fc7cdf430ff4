"""Whether a kernel compiles, and what its binary holds, is decided in a process
that runs none of the kernel author's code (coursekit.binary_report): the
compiling process rebuilds the kernel, which runs its default arguments and
more, so it could report anything. A student's kernel that lies from inside the
compiling process gets no binary; PTX that is not the kernel sent is refused;
and the binary made from the PTX is the one Triton's own pipeline makes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from coursekit import compile_report as cr
from coursekit.binary_report import REFUSED, ptx_problem
from coursekit.compile_worker import backend_problem
from coursekit.gpu_targets import TARGETS

pytestmark = pytest.mark.skipif(backend_problem() is not None, reason=str(backend_problem()))
ROOT = Path(__file__).resolve().parent.parent


def _spec(kernel, **constexprs):
    x = torch.empty(100)
    return cr.specialise(kernel, x, torch.empty_like(x), 100, BLOCK=64, **constexprs)


def test_a_compiling_process_that_lies_gets_no_binary(monkeypatch):
    from tests import planted_kernels as pk

    monkeypatch.setattr(cr, "_MEMORY", {})
    monkeypatch.delenv(cr.CACHE_ENV, raising=False)
    report = cr.compile_report(pk.lying_kernel, _spec(pk.lying_kernel), targets=("A100", "H100"))
    for t in report.targets:
        assert t.compiles is False and t.registers is None and t.mma == {}
        assert "could not be checked: the compiling process returned no PTX" in t.error
    # the same kernel without its lie is reported as the compiler's refusal, with the line
    honest = cr.compile_report(pk.plain_helper_kernel, _spec(pk.plain_helper_kernel), targets=("A100",))["A100"]
    assert honest.compiles is False and "Unsupported function referenced" in honest.where["message"]


@pytest.fixture(scope="module")
def add_ptx():
    """The PTX of the book's add_kernel for an H100, and where its source is."""
    import inspect

    from bookutils.triton_demo import add_kernel
    from coursekit.kernel_source import raw_function

    x = torch.empty(64)
    report = cr.compile_report(add_kernel, cr.specialise(add_kernel, x, x, x, 64, BLOCK=32), targets=("H100",),
                               artefacts=("ptx",))
    fn = raw_function(add_kernel)
    lines, first = inspect.getsourcelines(fn)
    return report["H100"].artefacts["ptx"], (fn.__code__.co_filename, first, first + len(lines) - 1)


def test_the_ptx_of_the_kernel_sent_is_accepted(add_ptx):
    ptx, source = add_ptx
    assert ptx_problem(ptx, "add_kernel", TARGETS["H100"].arch, source) is None


@pytest.mark.parametrize("change, problem", [
    (lambda ptx, source: (ptx, "other_kernel", "sm_90a", source), "declares the kernels ['add_kernel']"),
    (lambda ptx, source: (ptx, "add_kernel", "sm_80", source), "is for sm_90a, not sm_80"),
    (lambda ptx, source: (ptx, "add_kernel", "sm_90a", ("<cell 4>",) + source[1:]), "no line information"),
    (lambda ptx, source: (ptx, "add_kernel", "sm_90a", (source[0], source[2] + 1, source[2] + 30)),
     "no line information"),
    (lambda ptx, source: (ptx + ptx[ptx.index(".visible .entry"):], "add_kernel", "sm_90a", source),
     "declares the kernels ['add_kernel', 'add_kernel']"),
    (lambda ptx, source: ("", "add_kernel", "sm_90a", source), "returned no PTX"),
])
def test_ptx_that_is_not_the_kernel_sent_is_refused(add_ptx, change, problem):
    assert problem in ptx_problem(*change(*add_ptx))


_TRITONS_OWN = """
import json, subprocess, sys
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from coursekit.kernel_source import _value, rebuild
job = json.loads(sys.stdin.read())
spec = job["spec"]
compiled = triton.compile(
    ASTSource(rebuild(job["kernel"]), spec["signature"], {tuple(p): _value(v, {}) for p, v in spec["constexprs"]},
              {tuple(p): v for p, v in spec["attrs"]}),
    target=GPUTarget("cuda", job["capability"], 32), options=spec["options"])
open("kernel.cubin", "wb").write(compiled.asm["cubin"])
print(subprocess.run([knobs.nvidia.cuobjdump.path, "-res-usage", "kernel.cubin"], capture_output=True, text=True,
                     check=True).stdout)
"""


@pytest.mark.parametrize("target", ["A100", "H100"])
def test_the_binary_is_the_one_tritons_own_pipeline_makes(target, tmp_path):
    """Registers and shared memory of the tuned forward kernel, compiled by Triton
    from start to binary in one process, against the report's two processes."""
    import re

    from bookutils import kernel_launches as kl
    from coursekit.kernel_source import describe

    launch = kl.tuned_launches()[0]
    report = cr.compile_reports([launch], targets=(target,))[0][target]
    job = {"kernel": describe(launch.kernel), "spec": launch.spec.as_job(list(cr._arg_names(
        cr.raw_function(launch.kernel)))), "capability": TARGETS[target].capability}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path / "cache"), TRITON_DEFAULT_FP_FUSION="1")
    usage = subprocess.run([sys.executable, "-c", _TRITONS_OWN], input=json.dumps(job), capture_output=True,
                           text=True, cwd=tmp_path, env=env, check=True).stdout
    registers = int(re.search(r"REG:(\d+)", usage).group(1))
    assert report.compiles and report.registers == registers and report.registers > 32


def test_what_a_lying_process_says_of_other_kernels_is_not_kept(monkeypatch):
    """The lie lasts for the rest of its process: a correct kernel compiled after it there is
    refused, and that refusal is not what the next compile of the same kernel gets."""
    from tests import planted_kernels as pk

    monkeypatch.setattr(cr, "_MEMORY", {})
    monkeypatch.delenv(cr.CACHE_ENV, raising=False)        # compiled here, not found on disk
    launches = [cr.Launch(pk.lying_kernel, _spec(pk.lying_kernel)),
                cr.Launch(pk.correct_exp_kernel, _spec(pk.correct_exp_kernel))]
    lied_to = cr.compile_reports(launches, targets=("A100",), workers=1)[1]["A100"]
    assert lied_to.refused()
    assert cr.compile_report(pk.correct_exp_kernel, _spec(pk.correct_exp_kernel), targets=("A100",)).compiles


def test_a_report_that_is_not_one_is_refused(tmp_path):
    import sys

    for answer in ("not json", '{"id": "another job", "record": {"compiles": true}}', '{"id": 1, "record": 3}'):
        talk = f"import sys; sys.stdin.readline(); print({answer!r}, flush=True); sys.stdin.readline()"
        worker = cr._Worker(str(tmp_path), command=lambda workdir: [sys.executable, "-c", talk])
        record = worker.run({"id": 1, "target": "A100"}, timeout=30)
        worker.close()
        assert record["compiles"] is False and record["error"].startswith(REFUSED)
