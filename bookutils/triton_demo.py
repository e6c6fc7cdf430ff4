"""Small Triton kernels that introduce the programming model on the page
"Triton from zero": who-wrote-what, vector addition, row-wise softmax and a
tiled matrix product. Each kernel comes with a launcher that allocates the
output and chooses the grid. On a machine without a GPU they run under Triton's
interpreter (TRITON_INTERPRET=1, set by coursekit.triton_env).

The kernels keep Triton's 32-bit program ids and offsets, which stay below
2**31; the launchers refuse tensors whose offsets would reach that (a large
tensor, or a strided view whose rows lie far apart) rather than let an offset
wrap around (the kernels of triton_kernels.py convert to 64 bits instead)."""
import torch

from coursekit.triton_env import triton_device

DEVICE = triton_device(quiet=True)   # must come before any @triton.jit below

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

INT32_ELEMENTS = 2**31      # 32-bit offsets stay below this


def _reach(t):
    """How many elements the kernels' offsets into t span: its element count (the
    vector kernels count elements) or its last element's offset plus one (a strided
    view's rows)."""
    if t.numel() == 0:
        return 0
    return max(t.numel(), 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())))


def _fits_int32(*tensors):
    """Refuse tensors too large for the 32-bit offsets of these demonstration kernels."""
    for t in tensors:
        if _reach(t) >= INT32_ELEMENTS:
            raise ValueError(f"a tensor of shape {tuple(t.shape)} and strides {t.stride()} spans {_reach(t):,} "
                             f"elements, too many for these kernels' 32-bit offsets (fewer than {INT32_ELEMENTS:,})")


# ---------------------------------------------------------------- one program per block of a vector

@triton.jit
def program_ids_kernel(OUT, n, BLOCK: tl.constexpr):
    """Every program writes its own id into the elements it is responsible for."""
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(OUT + offsets, tl.full((BLOCK,), pid, dtype=tl.int32), mask=offsets < n)


def program_ids(n, block):
    """Which program wrote each of n elements, blocks of `block` per program."""
    out = torch.full((n,), -1, dtype=torch.int32, device=DEVICE)
    _fits_int32(out)
    program_ids_kernel[(triton.cdiv(n, block),)](out, n, BLOCK=block)
    return out


@triton.jit
def add_kernel(X, Y, OUT, n, BLOCK: tl.constexpr):
    """OUT = X + Y for one block of BLOCK elements; lanes past n are masked off."""
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    x = tl.load(X + offsets, mask=inside)
    y = tl.load(Y + offsets, mask=inside)
    tl.store(OUT + offsets, x + y, mask=inside)


def vector_add(x, y, block=64):
    """x + y for two 1-D tensors of equal length, by add_kernel."""
    assert x.shape == y.shape and x.dim() == 1
    x, y = x.contiguous(), y.contiguous()      # the kernel indexes X + offsets: one element apart
    _fits_int32(x, y)
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel[(triton.cdiv(n, block),)](x, y, out, n, BLOCK=block)
    return out


# ---------------------------------------------------------------- one program per row

@triton.jit
def softmax_row_kernel(X, OUT, n_cols, x_row_stride, out_row_stride,
                       BLOCK: tl.constexpr, FILL: tl.constexpr):
    """Softmax of one row. The row is padded to BLOCK lanes; the padding lanes are
    loaded as FILL, which must be -inf for the result to be the softmax of the row."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(X + row * x_row_stride + cols, mask=inside, other=FILL)
    x_max = tl.max(x, axis=0)
    e = tl.exp(x - x_max)
    total = tl.sum(e, axis=0)
    tl.store(OUT + row * out_row_stride + cols, e / total, mask=inside)


def softmax_rows_triton(x, fill=-float("inf")):
    """Softmax over the last axis of a 2-D tensor whose rows are contiguous (the
    rows themselves may lie any distance apart), one program per row."""
    assert x.dim() == 2 and x.stride(1) == 1
    _fits_int32(x)
    n_rows, n_cols = x.shape
    out = torch.empty(n_rows, n_cols, device=x.device, dtype=x.dtype)
    softmax_row_kernel[(n_rows,)](x, out, n_cols, x.stride(0), out.stride(0),
                                  BLOCK=triton.next_power_of_2(n_cols), FILL=fill)
    return out


# ---------------------------------------------------------------- one program per output tile

@triton.jit
def matmul_kernel(A, B, C, M, N, K,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One BLOCK_M x BLOCK_N tile of C = A B (row-major, contiguous), accumulated
    in float32 over BLOCK_K-wide slices of the inner dimension."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(A + rows[:, None] * K + ks[None, :],
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(B + ks[:, None] * N + cols[None, :],
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(C + rows[:, None] * N + cols[None, :], acc,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def matmul_triton(a, b, block_m=32, block_n=32, block_k=32):
    """a @ b for 2-D tensors, by matmul_kernel; the result is float32."""
    a, b = a.contiguous(), b.contiguous()
    (m, k), (k2, n) = a.shape, b.shape
    assert k == k2, "inner dimensions differ"
    c = torch.empty(m, n, device=a.device, dtype=torch.float32)
    _fits_int32(a, b, c)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    matmul_kernel[grid](a, b, c, m, n, k, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return c
