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
