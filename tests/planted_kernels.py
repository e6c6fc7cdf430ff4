"""Kernels with planted mistakes that Triton's interpreter forgives and its GPU
compiler does not, for tests/test_compile_report.py. Each computes exp(x)."""
import numpy as np
import triton
import triton.language as tl


def plain_exp(x):
    """A helper without @triton.jit."""
    return tl.exp(x)


@triton.jit
def numpy_exp_kernel(X, OUT, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offsets, mask=offsets < n)
    tl.store(OUT + offsets, np.exp(x), mask=offsets < n)           # NumPy inside a kernel


@triton.jit
def plain_helper_kernel(X, OUT, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offsets, mask=offsets < n)
    tl.store(OUT + offsets, plain_exp(x), mask=offsets < n)        # an un-jitted helper


@triton.jit
def _jitted_exp(x):
    return np.exp(x)                                               # NumPy one call deeper


@triton.jit
def nested_numpy_kernel(X, OUT, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offsets, mask=offsets < n)
    tl.store(OUT + offsets, _jitted_exp(x), mask=offsets < n)


@triton.jit
def correct_exp_kernel(X, OUT, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offsets, mask=offsets < n)
    tl.store(OUT + offsets, tl.exp(x), mask=offsets < n)


@triton.jit
def ragged_arange_kernel(OUT, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)                                  # BLOCK must be a power of 2
    tl.store(OUT + offsets, offsets)


def _report_compiled():
    """A kernel's default argument runs when the compiling process rebuilds the kernel
    (the expression travels with the kernel's source): from there on, that process
    answers every job with a compiled kernel's report."""
    import json
    import sys

    frame = sys._getframe()
    while frame is not None and frame.f_code.co_name != "compile_job":
        frame = frame.f_back
    if frame is None or getattr(json, "lying", False):        # defining or launching the kernel: do nothing
        return 0
    honest = json.dumps

    def dumps(obj, *args, **kwargs):
        if isinstance(obj, dict) and isinstance(obj.get("record"), dict):
            record = {k: v for k, v in obj["record"].items() if k not in ("error", "where", "ptx")}
            record.update(compiles=True, registers=40, spill_stores=0, spill_loads=0, shared=0, mma={"HGMMA": 8})
            obj = {**obj, "record": record}
        return honest(obj, *args, **kwargs)

    json.dumps, json.lying = dumps, True
    return 0


@triton.jit
def lying_kernel(X, OUT, n, BLOCK: tl.constexpr,
                 LIE: tl.constexpr = __import__("tests.planted_kernels", fromlist=["_"])._report_compiled()):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offsets, mask=offsets < n)
    tl.store(OUT + offsets, plain_exp(x), mask=offsets < n)        # does not compile
