"""The backward pass of standard attention as separate Triton kernels, one head,
for counting its memory traffic in Triton's interpreter (Chapter 4).

P comes stored from the forward pass, and dP and dS are written to memory
between kernels: this is the backward that FlashAttention avoids. Every
product goes through one tiled matrix-product kernel whose operands are read
through strides, so a transpose costs nothing. The kernels keep 32-bit offsets:
they serve the small sizes a count in the interpreter can afford, and
staged_backward refuses an n x n matrix of 2**31 elements or more."""
import math

import torch

from coursekit.triton_env import triton_device

triton_device(quiet=True)   # must come before Triton is imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

BLOCK = 32          # rows, columns and inner dimension of every product tile


@triton.jit
def _product_kernel(A, B, C, m, n, inner, a_row, a_col, b_row, b_col, alpha,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """C[block] = alpha * A[rows, :] @ B[:, cols]; C contiguous (m x n)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, inner, BLOCK_K):
        mid = start + tl.arange(0, BLOCK_K)
        a = tl.load(A + rows[:, None] * a_row + mid[None, :] * a_col,
                    mask=(rows[:, None] < m) & (mid[None, :] < inner), other=0.0)
        b = tl.load(B + mid[:, None] * b_row + cols[None, :] * b_col,
                    mask=(mid[:, None] < inner) & (cols[None, :] < n), other=0.0)
        acc += tl.dot(a, b)
    tl.store(C + rows[:, None] * n + cols[None, :], acc * alpha, mask=(rows[:, None] < m) & (cols[None, :] < n))


@triton.jit
def _row_dot_kernel(X, Y, Out, n, d, BLOCK_M: tl.constexpr, HEAD: tl.constexpr):
    """Out[i] = sum_c X[i, c] * Y[i, c] for one block of rows."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, HEAD)
    mask = (rows[:, None] < n) & (cols[None, :] < d)
    x = tl.load(X + rows[:, None] * d + cols[None, :], mask=mask, other=0.0)
    y = tl.load(Y + rows[:, None] * d + cols[None, :], mask=mask, other=0.0)
    tl.store(Out + rows, tl.sum(x * y, axis=1), mask=rows < n)


@triton.jit
def _score_grad_kernel(P, DP, Delta, DS, n, ROW: tl.constexpr):
    """One row: dS = P * (dP - D)."""
    i = tl.program_id(0)
    cols = tl.arange(0, ROW)
    p = tl.load(P + i * n + cols, mask=cols < n, other=0.0)
    dp = tl.load(DP + i * n + cols, mask=cols < n, other=0.0)
    tl.store(DS + i * n + cols, p * (dp - tl.load(Delta + i)), mask=cols < n)


def _product(a, b, alpha=1.0):
    """alpha * a @ b for 2-D tensors of any strides (a transposed view is read in place)."""
    m, inner = a.shape
    n = b.shape[1]
    c = torch.empty(m, n, device=a.device, dtype=torch.float32)
    _product_kernel[(triton.cdiv(m, BLOCK), triton.cdiv(n, BLOCK))](
        a, b, c, m, n, inner, a.stride(0), a.stride(1), b.stride(0), b.stride(1), alpha,
        BLOCK_M=BLOCK, BLOCK_N=BLOCK, BLOCK_K=BLOCK)
    return c


def staged_backward(q, k, v, o, p, do):
    """(dQ, dK, dV) of one head, float32 (n, d) tensors, from the stored n x n P."""
    n, d = q.shape
    if n * n >= 2**31:
        raise ValueError(f"staged_backward: an n x n matrix for n = {n} is too large for 32-bit offsets")
    scale = 1.0 / math.sqrt(d)
    delta = torch.empty(n, device=q.device, dtype=torch.float32)
    _row_dot_kernel[(triton.cdiv(n, BLOCK),)](o, do, delta, n, d, BLOCK_M=BLOCK,
                                              HEAD=max(16, triton.next_power_of_2(d)))
    dv = _product(p.T, do)
    dp = _product(do, v.T)
    ds = torch.empty_like(dp)
    _score_grad_kernel[(n,)](p, dp, delta, ds, n, ROW=max(16, triton.next_power_of_2(n)))
    return _product(ds, k, scale), _product(ds.T, q, scale), dv


def product_elements(m, inner, n, block=BLOCK):
    """Elements moved by _product for an (m x inner) @ (inner x n) product: each of the
    ceil(n / block) column blocks reads all of A, each of the ceil(m / block) row
    blocks reads all of B, and C is written once."""
    return m * inner * math.ceil(n / block) + inner * n * math.ceil(m / block) + m * n


def staged_backward_elements(n, d, block=BLOCK):
    """Elements moved by staged_backward: D from O and dO, the products
    dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q, and dS = P * (dP - D)
    read as two n x n matrices and written as one."""
    row_dot = 2 * n * d + n
    score_grad = 3 * n * n + n
    return (row_dot + score_grad + product_elements(n, n, d, block) + product_elements(n, d, n, block)
            + 2 * product_elements(n, n, d, block))
