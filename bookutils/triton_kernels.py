"""The Triton kernels of Chapter 4: standard attention as three kernels that pass
S and P through memory, and the fused FlashAttention forward kernel. Tensors are
(batch, heads, n, d), in any layout whose last axis has unit stride (a transposed
(batch, n, heads, d) view, for instance): the kernels take each tensor's strides
instead of a contiguous copy. q, k and v must agree in every dimension and in
dtype: self-attention with as many key-value heads as query heads. The launch
grid numbers the (batch, head) pairs along its axis 1, which CUDA limits to
65,535 programs, so batch * heads may not exceed that. On a machine without a GPU
the kernels run under Triton's interpreter (TRITON_INTERPRET=1, set by
coursekit.triton_env)."""
import math

import torch

from coursekit.triton_env import triton_device

DEVICE = triton_device(quiet=True)   # must come before any @triton.jit below

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


GRID_AXIS_1 = 65_535      # the most programs CUDA launches along grid axis 1 (the batch * heads axis here)


def _check_inputs(caller, q, k, v):
    """(batch, heads, n, d) of q, k and v, or a ValueError that names what the kernels cannot read."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{caller}: {name} must be a (batch, heads, n, d) tensor, got {shape}")
    if not q.shape == k.shape == v.shape:
        raise ValueError(f"{caller}: q, k and v must have the same (batch, heads, n, d), got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"{caller}: q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"{caller}: q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    batch, heads, n, d = q.shape
    if batch * heads > GRID_AXIS_1:
        raise ValueError(f"{caller}: batch * heads = {batch * heads:,} programs along grid axis 1 exceed "
                         f"CUDA's limit of {GRID_AXIS_1:,}")
    return batch, heads, n, d


def _unit_last_stride(*tensors):
    """The tensors themselves, copied only where the head dimension is not contiguous."""
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in tensors)


def _strides(t):
    """Batch, head and sequence strides of a (batch, heads, n, d) tensor, in elements."""
    return t.stride(0), t.stride(1), t.stride(2)


# ---------------------------------------------------------------- standard attention, three kernels

@triton.jit
def _scores_kernel(Q, K, S, n, d, heads, scale, stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD: tl.constexpr):
    """S[bh, rows, :] = scale * Q K^T for one block of rows, written to memory."""
    row_block = tl.program_id(0).to(tl.int64)    # int64: offsets into large tensors pass 2**31
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // heads, bh % heads
    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD)
    q = tl.load(Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qn + dims[None, :],
                mask=(rows[:, None] < n) & (dims[None, :] < d), other=0.0)
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    for col_start in range(0, n, BLOCK_N):
        cols = col_start + offs_n
        k = tl.load(K + b * stride_kb + h * stride_kh + cols[:, None] * stride_kn + dims[None, :],
                    mask=(cols[:, None] < n) & (dims[None, :] < d), other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        tl.store(S + bh * n * n + rows[:, None] * n + cols[None, :], s, mask=(rows[:, None] < n) & (cols[None, :] < n))


@triton.jit
def _softmax_kernel(S, P, n, ROW: tl.constexpr):
    """P = softmax(S) one row per program: read a row of S, write a row of P."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, ROW)
    s = tl.load(S + row * n + cols, mask=cols < n, other=-float("inf"))
    e = tl.exp(s - tl.max(s, axis=0))
    tl.store(P + row * n + cols, e / tl.sum(e, axis=0), mask=cols < n)


@triton.jit
def _weighted_sum_kernel(P, V, O, n, d, heads, stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD: tl.constexpr):
    """O = P V for one block of rows, reading P back from memory."""
    row_block = tl.program_id(0).to(tl.int64)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // heads, bh % heads
    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD)
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    acc = tl.zeros((BLOCK_M, HEAD), dtype=tl.float32)
    for col_start in range(0, n, BLOCK_N):
        cols = col_start + offs_n
        p = tl.load(P + bh * n * n + rows[:, None] * n + cols[None, :], mask=(rows[:, None] < n) & (cols[None, :] < n), other=0.0)
        v = tl.load(V + b * stride_vb + h * stride_vh + cols[:, None] * stride_vn + dims[None, :],
                    mask=(cols[:, None] < n) & (dims[None, :] < d), other=0.0)
        acc += tl.dot(p.to(v.dtype), v)          # tl.dot needs operands of one dtype (P is float32)
    tl.store(O + b * stride_ob + h * stride_oh + rows[:, None] * stride_on + dims[None, :], acc,
             mask=(rows[:, None] < n) & (dims[None, :] < d))


def standard_attention(q, k, v, block_m=32, block_n=32):
    """softmax(QK^T / sqrt(d)) V with S and P stored in memory between kernels."""
    batch, heads, n, d = _check_inputs("standard_attention", q, k, v)
    q, k, v = _unit_last_stride(q, k, v)
    head = max(16, triton.next_power_of_2(d))
    s = torch.empty(batch * heads, n, n, device=q.device, dtype=torch.float32)
    p = torch.empty_like(s)
    o = torch.empty_like(q)
    grid = (triton.cdiv(n, block_m), batch * heads)
    _scores_kernel[grid](q, k, s, n, d, heads, 1.0 / math.sqrt(d), *_strides(q), *_strides(k),
                         BLOCK_M=block_m, BLOCK_N=block_n, HEAD=head)
    _softmax_kernel[(batch * heads * n,)](s, p, n, ROW=triton.next_power_of_2(n))
    _weighted_sum_kernel[grid](p, v, o, n, d, heads, *_strides(v), *_strides(o),
                               BLOCK_M=block_m, BLOCK_N=block_n, HEAD=head)
    return o


# ---------------------------------------------------------------- FlashAttention forward, one kernel

@triton.jit
def _flash_forward_kernel(Q, K, V, O, LSE, n, d, heads, scale,
                          stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                          stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD: tl.constexpr, CAUSAL: tl.constexpr):
    """One program = one block of BLOCK_M queries of one (batch, head). It streams
    K and V in blocks of BLOCK_N, keeping the running max m, running sum l and the
    unnormalised output acc on chip; only O and the log-sum-exp go back to memory."""
    row_block = tl.program_id(0).to(tl.int64)    # int64: offsets into large tensors pass 2**31
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // heads, bh % heads
    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD)
    q_head = Q + b * stride_qb + h * stride_qh   # where this (batch, head) starts in each tensor
    k_head = K + b * stride_kb + h * stride_kh
    v_head = V + b * stride_vb + h * stride_vh
    o_head = O + b * stride_ob + h * stride_oh
    q = tl.load(q_head + rows[:, None] * stride_qn + dims[None, :], mask=(rows[:, None] < n) & (dims[None, :] < d), other=0.0)
    m = tl.full((BLOCK_M,), -float("inf"), dtype=tl.float32)
    l = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD), dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    # Causal: key blocks that start after this block's last query are all masked; skip them.
    end = tl.minimum(n, (row_block + 1) * BLOCK_M) if CAUSAL else n
    for col_start in range(0, end, BLOCK_N):
        cols = col_start + offs_n
        kv_mask = (cols[:, None] < n) & (dims[None, :] < d)
        k = tl.load(k_head + cols[:, None] * stride_kn + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_head + cols[:, None] * stride_vn + dims[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        keep = cols[None, :] < n
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        s = tl.where(keep, s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)                  # rescales what was summed under the old max
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    tl.store(o_head + rows[:, None] * stride_on + dims[None, :], acc / l[:, None], mask=(rows[:, None] < n) & (dims[None, :] < d))
    tl.store(LSE + bh * n + rows, m + tl.log(l), mask=rows < n)


def default_blocks(device, dtype=torch.float16):
    """(B_r, B_c): 64 x 64 for 16-bit inputs on a CUDA GPU, since Hopper's warpgroup matrix
    instructions need B_r to be a multiple of 64 (book/flash/compiler.md); 32 x 32 otherwise:
    in the interpreter, where small tiles run quickest and the chapter reads the kernel's
    layouts, and for float32 on a GPU, whose 64 x 64 tiles spill registers on an A100."""
    sixteen_bit = dtype in (torch.float16, torch.bfloat16)
    return (64, 64) if torch.device(device).type == "cuda" and sixteen_bit else (32, 32)


def flash_forward(q, k, v, causal=False, sm_scale=None, block_m=None, block_n=None):
    """(O, logsumexp) for (batch, heads, n, d) tensors, by the fused tiled kernel;
    blocks of default_blocks(q.device) unless given."""
    batch, heads, n, d = _check_inputs("flash_forward", q, k, v)
    default_m, default_n = default_blocks(q.device, q.dtype)
    block_m, block_n = block_m or default_m, block_n or default_n
    q, k, v = _unit_last_stride(q, k, v)
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    o = torch.empty_like(q)                      # same layout as q, whatever its strides
    lse = torch.empty(batch, heads, n, device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(n, block_m), batch * heads)
    _flash_forward_kernel[grid](q, k, v, o, lse, n, d, heads, scale,
                                *_strides(q), *_strides(k), *_strides(v), *_strides(o),
                                BLOCK_M=block_m, BLOCK_N=block_n,
                                HEAD=max(16, triton.next_power_of_2(d)), CAUSAL=causal)
    return o, lse
