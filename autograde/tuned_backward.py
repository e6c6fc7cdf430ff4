"""A tuned FlashAttention backward, beside the tuned forward of
bookutils.flash_tuned as that is beside the teaching forward. It answers
Chapter 4's graded Exercise 4 (Triton backward kernels), so it lives here, in
the instructor's package, and never ships to students: bookutils.benchmark
measures it where this package is present and leaves its row out elsewhere.

Design: the fused backward of Triton's fused-attention tutorial (06):

- a preprocess kernel computes Delta = rowsum(dO * O) in float32, and the
  forward's natural-log log-sum-exp once in base 2 (lse * log2 e), so that the
  main kernel's P = 2^(s * scale * log2 e - lse * log2 e) costs one multiply per
  score and one MUFU.EX2 (exp2 with log2(e) folded into the scale, as in the
  tuned forward);
- ONE main launch, one program per (block of BLOCK_N keys, batch, key-value
  head). The program first keeps dK and dV of its keys in registers over all
  query blocks (BLOCK_M rows at a time) of every query head of its group
  (grouped-query heads: k, v with H_kv heads, H a multiple), and stores them
  once; then, in a second loop, it computes dQ of the query block with the same
  index (BLOCK_N rows) for each query head of the group, over key blocks of
  BLOCK_M. dQ is therefore not accumulated with atomics: every element of dQ,
  dK and dV is written by one program with one summation order, so the
  gradients are bitwise reproducible from run to run (and the autotuner may
  rerun the kernel without zeroing anything). The price is recomputation: the
  second loop computes QK^T and dO V^T again, seven n^2 d products instead of
  the five of a backward with float32 atomics for dQ (FlashAttention-2's), in
  exchange for no atomic traffic and no float32 dQ buffer to convert. Causal
  attention balances the two loops: a key block near the start sees many query
  blocks and its query block few keys, and the other way round at the end.
- P and dS are cast to the inputs' 16-bit type before their products (dV = P^T
  dO, dK = dS^T Q, dQ = dS K), so every product runs on the tensor cores (float32
  inputs, the interpreter's, stay float32);
  accumulators are float32, and the scale multiplies dK and dQ once at the end.
- causal attention in two kinds of loops, as in the tuned forward: the blocks
  off the diagonal band need no mask; only the band's blocks are masked. A
  ragged length masks only the last block (rows past N get lse = +inf, so
  their P is exactly 0 with no further mask).
- offsets within a head are 32-bit (the (batch, head) offset 64-bit), so
  tuned_backward refuses tensors whose offsets within a head reach 2**31, as
  flash_forward_tuned does; any batch, head and sequence strides, the last axis
  at unit stride (a tensor without it is copied).

Configurations (BLOCK_M, BLOCK_N, warps, stages), per head width: every product
has BLOCK_N rows, so BLOCK_N = 64 or 128 lets the H100 use warpgroup MMA (64-row
tiles, 16-bit operands); BLOCK_M divides BLOCK_N so the diagonal band is whole
query blocks. The program holds dK and dV (float32) and K and V (16-bit) through
its first loop: at d = 128 (causal, ragged: the screen) a 128-key block (the
tutorial's) spilled 20 bytes on the H100 and 72 on the A100 with 8 warps, every
4-warp configuration tried spilled 12 to 892 bytes, and 64 x 64 with 8 warps 8 to
124; 64 keys, 8 warps and BLOCK_M of 16 or 32 do not spill. The compile report of
every configuration (`python -m autograde.tuned_backward`: float16, an A100 and
an H100, d = 64 and 128, causal or not, N = 1024 and a ragged 1000, one query head
per key-value head; the same launches are tested in tests/test_tuned_backward.py),
with Triton 3.9's compiler, ranges over those variants:

    d    BLOCK_M x BLOCK_N  warps stages  A100 regs  H100 regs  shared KiB A100/H100  H100 HGMMA
    64    32 x 128            8     2     177-179    142-247     40.2 / 49.2            22-56
    64    16 x 128            8     2     166-174    116-162     36.1 / 41.1            19-48
    64    32 x 128            8     3     180-229    144-185     48.5 / 57.5            22-56
    64    32 x  64            4     2     176-230    139-226     24.2 / 33.2            22-56
    128   32 x  64            8     2     166-236    170-245     52.2 / 65.2            70-176
    128   32 x  64            8     3     169-243    169-213     68.5 / 81.5            70-176
    128   16 x  64            8     2     166-222    146-205     42.1 / 49.1            67-168
    grouped-query heads (group = 4, N = 1000, causal or not):
    64    16 x 128            8     2     167-205    197-236     36.1 / 41.1            38-48
    128   16 x  64            8     2     216-242    216-254     42.1 / 49.1            134-168

    bfloat16 inputs (ragged, causal, group = 1), every configuration above:
    A100 172-243 registers, H100 123-218, the same shared memory, HGMMA on the H100.

With group > 1 the loop over the group's query heads is a real loop (Triton
specialises group = 1 away), and every 32-row configuration above spilled there
(12 to 136 bytes, A100 or H100): grouped heads get the 16-row ones alone
(GROUPED_CONFIGS), and at d = 128, causal, the H100 binary is one register short
of the ceiling, so another Triton version may spill there. No spills anywhere in
the table, HMMA on the A100 and HGMMA on the H100 in every one; the
register file limits occupancy to 8 to 16 of a multiprocessor's 64 warps. The
preprocess kernel: 34-38 registers, no spills.

Under Triton's interpreter (no GPU) autotuning has nothing to measure: the
kernel is declared with INTERPRETER_CONFIG alone. Nothing here is measured on a
GPU: `./scripts/benchmark --save` times the pair (tuned forward, this backward)
against SDPA where one is lent."""
import math

import torch

from coursekit.triton_env import triton_device

DEVICE = triton_device(quiet=True)   # must come before any @triton.jit below

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bookutils.flash_tuned import _load_rows  # noqa: E402
from coursekit.triton_trace import interpreting  # noqa: E402

LOG2_E = 1.4426950408889634          # e^x = 2^(x log2 e)
MAX_HEAD = 128
INT32_LIMIT = 2**31                  # offsets within a head are 32-bit
GRID_AXIS_1 = 65_535                 # CUDA's limit on grid axis 1 (batch * key-value heads here)

# (BLOCK_M, BLOCK_N, num_warps, num_stages) per head width (HEAD <= 64, HEAD = 128):
# BLOCK_N keys per program (the rows of every product), BLOCK_M query rows per step of
# its loops; chosen with the compile report (see the docstring). At HEAD = 128 two
# 128 x 128 float32 accumulators do not fit beside K and V: the key block is 64 rows.
CONFIGS = {64: ((32, 128, 8, 2), (16, 128, 8, 2), (32, 128, 8, 3), (32, 64, 4, 2)),
           128: ((32, 64, 8, 2), (32, 64, 8, 3), (16, 64, 8, 2))}
# Grouped-query heads (group > 1): the loop over the group's query heads is then a
# real loop (for group = 1 Triton specialises it away), and only 16-row query steps
# leave room for it without spills.
GROUPED_CONFIGS = {64: ((16, 128, 8, 2),), 128: ((16, 64, 8, 2),)}
INTERPRETER_CONFIG = (32, 64, 4, 1)
PREPROCESS_BLOCK = 64


def configs_for(head, group=1):
    """The configurations autotuning chooses from for a kernel of HEAD columns."""
    table = CONFIGS if group == 1 else GROUPED_CONFIGS
    return table[64] if head <= 64 else table[128]


def _config(m, n, w, s):
    return triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)


def _autotune_configs():
    if interpreting():
        return [_config(*INTERPRETER_CONFIG)]
    return [_config(*c) for c in all_configs()]


def all_configs():
    return tuple(dict.fromkeys(c for table in (CONFIGS, GROUPED_CONFIGS) for cs in table.values() for c in cs))


def _prune(configs, named_args, **kwargs):
    """Only the configurations screened for this head width and group (the others spill)."""
    if len(configs) == 1:
        return configs
    head = kwargs.get("HEAD", named_args.get("HEAD"))
    group = named_args.get("group", kwargs.get("group", 1))
    allowed = set(configs_for(head, group))
    return [c for c in configs if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) in allowed]


@triton.jit
def _preprocess_kernel(O, DO, LSE, DELTA, LSE2, n, d, heads,
                       stride_ob, stride_oh, stride_on, stride_dob, stride_doh, stride_don,
                       BLOCK: tl.constexpr, HEAD: tl.constexpr):
    """Delta = rowsum(dO * O) and lse in base 2, for BLOCK rows of one (batch, head)."""
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // heads, bh % heads
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    dims = tl.arange(0, HEAD)
    mask = (rows[:, None] < n) & (dims[None, :] < d)
    o = tl.load(O + b * stride_ob + h * stride_oh + rows[:, None] * stride_on + dims[None, :], mask=mask, other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + rows[:, None] * stride_don + dims[None, :], mask=mask,
                 other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    lse = tl.load(LSE + bh * n + rows, mask=rows < n, other=0.0)
    tl.store(DELTA + bh * n + rows, delta, mask=rows < n)
    tl.store(LSE2 + bh * n + rows, lse * 1.4426950408889634, mask=rows < n)


@triton.jit
def _dkdv(dk, dv, k, v, q_head, do_head, lse_head, delta_head, stride_qn, stride_don, cols, dims, n, d, lo, hi,
          qk_scale, BLOCK_M: tl.constexpr, MASK_ROWS: tl.constexpr, CAUSAL_MASK: tl.constexpr,
          EVEN_D: tl.constexpr):
    """dK and dV of the program's keys (rows of k, v) over query rows [lo, hi), transposed
    as in the tutorial: the scores are (keys x queries), so every product has BLOCK_N rows."""
    offs_m = tl.arange(0, BLOCK_M)
    for start in range(lo, hi, BLOCK_M):
        rows = start + offs_m
        q, do = _load_rows(q_head + rows[:, None] * stride_qn + dims[None, :],
                           do_head + rows[:, None] * stride_don + dims[None, :], rows, dims, n, d, MASK_ROWS, EVEN_D)
        if MASK_ROWS:
            # +inf: a row past n gets P = 2^(0 - inf) = 0 exactly, hence dS = 0, with no mask of its own
            lse2 = tl.load(lse_head + rows, mask=rows < n, other=float("inf"))
            delta = tl.load(delta_head + rows, mask=rows < n, other=0.0)
        else:
            lse2 = tl.load(lse_head + rows)
            delta = tl.load(delta_head + rows)
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse2[None, :])
        if CAUSAL_MASK:
            p_t = tl.where(rows[None, :] >= cols[:, None], p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def _dq(dq, q, do, lse2, delta, k_head, v_head, stride_kn, stride_vn, rows, dims, n, d, lo, hi, qk_scale,
        BLOCK_M: tl.constexpr, MASK_KEYS: tl.constexpr, CAUSAL_MASK: tl.constexpr, EVEN_D: tl.constexpr):
    """dQ of the program's query block over key rows [lo, hi), BLOCK_M keys at a time."""
    offs_n = tl.arange(0, BLOCK_M)
    for start in range(lo, hi, BLOCK_M):
        cols = start + offs_n
        k, v = _load_rows(k_head + cols[:, None] * stride_kn + dims[None, :],
                          v_head + cols[:, None] * stride_vn + dims[None, :], cols, dims, n, d, MASK_KEYS, EVEN_D)
        p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse2[:, None])
        if CAUSAL_MASK:       # keys past n lie above every real row's diagonal: this mask covers them
            p = tl.where(cols[None, :] <= rows[:, None], p, 0.0)
        elif MASK_KEYS:       # zero keys past n still score 0, and 2^(0 - lse) is not 0
            p = tl.where(cols[None, :] < n, p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.autotune(configs=_autotune_configs(), key=["n", "HEAD", "CAUSAL", "group"],
                 prune_configs_by={"early_config_prune": _prune})
@triton.heuristics({"EVEN_N": lambda args: args["n"] % args["BLOCK_N"] == 0,
                    "EVEN_D": lambda args: args["d"] == args["HEAD"]})
@triton.jit
def _tuned_backward_kernel(Q, K, V, DO, DQ, DK, DV, LSE2, DELTA, n, d, kv_heads, group, qk_scale, sm_scale,
                           stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                           stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
                           stride_dqb, stride_dqh, stride_dqn, stride_dkb, stride_dkh, stride_dkn,
                           HEAD: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           EVEN_N: tl.constexpr, EVEN_D: tl.constexpr):
    """Program (i, b * kv_heads + j): dK, dV of keys [i BLOCK_N, (i + 1) BLOCK_N) of key-value
    head j, then dQ of the queries with the same indices for each query head of j's group.
    dV = P^T dO, dS = P * (dO V^T - Delta), dK = scale dS^T Q, dQ = scale dS K."""
    pid = tl.program_id(0)
    bhk = tl.program_id(1).to(tl.int64)          # int64: a head's offset may pass 2**31; within it, 32-bit
    b, hk = bhk // kv_heads, bhk % kv_heads
    heads = kv_heads * group
    dims = tl.arange(0, HEAD)
    start_n = pid * BLOCK_N
    cols = start_n + tl.arange(0, BLOCK_N)
    k_head = K + b * stride_kb + hk * stride_kh
    v_head = V + b * stride_vb + hk * stride_vh
    k_ptrs = k_head + cols[:, None] * stride_kn + dims[None, :]
    v_ptrs = v_head + cols[:, None] * stride_vn + dims[None, :]
    col_mask = (cols[:, None] < n) & (dims[None, :] < d)
    k, v = _load_rows(k_ptrs, v_ptrs, cols, dims, n, d, not EVEN_N, EVEN_D)
    dk = tl.zeros((BLOCK_N, HEAD), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, HEAD), dtype=tl.float32)
    full = n // BLOCK_M * BLOCK_M                # query rows in whole blocks: no row mask
    for g in range(group):
        h = hk * group + g
        bh = b * heads + h
        q_head = Q + b * stride_qb + h * stride_qh
        do_head = DO + b * stride_dob + h * stride_doh
        if CAUSAL:
            # The band: queries [start_n, start_n + BLOCK_N) see part of these keys (rows may pass n).
            band_end = start_n + BLOCK_N
            dk, dv = _dkdv(dk, dv, k, v, q_head, do_head, LSE2 + bh * n, DELTA + bh * n, stride_qn, stride_don,
                           cols, dims, n, d, start_n, tl.minimum(band_end, n), qk_scale, BLOCK_M, not EVEN_N,
                           True, EVEN_D)
            # Below it: every query sees every key of the block; only the ragged last block is masked.
            dk, dv = _dkdv(dk, dv, k, v, q_head, do_head, LSE2 + bh * n, DELTA + bh * n, stride_qn, stride_don,
                           cols, dims, n, d, band_end, full, qk_scale, BLOCK_M, False, False, EVEN_D)
            if not EVEN_N:
                dk, dv = _dkdv(dk, dv, k, v, q_head, do_head, LSE2 + bh * n, DELTA + bh * n, stride_qn,
                               stride_don, cols, dims, n, d, tl.maximum(full, band_end), n, qk_scale, BLOCK_M,
                               True, False, EVEN_D)
        else:
            dk, dv = _dkdv(dk, dv, k, v, q_head, do_head, LSE2 + bh * n, DELTA + bh * n, stride_qn, stride_don,
                           cols, dims, n, d, 0, full, qk_scale, BLOCK_M, False, False, EVEN_D)
            if not EVEN_N:
                dk, dv = _dkdv(dk, dv, k, v, q_head, do_head, LSE2 + bh * n, DELTA + bh * n, stride_qn,
                               stride_don, cols, dims, n, d, full, n, qk_scale, BLOCK_M, True, False, EVEN_D)
    out_dk = DK + b * stride_dkb + hk * stride_dkh + cols[:, None] * stride_dkn + dims[None, :]
    out_dv = DV + b * stride_dkb + hk * stride_dkh + cols[:, None] * stride_dkn + dims[None, :]  # dV: dK's layout
    dk = (dk * sm_scale).to(DK.dtype.element_ty)
    dv = dv.to(DV.dtype.element_ty)
    if EVEN_N and EVEN_D:
        tl.store(out_dk, dk)
        tl.store(out_dv, dv)
    else:
        tl.store(out_dk, dk, mask=col_mask)
        tl.store(out_dv, dv, mask=col_mask)

    # Second loop: dQ of queries [start_n, start_n + BLOCK_N) (dK and dV above are no longer live).
    rows = cols
    row_mask = col_mask
    for g in range(group):
        h = hk * group + g
        bh = b * heads + h
        q_ptrs = Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qn + dims[None, :]
        do_ptrs = DO + b * stride_dob + h * stride_doh + rows[:, None] * stride_don + dims[None, :]
        # Not _load_rows: with its row-only mask ptxas spills in three causal, ragged
        # configurations (A100 at 32 x 128 and 32 x 64, H100 at d = 128, 16 x 64).
        if EVEN_N and EVEN_D:
            q = tl.load(q_ptrs)
            do = tl.load(do_ptrs)
        else:
            q = tl.load(q_ptrs, mask=row_mask, other=0.0)
            do = tl.load(do_ptrs, mask=row_mask, other=0.0)
        if EVEN_N:
            lse2 = tl.load(LSE2 + bh * n + rows)
            delta = tl.load(DELTA + bh * n + rows)
        else:
            lse2 = tl.load(LSE2 + bh * n + rows, mask=rows < n, other=float("inf"))
            delta = tl.load(DELTA + bh * n + rows, mask=rows < n, other=0.0)
        dq = tl.zeros((BLOCK_N, HEAD), dtype=tl.float32)
        if CAUSAL:
            # Keys before the block's first query: unmasked; then the band, masked (and clipped to n).
            dq = _dq(dq, q, do, lse2, delta, k_head, v_head, stride_kn, stride_vn, rows, dims, n, d, 0, start_n,
                     qk_scale, BLOCK_M, False, False, EVEN_D)
            dq = _dq(dq, q, do, lse2, delta, k_head, v_head, stride_kn, stride_vn, rows, dims, n, d, start_n,
                     tl.minimum(start_n + BLOCK_N, n), qk_scale, BLOCK_M, not EVEN_N, True, EVEN_D)
        else:
            dq = _dq(dq, q, do, lse2, delta, k_head, v_head, stride_kn, stride_vn, rows, dims, n, d, 0, full,
                     qk_scale, BLOCK_M, False, False, EVEN_D)
            if not EVEN_N:
                dq = _dq(dq, q, do, lse2, delta, k_head, v_head, stride_kn, stride_vn, rows, dims, n, d, full, n,
                         qk_scale, BLOCK_M, True, False, EVEN_D)
        out_dq = DQ + b * stride_dqb + h * stride_dqh + rows[:, None] * stride_dqn + dims[None, :]
        dq = (dq * sm_scale).to(DQ.dtype.element_ty)
        if EVEN_N and EVEN_D:
            tl.store(out_dq, dq)
        else:
            tl.store(out_dq, dq, mask=row_mask)


def _check(q, k, v, o, lse, do):
    """(batch, heads, kv_heads, n, d), or a ValueError naming what the kernel cannot read."""
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o), ("do", do)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"tuned_backward: {name} must be a (batch, heads, n, d) tensor")
    batch, heads, n, d = q.shape
    kv_heads = k.shape[1]
    if not (o.shape == do.shape == q.shape and k.shape == v.shape and k.shape[0] == batch
            and k.shape[2:] == q.shape[2:]):
        raise ValueError(f"tuned_backward: q, o, do must be (B, H, N, d) and k, v (B, H_kv, N, d), got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, o {tuple(o.shape)}, "
                         f"do {tuple(do.shape)}")
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"tuned_backward: {heads} query heads are not a multiple of {kv_heads} key-value heads")
    if tuple(lse.shape) != (batch, heads, n):
        raise ValueError(f"tuned_backward: lse must be (B, H, N) = {(batch, heads, n)}, got {tuple(lse.shape)}")
    if len({t.dtype for t in (q, k, v, o, do)}) != 1 or len({t.device for t in (q, k, v, o, do, lse)}) != 1:
        raise ValueError("tuned_backward: q, k, v, o and do must share one dtype, and all one device")
    if d > MAX_HEAD:
        raise ValueError(f"tuned_backward supports head dimensions up to {MAX_HEAD}, got {d}")
    if batch * kv_heads > GRID_AXIS_1 or batch * heads > GRID_AXIS_1:
        raise ValueError(f"tuned_backward: batch * heads exceed CUDA's {GRID_AXIS_1:,} programs on grid axis 1")
    return batch, heads, kv_heads, n, d


def tuned_backward(q, k, v, o, lse, do, causal=False, sm_scale=None):
    """(dq, dk, dv) for (B, H, N, d) q, o, do, (B, H_kv, N, d) k, v and the forward's
    natural-log lse (B, H, N); the interface of the instructor's flash_attention_backward."""
    batch, heads, kv_heads, n, d = _check(q, k, v, o, lse, do)
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    q, k, v, o, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, o, do))
    dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    dk, dv = (torch.empty(k.shape, device=k.device, dtype=k.dtype) for _ in range(2))
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o), ("do", do), ("dq", dq), ("dk", dk)):
        largest = (n - 1) * t.stride(2) + d - 1      # the last element of a head, from the head's start
        if largest >= INT32_LIMIT:
            raise ValueError(f"tuned_backward: offsets within a head of {name} reach {largest:,}, past the 32-bit "
                             f"offsets of the tuned kernel (below 2**31)")
    if n == 0 or batch * heads == 0:
        return dq, dk.zero_(), dv.zero_()
    head = max(16, triton.next_power_of_2(d))
    lse = lse.float().contiguous()
    delta, lse2 = (torch.empty(batch, heads, n, device=q.device, dtype=torch.float32) for _ in range(2))
    _preprocess_kernel[(triton.cdiv(n, PREPROCESS_BLOCK), batch * heads)](
        o, do, lse, delta, lse2, n, d, heads, *o.stride()[:3], *do.stride()[:3], BLOCK=PREPROCESS_BLOCK, HEAD=head)

    def grid(meta):
        return (triton.cdiv(n, meta["BLOCK_N"]), batch * kv_heads)

    _tuned_backward_kernel[grid](q, k, v, do, dq, dk, dv, lse2, delta, n, d, kv_heads, heads // kv_heads,
                                 scale * LOG2_E, scale, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                                 *do.stride()[:3], *dq.stride()[:3], *dk.stride()[:3], HEAD=head, CAUSAL=causal)
    return dq, dk, dv


class TunedAttention(torch.autograd.Function):
    """Attention by bookutils.flash_tuned's forward and tuned_backward. Grouped-query
    k and v are expanded (copied) for the forward, which takes equal heads only; the
    backward reads them unexpanded and sums dK and dV over each group itself."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, sm_scale=None):
        from bookutils.flash_tuned import flash_forward_tuned

        group = q.shape[1] // k.shape[1] if k.dim() == 4 and k.shape[1] else 1
        ke, ve = (k, v) if group == 1 else (t.repeat_interleave(group, dim=1) for t in (k, v))
        o, lse = flash_forward_tuned(q, ke, ve, causal=causal, sm_scale=sm_scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.sm_scale = causal, sm_scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = tuned_backward(q, k, v, o, lse, do, ctx.causal, ctx.sm_scale)
        return dq, dk, dv, None, None


def tuned_attention(q, k, v, causal=False, sm_scale=None):
    """softmax(scale q k^T) v, differentiable: the tuned forward and the tuned backward."""
    return TunedAttention.apply(q, k, v, causal, sm_scale)


def launches(heads=(64, 128), causal=(False, True), lengths=(1024, 1000), dtype=torch.float16, batch=4,
             query_heads=16, group=1):
    """coursekit.compile_report Launches of the main kernel in every configuration
    (d in `heads`, causal or not, a length that is a multiple of every block and a
    ragged one), and of the preprocess kernel; nothing runs."""
    from coursekit.compile_report import Launch, specialise

    kernel = _tuned_backward_kernel
    out = []
    for head in heads:
        for n in lengths:
            x = torch.empty(batch, query_heads, n, head, dtype=dtype)
            kv = torch.empty(batch, query_heads // group, n, head, dtype=dtype)
            stats = torch.empty(batch, query_heads, n)
            args = ((x, kv, kv, x, x, kv, kv, stats, stats, n, head, query_heads // group, group, 1.0, 1.0)
                    + tuple(x.stride()[:3]) + tuple(kv.stride()[:3]) * 2 + tuple(x.stride()[:3]) * 2
                    + tuple(kv.stride()[:3]))
            for is_causal in causal:
                for block_m, block_n, warps, stages in configs_for(head, group):
                    spec = specialise(kernel, *args, HEAD=head, CAUSAL=is_causal, BLOCK_M=block_m, BLOCK_N=block_n,
                                      EVEN_N=n % block_n == 0, EVEN_D=True, num_warps=warps, num_stages=stages)
                    out.append(Launch(kernel, spec))
        x = torch.empty(batch, query_heads, lengths[0], head, dtype=dtype)
        stats = torch.empty(batch, query_heads, lengths[0])
        spec = specialise(_preprocess_kernel, x, x, stats, stats, stats, lengths[0], head, query_heads,
                          *x.stride()[:3], *x.stride()[:3], BLOCK=PREPROCESS_BLOCK, HEAD=head)
        out.append(Launch(_preprocess_kernel, spec))
    return out


def screened_launches():
    """What the compile report checks (tests/test_tuned_backward.py): launches(), plus
    grouped-query heads (4 query heads per key-value head: any group > 1 compiles to
    the same loop) in their configurations, ragged, causal or not, and bfloat16 inputs
    in the variant that needs the most registers (ragged, causal)."""
    return (launches() + launches(lengths=(1000,), group=4)
            + launches(causal=(True,), lengths=(1000,), dtype=torch.bfloat16))


if __name__ == "__main__":
    from coursekit.compile_report import compile_reports, render

    print(render(compile_reports(screened_launches(), targets=("A100", "H100"))))
