"""A tuned FlashAttention forward kernel, beside the teaching one of
bookutils.triton_kernels: the same algorithm and the same results (O and the
natural-log log-sum-exp, so the instructor's backward kernels accept it), with
the changes that Triton's fused-attention tutorial (06) makes for speed:

- exp2 instead of exp, with log2(e) folded into the softmax scale: the scores
  are multiplied once by scale * log2(e), and 2^x is the GPU's native
  exponential (one MUFU.EX2 instruction; e^x costs a multiplication more);
- causal attention in two loops: the key blocks entirely before a query block's
  first query (off the diagonal band) need no mask at all, and only the blocks
  on the band pay for one; for a ragged length only the last block is masked;
- triton.autotune over configurations (block sizes and warps; 3 pipeline stages in each)
  that the compile report (coursekit.compile_report) shows compiling without
  spills for an A100 and an H100 and using the H100's warpgroup MMA (HGMMA).

It does not use the tensor memory accelerator (TMA), which the tutorial uses on
Hopper. On a T4 (64 KiB of shared memory per program) the 128-row
configurations need more than that for d = 128; Triton's autotuner times a
configuration that cannot launch as infinitely slow, so the 64-row one runs
there. It is not a good binary either: Triton multiplies without tensor cores on
a T4, and at d = 128 that binary spills several KiB of registers per thread to
local memory (the compile report gives the bytes). Under Triton's interpreter
(no GPU) autotuning has nothing to measure: the kernel is then declared with one
configuration.

Unlike the teaching kernel, which computes every offset in 64 bits, it widens
only the offset of a (batch, head) pair: the offsets within one head (a row
times the sequence stride) stay 32-bit, which saves registers (in 64 bits the
128 x 64 configuration reaches the register ceiling and spills
on an A100 at d = 128 for a ragged length). flash_forward_tuned therefore
refuses inputs whose offsets within a head reach 2**31, as it refuses q, k and
v that differ in shape, dtype or device (the checks of flash_forward)."""
import math

import torch

from coursekit.triton_env import triton_device

DEVICE = triton_device(quiet=True)   # must come before any @triton.jit below

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bookutils.triton_kernels import _check_inputs, _unit_last_stride  # noqa: E402
from coursekit.triton_trace import interpreting  # noqa: E402

LOG2_E = 1.4426950408889634          # log2(e): e^x = 2^(x log2 e); folded into the scale, one multiply per score

LN_2 = tl.constexpr(0.6931471805599453)   # ln(2): turns a base-2 log-sum-exp back into a natural one

# (BLOCK_M, BLOCK_N, num_warps, num_stages), chosen with the compile report: see
# the book's page "What the compiler makes of a kernel" and tests/test_compile_report.py.
# BLOCK_N divides BLOCK_M, so that the diagonal band of a query block is whole key blocks.
CONFIGS = ((128, 64, 8, 3), (128, 32, 8, 3), (64, 32, 4, 3))
INTERPRETER_CONFIG = (64, 32, 4, 1)
MAX_HEAD = 128
INT32_LIMIT = 2**31                  # offsets within a head are 32-bit: each must stay below this


def _autotune_configs():
    chosen = (INTERPRETER_CONFIG,) if interpreting() else CONFIGS
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in chosen]


@triton.jit
def _load_rows(a_ptrs, b_ptrs, rows, dims, n, d, MASK_ROWS: tl.constexpr, EVEN_D: tl.constexpr):
    """Two tiles at the same rows (keys and values; the backward's queries and their output
    gradients), masked only where a row can pass n or the head width is not a power of two."""
    if MASK_ROWS:
        mask = rows[:, None] < n
        if not EVEN_D:
            mask = mask & (dims[None, :] < d)
        a = tl.load(a_ptrs, mask=mask, other=0.0)
        b = tl.load(b_ptrs, mask=mask, other=0.0)
    elif EVEN_D:
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
    else:
        a = tl.load(a_ptrs, mask=dims[None, :] < d, other=0.0)
        b = tl.load(b_ptrs, mask=dims[None, :] < d, other=0.0)
    return a, b


@triton.jit
def _attend(acc, l, m, q, k_head, v_head, stride_kn, stride_vn, rows, dims, n, d, lo, hi, qk_scale,
            BLOCK_N: tl.constexpr, MASK_KEYS: tl.constexpr, CAUSAL_MASK: tl.constexpr, EVEN_D: tl.constexpr):
    """The online softmax over key blocks [lo, hi), in base 2: m is the running
    maximum of scale * log2(e) * s, l the running sum of 2^(that - m)."""
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        cols = start + offs_n
        k, v = _load_rows(k_head + cols[:, None] * stride_kn + dims[None, :],
                          v_head + cols[:, None] * stride_vn + dims[None, :], cols, dims, n, d, MASK_KEYS, EVEN_D)
        # Scaled before the maximum and the mask: for a negative scale the largest
        # raw score is the smallest scaled one, and -inf times it would be +inf.
        s = tl.dot(q, tl.trans(k)) * qk_scale
        if MASK_KEYS or CAUSAL_MASK:
            keep = cols[None, :] < n
            if CAUSAL_MASK:
                keep = keep & (cols[None, :] <= rows[:, None])
            s = tl.where(keep, s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.math.exp2(s - m_new[:, None])     # ex2.approx alone: log2(e) is already in qk_scale
        alpha = tl.math.exp2(m - m_new)
        l = l * alpha + tl.sum(p, axis=1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m = m_new
    return acc, l, m


@triton.autotune(configs=_autotune_configs(), key=["n", "HEAD", "CAUSAL"])
@triton.heuristics({"EVEN_N": lambda args: args["n"] % args["BLOCK_M"] == 0,
                    "EVEN_D": lambda args: args["d"] == args["HEAD"]})
@triton.jit
def _tuned_forward_kernel(Q, K, V, O, LSE, n, d, heads, qk_scale,
                          stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                          stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
                          HEAD: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          EVEN_N: tl.constexpr, EVEN_D: tl.constexpr):
    """One program = BLOCK_M queries of one (batch, head), as in the teaching kernel."""
    start_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)           # int64: a head's offset may pass 2**31; within it, 32-bit
    b, h = bh // heads, bh % heads
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD)
    q_ptrs = Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qn + dims[None, :]
    k_head = K + b * stride_kb + h * stride_kh
    v_head = V + b * stride_vb + h * stride_vh
    row_mask = (rows[:, None] < n) & (dims[None, :] < d)
    if EVEN_N and EVEN_D:
        q = tl.load(q_ptrs)
    else:
        q = tl.load(q_ptrs, mask=row_mask, other=0.0)
    m = tl.full((BLOCK_M,), -float("inf"), dtype=tl.float32)
    l = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD), dtype=tl.float32)
    if CAUSAL:
        # Off the band: keys before this block's first query, seen by every query of it, all in range.
        band = start_m * BLOCK_M
        acc, l, m = _attend(acc, l, m, q, k_head, v_head, stride_kn, stride_vn, rows, dims, n, d, 0, band,
                            qk_scale, BLOCK_N, False, False, EVEN_D)
        # On the band: the diagonal blocks, masked (and clipped to n for the last query block).
        acc, l, m = _attend(acc, l, m, q, k_head, v_head, stride_kn, stride_vn, rows, dims, n, d, band,
                            tl.minimum(band + BLOCK_M, n), qk_scale, BLOCK_N, not EVEN_N, True, EVEN_D)
    else:
        full = n // BLOCK_N * BLOCK_N                # whole key blocks: no mask
        acc, l, m = _attend(acc, l, m, q, k_head, v_head, stride_kn, stride_vn, rows, dims, n, d, 0, full,
                            qk_scale, BLOCK_N, False, False, EVEN_D)
        if not EVEN_N:
            if full < n:                             # the ragged last block
                acc, l, m = _attend(acc, l, m, q, k_head, v_head, stride_kn, stride_vn, rows, dims, n, d, full, n,
                                    qk_scale, BLOCK_N, True, False, EVEN_D)
    o_ptrs = O + b * stride_ob + h * stride_oh + rows[:, None] * stride_on + dims[None, :]
    out = (acc / l[:, None]).to(O.dtype.element_ty)
    lse = (m + tl.math.log2(l)) * LN_2               # back to the natural log-sum-exp
    if EVEN_N and EVEN_D:
        tl.store(o_ptrs, out)
    else:
        tl.store(o_ptrs, out, mask=row_mask)
    tl.store(LSE + bh * n + rows, lse, mask=rows < n)


def flash_forward_tuned(q, k, v, causal=False, sm_scale=None):
    """(O, logsumexp) for (batch, heads, n, d) tensors with d <= 128, by the tuned kernel."""
    batch, heads, n, d = _check_inputs("flash_forward_tuned", q, k, v)
    if d > MAX_HEAD:
        raise ValueError(f"flash_forward_tuned supports head dimensions up to {MAX_HEAD}, got {d}")
    q, k, v = _unit_last_stride(q, k, v)
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    o = torch.empty_like(q)
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o)):
        largest = (n - 1) * t.stride(2) + d - 1      # the last element of a head, from the head's start
        if largest >= INT32_LIMIT:
            raise ValueError(f"flash_forward_tuned: offsets within a head of {name} reach {largest:,}, past the "
                             f"32-bit offsets of the tuned kernel (below 2**31); flash_forward computes in 64 bits")
    lse = torch.empty(batch, heads, n, device=q.device, dtype=torch.float32)

    def grid(meta):
        return (triton.cdiv(n, meta["BLOCK_M"]), batch * heads)

    _tuned_forward_kernel[grid](q, k, v, o, lse, n, d, heads, scale * LOG2_E,
                                q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                                v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
                                HEAD=max(16, triton.next_power_of_2(d)), CAUSAL=causal)
    return o, lse
