"""Planted submissions for ch4_flash.

Each case replaces some solution cells (keyed by grade_id) of an otherwise
correct submission. `loses` names the test cells that must score 0; every other
autograded cell must get full points. The kernel mistakes are written as edits
of the instructor's kernel and launcher, one line each, so each case shows
exactly the mistake it plants."""
from pathlib import Path

import nbformat

from tests.notebooks import nbgrader_meta, solution_code
from tests.submissions.independent import CELLS as INDEPENDENT

ASSIGNMENT = "ch4_flash"
NOTEBOOK = "flash.ipynb"

_SOURCE = Path(__file__).resolve().parents[2] / "solutions" / ASSIGNMENT / NOTEBOOK
_SOLVED = {nbgrader_meta(c).get("grade_id"): solution_code(c)
           for c in nbformat.read(_SOURCE, as_version=4).cells if nbgrader_meta(c).get("solution")}


def _edit(grade_id, old, new):
    """The instructor's code for grade_id with one fragment replaced."""
    code = _SOLVED[grade_id]
    assert code.count(old) == 1, f"{old!r} should occur once in {grade_id}"
    return code.replace(old, new)


def edit(grade_id, old, new):
    return {grade_id: _edit(grade_id, old, new)}


# --- merging softmax states --------------------------------------------------------

MERGE_NOT_RESCALED = _edit("merge_softmax_states", "carried = l * np.exp(m - shift)",
                           "carried = l  # Bug: sums measured against different maxima are added as they are")

STYLE_MERGE_LOGADDEXP = """
def merge_softmax_states(m, l, o):
    \"\"\"Fold the chunks one at a time in log space, keeping log(l) + m.\"\"\"
    m, l, o = np.asarray(m, float), np.asarray(l, float), np.asarray(o, float)
    lse = np.full(m.shape[1:], -np.inf)
    acc = np.zeros(o.shape[1:])
    with np.errstate(divide="ignore"):
        chunk_lse = np.where(l > 0, np.log(np.where(l > 0, l, 1.0)) + np.where(np.isinf(m), 0.0, m), -np.inf)
    for c in range(m.shape[0]):
        new = np.logaddexp(lse, chunk_lse[c])
        safe = np.where(np.isneginf(new), 0.0, new)
        acc = acc * np.exp(lse - safe)[..., None] + o[c] * np.exp(chunk_lse[c] - safe)[..., None]
        lse = new
    top = m.max(axis=0)
    total = np.where(np.isneginf(top), 0.0, np.exp(lse - np.where(np.isneginf(top), 0.0, top)))
    return top, total, acc
"""

# The book's one-row merge folded over every row: the book shows it as page code only,
# so the import fails (and the grader's tripwire flags any bookutils import).
MERGE_FROM_BOOK = """
import functools


def merge_softmax_states(m, l, o):
    from bookutils.decoding import merge_two

    m, l, o = (np.asarray(a, dtype=np.float64) for a in (m, l, o))
    out_m, out_l, out_o = np.empty(m.shape[1:]), np.empty(m.shape[1:]), np.empty(o.shape[1:])
    for row in np.ndindex(m.shape[1:]):
        states = [(m[(c,) + row], l[(c,) + row], o[(c,) + row]) for c in range(m.shape[0])]
        out_m[row], out_l[row], out_o[row] = functools.reduce(merge_two, states)
    return out_m, out_l, out_o
"""

# --- the backward pass in NumPy ---------------------------------------------------------

TILED_D_FROM_TILE = _edit("tiled_attention_backward", "ds = p * (dp - delta[..., rows, None])",
                          "ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))  # Bug: D from this tile's P only")

TILED_P_WITHOUT_LSE = _edit("tiled_attention_backward", "p = np.exp(s - lse[..., rows, None])",
                            "p = np.exp(s) / np.exp(lse[..., rows, None])  # Bug: exp(S) overflows")

TILED_STRIP = """
def tiled_attention_backward(q, k, v, o, do, lse, block_m, block_n, causal=False):
    scale = 1 / np.sqrt(q.shape[-1])
    delta = (do * o).sum(axis=-1)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    n = k.shape[-2]
    for i in range(0, q.shape[-2], block_m):
        rows = np.arange(i, min(i + block_m, q.shape[-2]))
        p = np.exp(q[..., rows, :] @ np.swapaxes(k, -1, -2) * scale - lse[..., rows, None])  # Bug: a block_m x n strip
        if causal:
            p = np.where(np.arange(n) <= rows[:, None], p, 0.0)
        dv += np.swapaxes(p, -1, -2) @ do[..., rows, :]
        ds = p * (do[..., rows, :] @ np.swapaxes(v, -1, -2) - delta[..., rows, None])
        dq[..., rows, :] = ds @ k * scale
        dk += np.swapaxes(ds, -1, -2) @ q[..., rows, :] * scale
    return dq, dk, dv
"""

# An n x n boolean mask, built only when causal: every output is right, and a mask of booleans
# is an eighth of a float64 matrix, but it is 4 MiB at n = 2048 (the visible test allows less) and
# 16 MiB at n = 4096 (the hidden one allows 8.4 MiB).
TILED_CAUSAL_FULL_MASK = _edit(
    "tiled_attention_backward", "    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)\n",
    "    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)\n"
    "    allowed = np.tri(n_q, n_k, dtype=bool) if causal else None   # Bug: an n x n mask\n").replace(
    "p = np.where(cols[None, :] <= rows[:, None], p, 0.0)", "p = np.where(allowed[np.ix_(rows, cols)], p, 0.0)")

# Keys outermost, the leading axes flattened into one batch axis: dK and dV of a key block are
# summed over every query block before they are stored, dQ is added into as the blocks go.
STYLE_TILED_KEYS_OUTERMOST = """
def tiled_attention_backward(q, k, v, o, do, lse, block_m, block_n, causal=False):
    lead, (n_q, d), (n_k, d_v) = q.shape[:-2], q.shape[-2:], v.shape[-2:]
    q, k, v = q.reshape(-1, n_q, d), k.reshape(-1, n_k, d), v.reshape(-1, n_k, d_v)
    o, do, lse = o.reshape(-1, n_q, d_v), do.reshape(-1, n_q, d_v), lse.reshape(-1, n_q)
    scale = d ** -0.5
    big_d = np.sum(do * o, axis=-1)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b in range(q.shape[0]):
        for j0 in range(0, n_k, block_n):
            j1 = min(j0 + block_n, n_k)
            k_j, v_j = k[b, j0:j1], v[b, j0:j1]
            dk_j, dv_j = np.zeros(k_j.shape), np.zeros(v_j.shape)
            for i0 in range(0, n_q, block_m):
                i1 = min(i0 + block_m, n_q)
                if causal and i1 <= j0:       # every key of the block comes after every query
                    continue
                p = np.exp(q[b, i0:i1] @ k_j.T * scale - lse[b, i0:i1, None])
                if causal:
                    p[np.arange(i0, i1)[:, None] < np.arange(j0, j1)] = 0.0
                dv_j += p.T @ do[b, i0:i1]
                ds = p * (do[b, i0:i1] @ v_j.T - big_d[b, i0:i1, None])
                dq[b, i0:i1] += scale * (ds @ k_j)
                dk_j += scale * (ds.T @ q[b, i0:i1])
            dk[b, j0:j1], dv[b, j0:j1] = dk_j, dv_j
    return dq.reshape(lead + (n_q, d)), dk.reshape(lead + (n_k, d)), dv.reshape(lead + (n_k, d_v))
"""

# Honest notes in its own /tmp, as one keeps while debugging: a log of the call and a small
# checkpoint of its first rows (a few KiB). /tmp is memory, counted as such, and nothing more.
STYLE_TILED_SCRATCH_FILES = _edit(
    "tiled_attention_backward", "    return dq, dk, dv",
    "    with open('/tmp/tiled_backward.log', 'a') as log:\n"
    "        log.write(f'n_q={n_q} n_k={n_k} blocks {block_m}x{block_n} causal={causal}\\n')\n"
    "    np.save('/tmp/tiled_backward_rows.npy', np.concatenate([dq[..., :8, :].ravel(), dv[..., :8, :].ravel()]))\n"
    "    return dq, dk, dv")

# Strips of P and dP in anonymous memory maps, out of tracemalloc's sight: each block of queries
# gets a block_m x n strip of each, filled a tile at a time. The kernel counts their pages.
TILED_STRIPS_IN_MAPS = """
import mmap


def _mapped(shape):
    \"\"\"An array in an anonymous memory map (Bug: a block_m x n strip, whatever holds it).\"\"\"
    return np.frombuffer(mmap.mmap(-1, 8 * int(np.prod(shape))), dtype=np.float64).reshape(shape)


def tiled_attention_backward(q, k, v, o, do, lse, block_m, block_n, causal=False):
    scale = 1 / np.sqrt(q.shape[-1])
    delta = (do * o).sum(axis=-1)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    n_q, n_k = q.shape[-2], k.shape[-2]
    for i in range(0, n_q, block_m):
        rows = np.arange(i, min(i + block_m, n_q))
        p, dp = _mapped(q.shape[:-2] + (len(rows), n_k)), _mapped(q.shape[:-2] + (len(rows), n_k))
        for j in range(0, n_k, block_n):
            cols = np.arange(j, min(j + block_n, n_k))
            p[..., cols] = np.exp(q[..., rows, :] @ np.swapaxes(k[..., cols, :], -1, -2) * scale
                                  - lse[..., rows, None])
            if causal:
                p[..., cols] = np.where(cols[None, :] <= rows[:, None], p[..., cols], 0.0)
            dp[..., cols] = do[..., rows, :] @ np.swapaxes(v[..., cols, :], -1, -2)
        for j in range(0, n_k, block_n):
            cols = np.arange(j, min(j + block_n, n_k))
            ds = p[..., cols] * (dp[..., cols] - delta[..., rows, None])
            dv[..., cols, :] += np.swapaxes(p[..., cols], -1, -2) @ do[..., rows, :]
            dq[..., rows, :] += ds @ k[..., cols, :] * scale
            dk[..., cols, :] += np.swapaxes(ds, -1, -2) @ q[..., rows, :] * scale
    return dq, dk, dv
"""

# --- traffic ---------------------------------------------------------------------------

TRAFFIC_FLOOR = _edit("hbm_traffic_backward", "key_blocks = (n + block_n - 1) // block_n",
                      "key_blocks = n // block_n  # Bug: floor, a last partial block is not counted")

# The counts through floats: np.ceil returns a float, so the total is a float made an int at the
# end; exact only while the total (or its odd part) stays below 2^53.
TRAFFIC_THROUGH_FLOAT = _edit("hbm_traffic_backward", "key_blocks = (n + block_n - 1) // block_n",
                              "key_blocks = np.ceil(n / block_n)  # Bug: a float count").replace(
    "return preprocess + dkdv_pass + dq_pass", "return int(preprocess + dkdv_pass + dq_pass)")

# The same in NumPy's int64: exact until the total passes 2^63, then it wraps around.
TRAFFIC_INT64 = _edit("hbm_traffic_backward", "    preprocess = (n * d + n * d) + n",
                      "    n, d, block_m, block_n = (np.int64(x) for x in (n, d, block_m, block_n))  # Bug: int64\n"
                      "    preprocess = (n * d + n * d) + n").replace(
    "return preprocess + dkdv_pass + dq_pass", "return int(preprocess + dkdv_pass + dq_pass)")

# --- the backward kernels -----------------------------------------------------------------

BWD_DS_WITHOUT_D = edit("bwd_dq_kernel", "ds = p * (dp - delta[:, None])", "ds = p * dp  # Bug: - D missing")

# Bug: dK lacks sm_scale
BWD_DK_UNSCALED = edit("bwd_dkdv_kernel", "(dk_acc * sm_scale).to(DK.dtype.element_ty)", "dk_acc.to(DK.dtype.element_ty)")

BWD_NO_CAUSAL_MASK = edit("bwd_dkdv_kernel", "keep = keep & (offs_n[:, None] <= offs_m[None, :])",
                          "keep = keep  # Bug: the causal mask is missing in the dK/dV pass")

# Bug: dQ lacks sm_scale
BWD_DQ_UNSCALED = edit("bwd_dq_kernel", "(dq_acc * sm_scale).to(DQ.dtype.element_ty)", "dq_acc.to(DQ.dtype.element_ty)")

# One kernel over key blocks that also adds each tile's share of dQ into a float32 buffer:
# several programs (one per key block) write the same rows of dQ, so the design needs atomics.
_DKDV_WITH_DQ = _edit("bwd_dkdv_kernel", "def bwd_dkdv_kernel(Q, K, V, DO, Lse, Delta, DK, DV, seq_len,",
                      "def bwd_dkdv_kernel(Q, K, V, DO, Lse, Delta, DK, DV, DQ, seq_len,")
_DKDV_WITH_DQ = _DKDV_WITH_DQ.replace(
    "            dk_acc += tl.dot(ds_t.to(q_tile.dtype), q_tile)\n",
    "            dk_acc += tl.dot(ds_t.to(q_tile.dtype), q_tile)\n"
    "            dq_part = tl.dot(tl.trans(ds_t).to(k_tile.dtype), k_tile) * sm_scale\n"
    "            dq_where = off_bh * seq_len * head_dim + offs_m[:, None] * head_dim + offs_d[None, :]\n"
    "            tl.atomic_add(DQ + dq_where, dq_part, mask=q_mask)\n", 1)
_ATOMIC_LAUNCHER = _edit("flash_attention_backward", """    bwd_dkdv_kernel[(triton.cdiv(seq_len, block_n), batch * kv_heads)](
        q, k, v, do, lse, delta, dk, dv, seq_len, head_dim, kv_heads, sm_scale, *(s for t in strides for s in t),
        **common)
    bwd_dq_kernel[(triton.cdiv(seq_len, block_m), batch * heads)](
        q, k, v, do, lse, delta, dq, seq_len, head_dim, heads, sm_scale, *(s for t in strides for s in t), **common)
    return dq, dk, dv""", """    dq32 = torch.zeros(q.shape, device=q.device, dtype=torch.float32)   # summed over key blocks
    bwd_dkdv_kernel[(triton.cdiv(seq_len, block_n), batch * kv_heads)](
        q, k, v, do, lse, delta, dk, dv, dq32, seq_len, head_dim, kv_heads, sm_scale,
        *(s for t in strides for s in t), **common)
    return dq32.to(q.dtype), dk, dv""")
STYLE_BWD_ATOMICS = {"bwd_dkdv_kernel": _DKDV_WITH_DQ, "flash_attention_backward": _ATOMIC_LAUNCHER}
assert "tl.atomic_add(" in _DKDV_WITH_DQ

BWD_DQ_WITHOUT_ATOMICS = dict(STYLE_BWD_ATOMICS, bwd_dkdv_kernel=_DKDV_WITH_DQ.replace(
    "tl.atomic_add(DQ + dq_where, dq_part, mask=q_mask)",
    "tl.store(DQ + dq_where, dq_part, mask=q_mask)  # Bug: each key block overwrites the others' share of dQ"))

# A read-modify-write of dQ with a plain load and store: right when programs run one after
# another (the interpreter), updates lost when they run at once (a GPU).
BWD_DQ_LOAD_ADD_STORE = dict(STYLE_BWD_ATOMICS, bwd_dkdv_kernel=_DKDV_WITH_DQ.replace(
    "tl.atomic_add(DQ + dq_where, dq_part, mask=q_mask)",
    "tl.store(DQ + dq_where, tl.load(DQ + dq_where, mask=q_mask) + dq_part, mask=q_mask)  # Bug: not atomic"))

BWD_P_FROM_EXP_S = edit("bwd_dq_kernel", 'p = tl.exp(tl.where(keep, s, -float("inf")) - lse[:, None])',
                        'p = tl.exp(tl.where(keep, s, -float("inf"))) / tl.exp(lse[:, None])  # Bug: exp(S) overflows')

BWD_D_FROM_ONE_TILE = edit("bwd_dq_kernel", "ds = p * (dp - delta[:, None])",
                           "ds = p * (dp - tl.sum(p * dp, axis=1)[:, None])  # Bug: D from this key block only")

STYLE_BWD_UNEQUAL_BLOCKS = edit("flash_attention_backward", "block_m = block_n = 32",
                                "block_m, block_n = 16, 32   # query blocks smaller than key blocks")

BWD_GQA_NOT_SUMMED = edit("bwd_dkdv_kernel", "for g in range(GROUP):",
                          "for g in range(1):  # Bug: only the first query head of each group")

# The launcher passes the strides a contiguous tensor of the same shape would have: right for
# contiguous inputs only.
BWD_ASSUMES_CONTIGUOUS = edit(
    "flash_attention_backward", "    strides = [t.stride()[:3] for t in (q, k, v, do)]",
    "    strides = [torch.empty(t.shape).stride()[:3] for t in (q, k, v, do)]  # Bug: contiguous strides")

# v given k's strides and do q's, since they have the same shapes: right while each pair
# shares a layout, wrong where every input has a layout of its own, and in the capstone,
# whose dO reaches the kernels in another layout than q.
BWD_BORROWED_STRIDES = edit("flash_attention_backward", "strides = [t.stride()[:3] for t in (q, k, v, do)]",
                            "strides = [t.stride()[:3] for t in (q, k, k, q)]  # Bug: v's and do's strides")

# The batch and head offset of q taken as off_bh * stride_qh, as if stride_qb were H * stride_qh:
# right for contiguous q and for one sequence, wrong for a second sequence in another layout.
BWD_FLAT_BATCH_HEAD_OFFSET = edit(
    "bwd_dq_kernel", "q_tile = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn",
    "q_tile = tl.load(Q + off_bh * stride_qh + offs_m[:, None] * stride_qn")

# lse read as if contiguous: right for every visible case (flash_forward's lse is contiguous),
# wrong where the hidden tests pass it as a window of a longer buffer.
BWD_LSE_ASSUMED_CONTIGUOUS = edit("flash_attention_backward", "    lse = lse.float().contiguous()",
                                  "    lse = lse.float()  # Bug: the kernels index lse as contiguous")

# The head dimension cut at 64: D = 128 loses its last 64 columns.
BWD_HEAD_DIM_CUT_AT_64 = edit("flash_attention_backward", "block_d = max(16, triton.next_power_of_2(head_dim))",
                              "block_d = min(64, max(16, triton.next_power_of_2(head_dim)))  # Bug: D cut at 64")

# A launcher that allocates an N x N scratch buffer (and never needs it): only memory is wrong.
BWD_NXN_SCRATCH = edit("flash_attention_backward", "    block_m = block_n = 32\n",
                       "    block_m = block_n = 32\n"
                       "    scratch = torch.empty((batch, heads, seq_len, seq_len), device=q.device)  # Bug: N x N\n")

# A placeholder never replaced: the dK/dV kernel stores zeros. It runs, stores every byte of dK
# and dV, and compiles as well as any kernel; its results are wrong.
BWD_DKDV_STORES_ZEROS = {"bwd_dkdv_kernel": _edit(
    "bwd_dkdv_kernel", "tl.store(DK + out, (dk_acc * sm_scale).to(DK.dtype.element_ty), mask=kv_mask)",
    "tl.store(DK + out, tl.zeros_like(dk_acc).to(DK.dtype.element_ty), mask=kv_mask)  # Bug: a placeholder"
).replace("tl.store(DV + out, dv_acc.to(DV.dtype.element_ty), mask=kv_mask)",
          "tl.store(DV + out, tl.zeros_like(dv_acc).to(DV.dtype.element_ty), mask=kv_mask)")}

# Part of the results: dV is accumulated but never stored, so it is whatever torch.empty_like gave.
BWD_DV_NEVER_STORED = edit("bwd_dkdv_kernel", "tl.store(DV + out, dv_acc.to(DV.dtype.element_ty), mask=kv_mask)",
                           "pass  # Bug: dv_acc is never stored")

# The merge kernel stores zeros for every (sequence, head): the split kernel does the work, the
# output never gets it.
DECODE_MERGE_STORES_ZEROS = edit("decode_merge_kernel",
                                 "tl.store(Out + off_bh * head_dim + offs_d, out.to(Out.dtype.element_ty),",
                                 "tl.store(Out + off_bh * head_dim + offs_d, tl.zeros_like(out).to(Out.dtype.element_ty),"
                                 "  # Bug: a placeholder\n            ")

# Kernels that run only in the interpreter: NumPy inside @triton.jit computes on the
# interpreter's arrays, and a plain Python helper runs as Python; neither compiles for a GPU.
BWD_NUMPY_IN_KERNEL = edit("bwd_dkdv_kernel", 'p_t = tl.exp(tl.where(keep, s_t, -float("inf")) - lse[None, :])',
                           'p_t = np.exp(tl.where(keep, s_t, -float("inf")) - lse[None, :])  # Bug: NumPy inside a kernel')

DECODE_PLAIN_PYTHON_HELPER = {"decode_split_kernel": """
def _scaled_scores(k, q, sm_scale):   # Bug: a plain Python function (no @triton.jit) called by the kernel
    return tl.sum(k * q[None, :], axis=1) * sm_scale


""" + _edit("decode_split_kernel", 's = tl.where(valid, tl.sum(k * q[None, :], axis=1) * sm_scale, -float("inf"))',
            's = tl.where(valid, _scaled_scores(k, q, sm_scale), -float("inf"))')}

BWD_GRADS_IN_TORCH = {"flash_attention_backward": """
@triton.jit
def _copy(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)


def flash_attention_backward(q, k, v, o, lse, do, causal=False, sm_scale=None):
    group = q.shape[1] // k.shape[1]
    scale = sm_scale or q.shape[-1] ** -0.5
    qf, dof, of = q.float(), do.float(), o.float()
    keys, values = (t.float().repeat_interleave(group, 1) for t in (k, v))
    p = torch.exp(qf @ keys.transpose(-1, -2) * scale - lse[..., None])   # Bug: PyTorch computes the gradients
    if causal:
        p = p * torch.ones(p.shape[-2:], device=q.device).tril()
    ds = p * (dof @ values.transpose(-1, -2) - (dof * of).sum(-1, keepdim=True))
    fold = lambda t: t.reshape(t.shape[0], -1, group, *t.shape[2:]).sum(2)
    results = (ds @ keys * scale, fold(ds.transpose(-1, -2) @ qf * scale), fold(p.transpose(-1, -2) @ dof))
    grads = [torch.empty_like(t) for t in (q, k, v)]
    for src, dst in zip(results, grads):
        _copy[(triton.cdiv(src.numel(), 1024),)](src.to(dst.dtype).contiguous(), dst, src.numel(), BLOCK=1024)
    return tuple(grads)
"""}

# The same computed by NumPy on the host: no PyTorch operator to see, so only the kernels'
# loads can tell that the gradients do not come from the kernel.
BWD_GRADS_IN_NUMPY = {"flash_attention_backward": """
import numpy as np

@triton.jit
def _copy(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)


def flash_attention_backward(q, k, v, o, lse, do, causal=False, sm_scale=None):
    group = q.shape[1] // k.shape[1]
    scale = sm_scale or q.shape[-1] ** -0.5
    qf, dof, of, lf = (t.detach().cpu().double().numpy() for t in (q, do, o, lse))
    keys, values = (np.repeat(t.detach().cpu().double().numpy(), group, axis=1) for t in (k, v))
    p = np.exp(qf @ keys.swapaxes(-1, -2) * scale - lf[..., None])   # Bug: NumPy computes the gradients
    if causal:
        p = p * np.tri(p.shape[-1])
    ds = p * (dof @ values.swapaxes(-1, -2) - (dof * of).sum(-1, keepdims=True))
    fold = lambda t: t.reshape(t.shape[0], -1, group, *t.shape[2:]).sum(2)
    results = (ds @ keys * scale, fold(ds.swapaxes(-1, -2) @ qf * scale), fold(p.swapaxes(-1, -2) @ dof))
    grads = [torch.empty_like(t) for t in (q, k, v)]
    for src, dst in zip(results, grads):
        src = torch.from_numpy(np.ascontiguousarray(src)).to(device=dst.device, dtype=dst.dtype)
        _copy[(triton.cdiv(src.numel(), 1024),)](src, dst, src.numel(), BLOCK=1024)
    return tuple(grads)
"""}

# The book's staged kernels (its tiled product, row dot and dS kernels) with P held as an
# N x N matrix: every product runs in a Triton kernel, but the kernels are the book's.
BWD_BOOK_KERNELS = {"flash_attention_backward": """
from bookutils.staged_backward import BLOCK, _product, _row_dot_kernel, _score_grad_kernel


def flash_attention_backward(q, k, v, o, lse, do, causal=False, sm_scale=None):
    batch, heads, n, d = q.shape
    group = heads // k.shape[1]
    scale = sm_scale or d ** -0.5
    dq, dk, dv = (torch.zeros(t.shape, device=t.device, dtype=torch.float32) for t in (q, k, v))
    for b in range(batch):
        for h in range(heads):
            qf, of, dof = (t[b, h].float().contiguous() for t in (q, o, do))
            kf, vf = (t[b, h // group].float().contiguous() for t in (k, v))
            s = _product(qf, kf.T, scale)
            if causal:
                s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
            p = torch.exp(s - lse[b, h][:, None].float())   # Bug: the book's kernels and an N x N P
            delta = torch.empty(n, device=q.device, dtype=torch.float32)
            _row_dot_kernel[(triton.cdiv(n, BLOCK),)](of, dof, delta, n, d, BLOCK_M=BLOCK,
                                                      HEAD=max(16, triton.next_power_of_2(d)))
            dp = _product(dof, vf.T)
            ds = torch.empty_like(dp)
            _score_grad_kernel[(n,)](p, dp, delta, ds, n, ROW=max(16, triton.next_power_of_2(n)))
            dq[b, h] += _product(ds, kf, scale)
            dk[b, h // group] += _product(ds.T, qf, scale)
            dv[b, h // group] += _product(p.T, dof)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
"""}

# The same staged design with the book's kernels copied into the notebook: every kernel is
# the student's own, and only the N x N buffers give it away.
_STAGED = (Path(__file__).resolve().parents[2] / "bookutils" / "staged_backward.py").read_text()
_STAGED_KERNELS = _STAGED[_STAGED.index("BLOCK = 32"):_STAGED.index("def staged_backward(")]
BWD_COPIED_STAGED_KERNELS = {"flash_attention_backward": _STAGED_KERNELS + BWD_BOOK_KERNELS[
    "flash_attention_backward"].replace(
    "from bookutils.staged_backward import BLOCK, _product, _row_dot_kernel, _score_grad_kernel\n", "")}
assert "import" not in BWD_COPIED_STAGED_KERNELS["flash_attention_backward"]

# --- decoding ------------------------------------------------------------------------------

DECODE_IN_NUMPY = {"decode_attention": """
import numpy as np

@triton.jit
def _copy(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)


def decode_attention(q, k_cache, v_cache, cache_lens, sm_scale=None):
    # Bug: NumPy decodes on the host; a kernel with many programs only copies the answer out.
    qn, kn, vn = (t.detach().cpu().double().numpy() for t in (q, k_cache, v_cache))
    group = q.shape[1] // k_cache.shape[1]
    scale = sm_scale or q.shape[-1] ** -0.5
    out = np.empty_like(qn)
    for b, length in enumerate(cache_lens.tolist()):
        for h in range(q.shape[1]):
            s = kn[b, h // group, :length] @ qn[b, h] * scale
            w = np.exp(s - s.max())
            out[b, h] = w @ vn[b, h // group, :length] / w.sum()
    src = torch.from_numpy(out).to(device=q.device, dtype=q.dtype)
    dst = torch.empty_like(q)
    _copy[(triton.cdiv(src.numel(), 16),)](src, dst, src.numel(), BLOCK=16)
    return dst
"""}

# The number of chunks from the first sequence's length: a longer later sequence loses its tail
# once it needs more chunks than the first (chunks of 256: a later sequence past 256 shows it).
DECODE_CHUNKS_FROM_FIRST = {"decode_attention": _edit(
    "decode_attention", "num_chunks = triton.cdiv(max_len, chunk)",
    "num_chunks = triton.cdiv(int(cache_lens[0]), chunk)  # Bug: the first sequence's length").replace(
    "chunk = 64", "chunk = 256")}

# The launcher passes the strides of contiguous caches: right for contiguous caches only.
DECODE_ASSUMES_CONTIGUOUS = edit(
    "decode_attention", "*q.stride()[:2], *k_cache.stride()[:3], *v_cache.stride()[:3],",
    "*q.stride()[:2], *torch.empty(k_cache.shape).stride()[:3], *torch.empty(v_cache.shape).stride()[:3],  # Bug")

# A launcher that copies the caches to contiguous tensors (the old stubs' habit): right, but a
# decoding step then moves the cache three times.
DECODE_COPIES_THE_CACHE = edit(
    "decode_attention", "    q = q if q.stride(-1) == 1 else q.contiguous()      # one row per head; the caches are read in place\n",
    "    q, k_cache, v_cache = (t.contiguous() for t in (q, k_cache, v_cache))   # Bug: copies the caches\n")

# The merge weighs each chunk by l * exp(m): exp of a score in the hundreds overflows.
DECODE_MERGE_WITHOUT_MAX = edit("decode_merge_kernel", "weight = l * tl.exp(m - top)",
                                "weight = l * tl.exp(m)  # Bug: exp(m) overflows for large scores")

# Chunks of 16 positions, the outputs right: with four query heads on one float16 cache head
# (the visible test's second case) the partial states weigh half a cache window, which the
# prompt says the copy rule counts; two heads per float32 cache head (the hidden in-place
# test under the interpreter) weigh an eighth, and pass.
DECODE_CHUNKS_OF_16 = {"decode_attention": _edit("decode_attention", "chunk = 64", "chunk = 16").replace(
    "BLOCK_N=32", "BLOCK_N=16")}

# Chunks of 1024 positions whose output is l's quotient with no guard: a chunk with no keys
# stores 0/0, and the merge's zero weight keeps the NaN. Only a sequence shorter than a chunk,
# beside one longer than it, makes such a chunk: under the interpreter, only the split cell's.
DECODE_EMPTY_CHUNK_NAN = {
    "decode_attention": _edit("decode_attention", "chunk = 64", "chunk = 1024"),
    "decode_split_kernel": _edit("decode_split_kernel", "/ tl.where(l_chunk > 0, l_chunk, 1.0)",
                                 "/ l_chunk  # Bug: 0/0 for a chunk past the sequence's end")}

# q read with unit stride along its last axis, which the prompt does not promise for q.
DECODE_Q_LAST_AXIS_ASSUMED_CONTIGUOUS = edit(
    "decode_attention", "    q = q if q.stride(-1) == 1 else q.contiguous()      # one row per head; the caches are read in place\n",
    "")

DECODE_ONE_PROGRAM_PER_HEAD = edit("decode_attention", "chunk = 64",
                                   "chunk = triton.next_power_of_2(max_len)  # Bug: one chunk, one program per head")

# One program per head reads the cache; a copy kernel with a large grid runs first, so the
# largest grid of the call is large although the reading is not split.
DECODE_COPY_THEN_UNSPLIT = {"decode_attention": """
@triton.jit
def _copy(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)


""" + _edit("decode_attention", "chunk = 64", """copies = [torch.empty(t.shape, device=t.device, dtype=t.dtype)
              for t in (k_cache, v_cache)]
    for src, dst in zip((k_cache, v_cache), copies):   # Bug: only this copy runs on many programs
        _copy[(triton.cdiv(src.numel(), 256),)](src.contiguous(), dst, src.numel(), BLOCK=256)
    k_cache, v_cache = copies
    chunk = triton.next_power_of_2(max_len)""")}

STYLE_DECODE_TORCH_MERGE = {"decode_attention": _edit(
    "decode_attention",
    """    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    decode_merge_kernel[(batch * heads,)](m_part, l_part, o_part, out, head_dim, num_chunks,
                                          CHUNKS=max(2, triton.next_power_of_2(num_chunks)), BLOCK_D=block_d)
    return out""",
    """    top = m_part.amax(dim=1, keepdim=True)        # the merge, elementwise in PyTorch
    weight = l_part * torch.exp(m_part - top)
    merged = (o_part * weight[..., None]).sum(dim=1) / weight.sum(dim=1, keepdim=True)
    return merged.view(batch, heads, head_dim).to(q.dtype)""")}

# --- correct designs in other styles -------------------------------------------------------

# Grouped heads on the host: k and v repeated for every query head, the kernels run as for
# multi-head attention, and dK, dV summed over each group by PyTorch (a small host reduction).
STYLE_BWD_GQA_ON_HOST = {"flash_attention_backward": _edit(
    "flash_attention_backward", "    kv_heads = k.shape[1]\n",
    "    group = heads // k.shape[1]\n"
    "    k, v = (t.repeat_interleave(group, 1) for t in (k, v))   # one key/value head per query head\n"
    "    kv_heads = heads\n").replace(
    "    return dq, dk, dv",
    "    fold = lambda t: t.view(batch, heads // group, group, seq_len, head_dim).sum(2)\n"
    "    return dq, fold(dk), fold(dv)")}

# The kernels compute in float32 copies made by the launcher, which casts the gradients back.
STYLE_BWD_FLOAT32_COPIES = {"flash_attention_backward": _edit(
    "flash_attention_backward", "    q, k, v, o, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, o, do))",
    "    dtype = q.dtype\n"
    "    q, k, v, o, do = (t.float().contiguous() for t in (q, k, v, o, do))").replace(
    "    return dq, dk, dv", "    return dq.to(dtype), dk.to(dtype), dv.to(dtype)")}

# As many chunks as the longest sequence needs (not the cache's capacity).
STYLE_DECODE_CHUNKS_FROM_LONGEST = edit("decode_attention", "num_chunks = triton.cdiv(max_len, chunk)",
                                        "num_chunks = triton.cdiv(int(cache_lens.max()), chunk)")

# One program per (chunk, sequence, key/value head) for all the query heads of its group: each key
# and value is loaded once for the group (the grid is GROUP times smaller, still split), and the
# group's scores are a (GROUP, BLOCK_N) tile.
_GROUPED_SPLIT = """
@triton.jit
def decode_split_kernel(Q, K, V, Lens, M_part, L_part, O_part, num_heads, head_dim, num_chunks, sm_scale,
                        stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                        GROUP: tl.constexpr, GROUP_P2: tl.constexpr, CHUNK: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    chunk, off_bkv = tl.program_id(0), tl.program_id(1).to(tl.int64)
    kv_heads = num_heads // GROUP
    b, j = off_bkv // kv_heads, off_bkv % kv_heads
    length = tl.load(Lens + b)
    rows = tl.arange(0, GROUP_P2)                        # the group's query heads j * GROUP + rows
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = rows < GROUP
    q = tl.load(Q + b * stride_qb + (j * GROUP + rows[:, None]) * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & (offs_d[None, :] < head_dim), other=0.0).to(tl.float32)
    m = tl.full([GROUP_P2], -float("inf"), dtype=tl.float32)
    l = tl.zeros([GROUP_P2], dtype=tl.float32)
    acc = tl.zeros([GROUP_P2, BLOCK_D], dtype=tl.float32)
    for start in range(chunk * CHUNK, chunk * CHUNK + CHUNK, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        valid = cols < length
        mask = valid[:, None] & (offs_d[None, :] < head_dim)
        k = tl.load(K + b * stride_kb + j * stride_kh + cols[:, None] * stride_kn + offs_d[None, :],
                    mask=mask, other=0.0).to(tl.float32)
        v = tl.load(V + b * stride_vb + j * stride_vh + cols[:, None] * stride_vn + offs_d[None, :],
                    mask=mask, other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * sm_scale          # (GROUP_P2, BLOCK_N)
        s = tl.where(valid[None, :], s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        shift = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp(m - shift)
        p = tl.exp(s - shift[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    off_bh = b * num_heads + j * GROUP + rows
    tl.store(M_part + off_bh * num_chunks + chunk, m, mask=row_ok)
    tl.store(L_part + off_bh * num_chunks + chunk, l, mask=row_ok)
    o = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(O_part + (off_bh[:, None] * num_chunks + chunk) * head_dim + offs_d[None, :], o,
             mask=row_ok[:, None] & (offs_d[None, :] < head_dim))
"""
_GROUPED_LAUNCHER = _edit("decode_attention", """    decode_split_kernel[(num_chunks, batch * heads)](
        q, k_cache, v_cache, lens, m_part, l_part, o_part, heads, head_dim, num_chunks, sm_scale,
        *q.stride()[:2], *k_cache.stride()[:3], *v_cache.stride()[:3],
        GROUP=heads // kv_heads, CHUNK=chunk, BLOCK_N=32, BLOCK_D=block_d)""", """    group = heads // kv_heads
    decode_split_kernel[(num_chunks, batch * kv_heads)](
        q, k_cache, v_cache, lens, m_part, l_part, o_part, heads, head_dim, num_chunks, sm_scale,
        *q.stride()[:2], *k_cache.stride()[:3], *v_cache.stride()[:3],
        GROUP=group, GROUP_P2=triton.next_power_of_2(group), CHUNK=chunk, BLOCK_N=32, BLOCK_D=block_d)""")
STYLE_DECODE_GROUPED = {"decode_split_kernel": _GROUPED_SPLIT, "decode_attention": _GROUPED_LAUNCHER}

MERGE_CELLS = {"test_merge_softmax_states", "test_merge_values_hidden", "test_merge_extreme_hidden"}
TILED_CELLS = {"test_tiled_attention_backward", "test_tiled_bwd_output_hidden", "test_tiled_bwd_causal_hidden",
               "test_tiled_bwd_extreme_hidden", "test_tiled_bwd_memory_hidden"}
TRAFFIC_CELLS = {"test_hbm_traffic_backward", "test_traffic_backward_hidden"}
BWD_HIDDEN = {"test_bwd_output_hidden", "test_bwd_ragged_causal_hidden", "test_bwd_scale_hidden",
              "test_bwd_gqa_hidden", "test_bwd_memory_hidden"}
# Every cell of the backward launcher: results wrong on the visible test's inputs too, and on the
# calls the compile cell compiles (a compile point goes only to kernels that compute the results).
BWD_KERNEL_CELLS = BWD_HIDDEN | {"test_flash_attention_backward", "test_bwd_compiles_hidden"}
DECODE_KERNEL_CELLS = {"test_decode_attention", "test_decode_output_hidden", "test_decode_split_hidden",
                       "test_decode_in_place_hidden", "test_decode_compiles_hidden"}
BWD_CAUSAL_CELLS = {"test_flash_attention_backward", "test_bwd_ragged_causal_hidden", "test_bwd_scale_hidden",
                    "test_bwd_gqa_hidden", "test_bwd_output_hidden"}

BUGGY = {
    "merge_adds_o_without_rescaling": ({"merge_softmax_states": MERGE_NOT_RESCALED}, MERGE_CELLS),
    "merge_imports_the_books_helper": ({"merge_softmax_states": MERGE_FROM_BOOK}, MERGE_CELLS),
    "tiled_bwd_d_from_one_tile": ({"tiled_attention_backward": TILED_D_FROM_TILE}, TILED_CELLS),
    "tiled_bwd_p_without_lse": ({"tiled_attention_backward": TILED_P_WITHOUT_LSE}, {"test_tiled_bwd_extreme_hidden"}),
    "tiled_bwd_strip_of_p": ({"tiled_attention_backward": TILED_STRIP},
                             {"test_tiled_attention_backward", "test_tiled_bwd_memory_hidden"}),
    "tiled_bwd_causal_full_mask": ({"tiled_attention_backward": TILED_CAUSAL_FULL_MASK},
                                   {"test_tiled_attention_backward", "test_tiled_bwd_memory_hidden"}),
    "tiled_bwd_strips_in_memory_maps": ({"tiled_attention_backward": TILED_STRIPS_IN_MAPS},
                                        {"test_tiled_attention_backward", "test_tiled_bwd_memory_hidden"}),
    "traffic_backward_floor": ({"hbm_traffic_backward": TRAFFIC_FLOOR}, {"test_traffic_backward_hidden"}),
    "traffic_backward_through_float": ({"hbm_traffic_backward": TRAFFIC_THROUGH_FLOAT}, TRAFFIC_CELLS),
    "traffic_backward_int64": ({"hbm_traffic_backward": TRAFFIC_INT64}, TRAFFIC_CELLS),
    "bwd_ds_without_d": (BWD_DS_WITHOUT_D, BWD_KERNEL_CELLS),
    "bwd_dk_without_scale": (BWD_DK_UNSCALED, BWD_KERNEL_CELLS),
    "bwd_dq_without_scale": (BWD_DQ_UNSCALED, BWD_KERNEL_CELLS),
    "bwd_dq_accumulated_without_atomics": (BWD_DQ_WITHOUT_ATOMICS, BWD_KERNEL_CELLS),
    # Right in the interpreter, but its plain stores by several programs break the rules for kernels,
    # on the compiled calls as well.
    "bwd_dq_load_add_store_without_atomics": (BWD_DQ_LOAD_ADD_STORE, BWD_HIDDEN | {"test_bwd_compiles_hidden"}),
    "bwd_p_from_exp_s": (BWD_P_FROM_EXP_S, {"test_flash_attention_backward", "test_bwd_scale_hidden"}),
    "bwd_d_from_one_key_block": (BWD_D_FROM_ONE_TILE, BWD_KERNEL_CELLS),
    "bwd_no_causal_mask": (BWD_NO_CAUSAL_MASK, BWD_CAUSAL_CELLS | {"test_bwd_compiles_hidden"}),
    # The scale cell's last case has grouped heads too (large scores with one key head for two).
    "bwd_gqa_not_summed": (BWD_GQA_NOT_SUMMED, {"test_flash_attention_backward", "test_bwd_gqa_hidden",
                                                "test_bwd_output_hidden", "test_bwd_scale_hidden"}),
    "bwd_assumes_contiguous_inputs": (BWD_ASSUMES_CONTIGUOUS,
                                      {"test_flash_attention_backward", "test_bwd_output_hidden"}),
    "bwd_lse_assumed_contiguous": (BWD_LSE_ASSUMED_CONTIGUOUS, {"test_bwd_output_hidden"}),
    "bwd_borrowed_strides": (BWD_BORROWED_STRIDES, {"test_bwd_output_hidden"}),
    "bwd_flat_batch_head_offset": (BWD_FLAT_BATCH_HEAD_OFFSET, {"test_bwd_output_hidden"}),
    "bwd_head_dim_cut_at_64": (BWD_HEAD_DIM_CUT_AT_64, {"test_flash_attention_backward", "test_bwd_output_hidden"}),
    "bwd_nxn_scratch_buffer": (BWD_NXN_SCRATCH, {"test_flash_attention_backward", "test_bwd_memory_hidden"}),
    "bwd_numpy_inside_a_kernel": (BWD_NUMPY_IN_KERNEL, {"test_bwd_compiles_hidden"}),
    # Kernels that run and compile but do not compute the results lose the compile cell with the others.
    "bwd_dkdv_kernel_stores_zeros": (BWD_DKDV_STORES_ZEROS, BWD_KERNEL_CELLS),
    "bwd_dv_never_stored": (BWD_DV_NEVER_STORED, BWD_KERNEL_CELLS),
    "decode_merge_stores_zeros": (DECODE_MERGE_STORES_ZEROS, DECODE_KERNEL_CELLS),
    # Their copy kernel writes the host's gradients in order into outputs shaped like non-contiguous
    # inputs (torch.empty_like keeps the strides), so the visible non-contiguous test fails too.
    "bwd_gradients_in_torch": (BWD_GRADS_IN_TORCH, BWD_KERNEL_CELLS),
    "bwd_gradients_in_numpy": (BWD_GRADS_IN_NUMPY, BWD_HIDDEN | {"test_flash_attention_backward"}),
    "bwd_books_staged_kernels": (BWD_BOOK_KERNELS, BWD_HIDDEN | {"test_flash_attention_backward",
                                                                 "test_bwd_compiles_hidden"}),
    # Only the cells that look at memory see the N x N buffers; the products are the notebook's own kernels'.
    "bwd_copied_staged_kernels": (BWD_COPIED_STAGED_KERNELS, {"test_flash_attention_backward",
                                                              "test_bwd_memory_hidden"}),
    # Its host copies of the caches (in float64) cost the visible test and the in-place cell as well.
    "decode_in_numpy": (DECODE_IN_NUMPY, {"test_decode_attention", "test_decode_output_hidden",
                                          "test_decode_split_hidden", "test_decode_in_place_hidden"}),
    "decode_one_program_per_head": (DECODE_ONE_PROGRAM_PER_HEAD, {"test_decode_split_hidden"}),
    "decode_chunks_from_first_length": (DECODE_CHUNKS_FROM_FIRST, {"test_decode_attention", "test_decode_output_hidden"}),
    # The in-place cell's caches are windows of longer buffers: its outputs are wrong too.
    "decode_assumes_contiguous_inputs": (DECODE_ASSUMES_CONTIGUOUS,
                                         {"test_decode_attention", "test_decode_output_hidden",
                                          "test_decode_in_place_hidden"}),
    "decode_merge_without_max": (DECODE_MERGE_WITHOUT_MAX, {"test_decode_attention", "test_decode_output_hidden"}),
    "decode_plain_python_helper_in_a_kernel": (DECODE_PLAIN_PYTHON_HELPER, {"test_decode_compiles_hidden"}),
    # Its copies are buffers the size of the cache: the visible test sees them too.
    "decode_copy_kernel_then_one_program_per_head": (DECODE_COPY_THEN_UNSPLIT, {"test_decode_attention",
                                                                                  "test_decode_split_hidden",
                                                                                  "test_decode_in_place_hidden"}),
    # The visible test and the in-place cell see the copy; the outputs are right.
    "decode_copies_the_cache": (DECODE_COPIES_THE_CACHE, {"test_decode_attention", "test_decode_in_place_hidden"}),
    "decode_partial_states_of_16_position_chunks": (DECODE_CHUNKS_OF_16, {"test_decode_attention"}),
    "decode_empty_chunk_divides_0_by_0": (DECODE_EMPTY_CHUNK_NAN, {"test_decode_split_hidden"}),
    "decode_q_last_axis_assumed_contiguous": (DECODE_Q_LAST_AXIS_ASSUMED_CONTIGUOUS, {"test_decode_output_hidden"}),
}

CORRECT = {
    "merge_in_log_space": {"merge_softmax_states": STYLE_MERGE_LOGADDEXP},
    "tiled_bwd_keys_outermost_on_a_flat_batch": {"tiled_attention_backward": STYLE_TILED_KEYS_OUTERMOST},
    "tiled_bwd_with_scratch_files_in_tmp": {"tiled_attention_backward": STYLE_TILED_SCRATCH_FILES},
    "decode_merge_in_torch": STYLE_DECODE_TORCH_MERGE,
    "bwd_one_kernel_with_atomics": STYLE_BWD_ATOMICS,
    "bwd_unequal_blocks": STYLE_BWD_UNEQUAL_BLOCKS,
    "bwd_grouped_heads_on_the_host": STYLE_BWD_GQA_ON_HOST,
    "bwd_float32_copies": STYLE_BWD_FLOAT32_COPIES,
    "decode_chunks_from_the_longest": STYLE_DECODE_CHUNKS_FROM_LONGEST,
    "decode_one_program_per_key_value_head": STYLE_DECODE_GROUPED,
    "written_from_the_release_alone": INDEPENDENT[ASSIGNMENT],
}

# Planted answers that the integrity report must flag for a person to look at.
FLAGGED = {**{case: {"imports the book's helpers"}
              for case in ("merge_imports_the_books_helper", "bwd_books_staged_kernels")},
           **{case: {"sandbox: results computed outside the Triton kernels"}
              for case in ("bwd_gradients_in_numpy", "decode_in_numpy")},
           # Memory the process hides from tracemalloc, counted by the kernel: reported for a person.
           "tiled_bwd_strips_in_memory_maps": {"sandbox: memory measurements disagree"}}


# === Exercise 7: the capstone (kernel_attention, generate) ========================================
# Its own section: the strings, then its entries added to BUGGY and CORRECT, then the earlier
# kernel mistakes that also reach the capstone's cells (the capstone runs the student's kernels).


# The projections' heads tiled instead of grouped: query head h reads key/value head h % H_kv.
GLUE_TILED_HEADS = _edit("kernel_attention", "    heads_first = [t.transpose(1, 2) for t in (q, k, v)]\n", """    group = q.shape[2] // k.shape[2]
    k, v = (t.repeat(1, 1, group, 1) for t in (k, v))     # Bug: heads tiled, not grouped
    heads_first = [t.transpose(1, 2) for t in (q, k, v)]
""")
GLUE_NOT_CAUSAL = _edit("kernel_attention", "*heads_first, True, None)", "*heads_first, False, None)")
STYLE_GLUE_CONTIGUOUS = """
def kernel_attention(q, k, v):
    q, k, v = (t.permute(0, 2, 1, 3).contiguous() for t in (q, k, v))
    out = FlashAttention.apply(q, k, v, True, 1.0 / math.sqrt(q.shape[-1]))
    return out.permute(0, 2, 1, 3)
"""
# The lengths handed to decode_attention leave out the key just appended.
GENERATE_LENGTH_OFF_BY_ONE = _edit("generate", "cache[1, :, :, :window], lengths + 1)",
                                   "cache[1, :, :, :window], lengths)  # Bug: the new key is not counted")
# The cache and its windows sized from the first prompt, right while the first is the longest.
GENERATE_SIZED_BY_FIRST_PROMPT = _edit("generate", "capacity = max(lens) + n_new",
                                       "capacity = lens[0] + n_new  # Bug").replace(
    "window = max(lens) + step + 1", "window = lens[0] + step + 1")
# No cache: the whole sequence through the model at every step (right tokens, N times the work).
GENERATE_RECOMPUTES = """
def generate(model, prompts, n_new):
    out = []
    with torch.no_grad():
        for prompt in prompts:
            sequence = prompt[None]
            for _ in range(n_new):
                token = model(sequence, kernel_attention)[0, -1].argmax()
                sequence = torch.cat([sequence, token.view(1, 1)], dim=1)
            out.append(sequence[0, len(prompt):])
    return torch.stack(out)
"""
# A cache that grows by torch.cat at every step: a copy of the whole cache per token and layer.
GENERATE_CONCATENATES = _edit("generate", """                cache[0, rows, :, lengths] = k[:, 0]
                cache[1, rows, :, lengths] = v[:, 0]
                attended = decode_attention(q[:, 0], cache[0, :, :, :window], cache[1, :, :, :window], lengths + 1)""",
                              """                grown = torch.cat([cache[:, :, :, :window - 1], torch.zeros_like(cache[:, :, :, :1])], 3)
                grown[0, rows, :, lengths] = k[:, 0]
                grown[1, rows, :, lengths] = v[:, 0]
                cache[:, :, :, :window] = grown
                attended = decode_attention(q[:, 0], grown[0], grown[1], lengths + 1)""")
GENERATE_RETURNS_LIST = _edit("generate", "    return torch.stack(tokens, dim=1)",
                              "    return [row.tolist() for row in torch.stack(tokens, dim=1)]")
# The cache laid out (n_batch, L_max, H_kv, d), as the projections come, and read as
# (n_batch, H_kv, L_max, d) views; one buffer per layer for keys and one for values.
STYLE_GENERATE_POSITIONS_FIRST = """
def generate(model, prompts, n_new):
    device = model.out.weight.device
    lens = torch.tensor([len(p) for p in prompts], device=device)
    size = (len(prompts), int(lens.max()) + n_new + 8, model.kv_heads, model.head_dim)
    keys = [torch.zeros(size, device=device) for _ in model.blocks]
    values = [torch.zeros(size, device=device) for _ in model.blocks]
    firsts = []
    with torch.no_grad():
        for b, prompt in enumerate(prompts):
            x = model.embed(prompt)[None]
            for block, kc, vc in zip(model.blocks, keys, values):
                q, k, v = block.project(x, torch.arange(len(prompt), device=device))
                kc[b, :len(prompt)], vc[b, :len(prompt)] = k[0], v[0]
                x = block.finish(x, kernel_attention(q, k, v))
            firsts.append(model.logits(x)[0, -1].argmax())
        new = [torch.stack(firsts)]
        batch = torch.arange(len(prompts), device=device)
        for _ in range(n_new - 1):
            x = model.embed(new[-1]).unsqueeze(1)
            for block, kc, vc in zip(model.blocks, keys, values):
                q, k, v = block.project(x, lens.unsqueeze(1))
                kc[batch, lens], vc[batch, lens] = k[:, 0], v[:, 0]
                x = block.finish(x, decode_attention(q[:, 0], kc.transpose(1, 2), vc.transpose(1, 2),
                                                     lens + 1).unsqueeze(1))
            lens = lens + 1
            new.append(model.logits(x[:, 0]).argmax(dim=-1))
    return torch.stack(new, dim=1)
"""
GENERATE_LENGTH_ONE_TOO_MANY = _edit("generate", "cache[1, :, :, :window], lengths + 1)",
                                     "cache[1, :, :, :window + 1], lengths + 2)  # Bug: one slot too many")

CAPSTONE_TRAINING = {"test_capstone_training_hidden"}
CAPSTONE_GENERATE = {"test_capstone_generate_hidden"}
CAPSTONE_CACHE = {"test_capstone_cache_hidden"}

BUGGY.update({
    "capstone_heads_tiled_not_grouped": ({"kernel_attention": GLUE_TILED_HEADS}, CAPSTONE_TRAINING | CAPSTONE_GENERATE),
    "capstone_attention_not_causal": ({"kernel_attention": GLUE_NOT_CAUSAL}, CAPSTONE_TRAINING | CAPSTONE_GENERATE),
    "capstone_new_key_not_counted": ({"generate": GENERATE_LENGTH_OFF_BY_ONE}, CAPSTONE_GENERATE),
    "capstone_one_key_too_many": ({"generate": GENERATE_LENGTH_ONE_TOO_MANY}, CAPSTONE_GENERATE),
    "capstone_recomputes_without_cache": ({"generate": GENERATE_RECOMPUTES}, CAPSTONE_CACHE),
    "capstone_cache_concatenated_each_step": ({"generate": GENERATE_CONCATENATES}, CAPSTONE_CACHE),
    "capstone_returns_a_list": ({"generate": GENERATE_RETURNS_LIST}, CAPSTONE_GENERATE),
    "capstone_cache_sized_by_the_first_prompt": ({"generate": GENERATE_SIZED_BY_FIRST_PROMPT},
                                                 CAPSTONE_GENERATE | CAPSTONE_CACHE),
})
CORRECT.update({
    "capstone_contiguous_copies_for_the_kernels": {"kernel_attention": STYLE_GLUE_CONTIGUOUS},
    "capstone_cache_positions_first": {"generate": STYLE_GENERATE_POSITIONS_FIRST},
})
# Earlier mistakes that the capstone's runs meet as well: wrong gradients (or the book's kernels)
# change the training's losses; wrong decoding outputs change the generated tokens.
for _case in ("bwd_assumes_contiguous_inputs", "bwd_books_staged_kernels", "bwd_borrowed_strides",
              "bwd_dk_without_scale", "bwd_dkdv_kernel_stores_zeros", "bwd_dq_without_scale", "bwd_ds_without_d",
              "bwd_dv_never_stored", "bwd_gqa_not_summed", "bwd_gradients_in_numpy", "bwd_gradients_in_torch",
              "bwd_no_causal_mask"):
    BUGGY[_case] = (BUGGY[_case][0], BUGGY[_case][1] | CAPSTONE_TRAINING)
for _case in ("decode_assumes_contiguous_inputs", "decode_merge_stores_zeros"):
    BUGGY[_case] = (BUGGY[_case][0], BUGGY[_case][1] | CAPSTONE_GENERATE)
