"""Planted submissions for ch4_flash.

Each case replaces some solution cells (keyed by grade_id) of an otherwise
correct submission. `loses` names the test cells that must score 0; every other
autograded cell must get full points. The kernel mistakes are written as edits
of the instructor's kernel and launcher, one line each, so each case shows
exactly the mistake it plants."""
from pathlib import Path

import nbformat

from tests.notebooks import nbgrader_meta, solution_code

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


def kernel_edit(old, new):
    return {"attention_fwd_kernel": _edit("attention_fwd_kernel", old, new)}


def launcher_edit(old, new):
    return {"flash_attention": _edit("flash_attention", old, new)}


# --- online softmax statistics ----------------------------------------------------

STATS_NO_RESCALE = '''
def online_softmax_stats(x, block_size):
    m = np.full(x.shape[:-1], -np.inf)
    l = np.zeros(x.shape[:-1])
    for s in range(0, x.shape[-1], block_size):
        block = x[..., s:s + block_size]
        m = np.maximum(m, block.max(axis=-1))
        l = l + np.exp(block - m[..., None]).sum(axis=-1)  # Bug: the old sum is not rescaled
    return m, l
'''

STATS_NAN_ON_EMPTY_ROWS = '''
def online_softmax_stats(x, block_size):
    m = np.full(x.shape[:-1], -np.inf)
    l = np.zeros(x.shape[:-1])
    for s in range(0, x.shape[-1], block_size):
        block = x[..., s:s + block_size]
        m_new = np.maximum(m, block.max(axis=-1))
        l = l * np.exp(m - m_new) + np.exp(block - m_new[..., None]).sum(axis=-1)  # Bug: -inf - -inf is nan
        m = m_new
    return m, l
'''

STATS_2D_ONLY = '''
def online_softmax_stats(x, block_size):
    rows, cols = x.shape  # Bug: 1-D and 3-D inputs fail
    m = np.full(rows, -np.inf)
    l = np.zeros(rows)
    for s in range(0, cols, block_size):
        block = x[:, s:s + block_size]
        m_new = np.maximum(m, block.max(axis=1))
        safe = np.where(np.isinf(m_new), 0.0, m_new)
        l = l * np.exp(m - safe) + np.exp(block - safe[:, None]).sum(axis=1)
        m = m_new
    return m, l
'''

STYLE_STATS_LOG_SPACE = '''
def online_softmax_stats(x, block_size):
    """Accumulate log(sum(exp(x))) with logaddexp, then shift by the max at the end."""
    x = np.asarray(x, dtype=float)
    m = np.full(x.shape[:-1], -np.inf)
    lse = np.full(x.shape[:-1], -np.inf)
    for s in range(0, x.shape[-1], block_size):
        block = x[..., s:s + block_size]
        block_max = block.max(axis=-1)
        finite = np.isfinite(block_max)
        shift = np.where(finite, block_max, 0.0)
        with np.errstate(divide="ignore"):
            block_lse = np.log(np.exp(block - shift[..., None]).sum(axis=-1)) + shift
        lse = np.logaddexp(lse, np.where(finite, block_lse, -np.inf))
        m = np.maximum(m, block_max)
    l = np.where(np.isneginf(m), 0.0, np.exp(lse - np.where(np.isneginf(m), 0.0, m)))
    return m, l
'''

# --- tiled attention --------------------------------------------------------------------

TILED_FULL_ROW = '''
def tiled_attention(q, k, v, block_m, block_n, causal=False):
    d = q.shape[-1]
    out = np.empty(q.shape[:-1] + v.shape[-1:])
    for i in range(0, q.shape[-2], block_m):
        s = q[..., i:i + block_m, :] @ np.swapaxes(k, -1, -2) / np.sqrt(d)  # Bug: a block_m x n strip
        if causal:
            rows = np.arange(i, i + s.shape[-2])[:, None]
            s = np.where(np.arange(s.shape[-1]) <= rows, s, -np.inf)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        out[..., i:i + block_m, :] = p / p.sum(axis=-1, keepdims=True) @ v
    return out
'''

TILED_NO_RESCALE = _edit("tiled_attention", "acc = decay[..., None] * acc + weights @ v",
                         "acc = acc + weights @ v  # Bug: not rescaled when the max grows\n            _ = decay")

TILED_CAUSAL_STRICT = _edit("tiled_attention", "tile = np.where(cols <= rows[:, None], tile, -np.inf)",
                            "tile = np.where(cols < rows[:, None], tile, -np.inf)  # Bug: the diagonal is masked")

TILED_NO_SCALE = _edit("tiled_attention", "q_blk = q[..., top:top + block_m, :] / math.sqrt(q.shape[-1])",
                       "q_blk = q[..., top:top + block_m, :]  # Bug: no 1/sqrt(d)")

TILED_2D_ONLY = '''
def tiled_attention(q, k, v, block_m, block_n, causal=False):
    n, d = q.shape[-2], q.shape[-1]
    out = np.zeros((n, v.shape[-1]))  # Bug: batch axes dropped
    for i in range(0, n, block_m):
        qi = q[i:i + block_m] / np.sqrt(d)  # Bug: slices the first axis, whatever it is
        m = np.full(len(qi), -np.inf)
        l = np.zeros(len(qi))
        acc = np.zeros((len(qi), v.shape[-1]))
        for j in range(0, k.shape[-2], block_n):
            s = qi @ k[j:j + block_n].T
            if causal:
                s = np.where(np.arange(j, j + s.shape[1]) <= np.arange(i, i + len(qi))[:, None], s, -np.inf)
            m_new = np.maximum(m, s.max(axis=1))
            scale = np.exp(m - m_new)
            p = np.exp(s - m_new[:, None])
            l = l * scale + p.sum(axis=1)
            acc = acc * scale[:, None] + p @ v[j:j + block_n]
            m = m_new
        out[i:i + block_m] = acc / l[:, None]
    return out
'''

STYLE_TILED_KEYS_OUTER = '''
def tiled_attention(q, k, v, block_m, block_n, causal=False):
    """Key blocks in the outer loop: running state kept for every query (O(n d) memory);
    causal tiles are masked, not skipped."""
    q = np.asarray(q, dtype=float) / np.sqrt(q.shape[-1])
    n_q, n_k = q.shape[-2], k.shape[-2]
    m = np.full(q.shape[:-1], -np.inf)
    l = np.zeros(q.shape[:-1])
    acc = np.zeros(q.shape[:-1] + (v.shape[-1],))
    for j in range(0, n_k, block_n):
        kj, vj = k[..., j:j + block_n, :], v[..., j:j + block_n, :]
        for i in range(0, n_q, block_m):
            s = np.matmul(q[..., i:i + block_m, :], np.swapaxes(kj, -1, -2))
            if causal:
                keep = np.arange(j, j + s.shape[-1])[None, :] <= np.arange(i, i + s.shape[-2])[:, None]
                s = np.where(keep, s, -np.inf)
            m_old = m[..., i:i + block_m]
            m_new = np.maximum(m_old, s.max(axis=-1))
            safe = np.where(np.isneginf(m_new), 0.0, m_new)
            alpha = np.exp(m_old - safe)
            p = np.exp(s - safe[..., None])
            l[..., i:i + block_m] = alpha * l[..., i:i + block_m] + p.sum(axis=-1)
            acc[..., i:i + block_m, :] = alpha[..., None] * acc[..., i:i + block_m, :] + p @ vj
            m[..., i:i + block_m] = m_new
    return acc / l[..., None]
'''

# --- traffic ---------------------------------------------------------------------------

TRAFFIC_STANDARD_NO_P_READ = '''
def hbm_traffic_standard(n, d):
    return 4 * n * d + 3 * n * n  # Bug: P is written but never read back
'''

TRAFFIC_FLASH_FLOOR = '''
def hbm_traffic_flash(n, d, block_m):
    return 2 * n * d + 2 * n * d * (n // block_m)  # Bug: floor, so a last partial block is not counted
'''

TRAFFIC_FLASH_FLOAT = '''
def hbm_traffic_flash(n, d, block_m):
    return 2 * n * d * (1 + math.ceil(n / block_m)) * 1.0  # Bug: a float
'''

# --- the Triton kernel -------------------------------------------------------------------

FLASH_FULL_ROW = launcher_edit("block_m = block_n = 32",
                               "block_m, block_n = 32, max(16, triton.next_power_of_2(seq_len))  # Bug: BLOCK_N = N")

FLASH_NO_RESCALE = kernel_edit("out_acc = out_acc * correction[:, None] + tl.dot(",
                               "out_acc = out_acc + tl.dot(")   # Bug: the accumulator keeps its old scale

FLASH_NO_RAGGED_MASK = kernel_edit("visible = key_idx[None, :] < seq_len",
                                   "visible = key_idx[None, :] >= 0  # Bug: padded keys of the last block count")

FLASH_CAUSAL_OFF_BY_ONE = kernel_edit("visible & (key_idx[None, :] <= offs_m[:, None])",
                                      "visible & (key_idx[None, :] < offs_m[:, None])")  # Bug: no diagonal

FLASH_DOUBLE_SCALE = kernel_edit("qk = tl.dot(q_tile, tl.trans(k_tile)) * sm_scale",
                                 "qk = tl.dot(q_tile * sm_scale, tl.trans(k_tile)) * sm_scale")  # Bug: scaled twice

FLASH_TORCH_SCORES = {"flash_attention": '''
@triton.jit
def _weighted_sum(P, V, O, n, d, BLOCK: tl.constexpr, D: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    dims = tl.arange(0, D)
    acc = tl.zeros((D,), dtype=tl.float32)
    for j in range(0, n, BLOCK):
        p = tl.load(P + row * n + j + cols, mask=j + cols < n, other=0.0)
        v = tl.load(V + (row // n) * n * d + (j + cols)[:, None] * d + dims[None, :],
                    mask=(j + cols)[:, None] < n, other=0.0)
        acc += tl.sum(p[:, None] * v, axis=0)
    tl.store(O + row * d + dims, acc)


def flash_attention(q, k, v, causal=False, sm_scale=None):
    B, H, N, D = q.shape
    scale = 1 / math.sqrt(D) if sm_scale is None else sm_scale
    s = (q @ k.transpose(-1, -2)) * scale          # Bug: the N x N scores built by PyTorch
    if causal:
        s = s.masked_fill(torch.ones(N, N, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    p = torch.softmax(s, dim=-1).contiguous()
    out = torch.empty(B, H, N, D, device=q.device, dtype=q.dtype)
    _weighted_sum[(B * H * N,)](p, v.contiguous(), out, N, D, BLOCK=32, D=D)
    return out
'''}

FLASH_CALLS_SDPA = {"flash_attention": '''
def flash_attention(q, k, v, causal=False, sm_scale=None):
    import torch.nn.functional as F
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale)  # Bug: not a kernel
'''}

FLASH_NOOP_KERNEL = {"flash_attention": '''
@triton.jit
def _touch(X):
    pass


def flash_attention(q, k, v, causal=False, sm_scale=None):
    """Computes with NumPy, one query at a time (O(N) memory), and launches a kernel that does nothing."""
    B, H, N, D = q.shape
    scale = 1 / math.sqrt(D) if sm_scale is None else sm_scale
    qn, kn, vn = (t.detach().cpu().double().numpy() for t in (q, k, v))
    out = np.empty(qn.shape)
    for i in range(N):
        stop = i + 1 if causal else N
        s = np.einsum("bhd,bhjd->bhj", qn[:, :, i], kn[:, :, :stop]) * scale
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        out[:, :, i] = np.einsum("bhj,bhjd->bhd", p / p.sum(axis=-1, keepdims=True), vn[:, :, :stop])
    result = torch.from_numpy(out).to(device=q.device, dtype=q.dtype)
    _touch[(1,)](result)  # Bug: the kernel neither loads nor stores anything
    return result
'''}

STYLE_FLASH_EXP2_CONTIGUOUS = {
    "attention_fwd_kernel": '''
@triton.jit
def attention_fwd_kernel(Q, K, V, Out, n_ctx, qk_scale_log2,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD: tl.constexpr, CAUSAL: tl.constexpr):
    """Contiguous (B*H, N, HEAD) inputs; softmax in base 2 with log2(e) folded into the scale."""
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    base = pid_bh * n_ctx * HEAD
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, HEAD)
    q = tl.load(Q + base + rm[:, None] * HEAD + rd[None, :], mask=rm[:, None] < n_ctx, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, HEAD], 0.0, tl.float32)
    stop = tl.minimum((pid_m + 1) * BLOCK_M, n_ctx) if CAUSAL else n_ctx
    for start in range(0, stop, BLOCK_N):
        cn = start + rn
        kt = tl.load(K + base + cn[None, :] * HEAD + rd[:, None], mask=cn[None, :] < n_ctx, other=0.0)
        s = tl.dot(q, kt) * qk_scale_log2
        ok = cn[None, :] < n_ctx
        if CAUSAL:
            ok = ok & (rm[:, None] >= cn[None, :])
        s = tl.where(ok, s, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        vb = tl.load(V + base + cn[:, None] * HEAD + rd[None, :], mask=cn[:, None] < n_ctx, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_ij
    tl.store(Out + base + rm[:, None] * HEAD + rd[None, :], acc / l_i[:, None], mask=rm[:, None] < n_ctx)
''',
    "flash_attention": '''
def flash_attention(q, k, v, causal=False, sm_scale=None):
    B, H, N, D = q.shape
    scale = sm_scale if sm_scale is not None else D ** -0.5
    q3, k3, v3 = (t.reshape(B * H, N, D).contiguous() for t in (q, k, v))
    out = torch.empty_like(q3)
    grid = (triton.cdiv(N, 16), B * H)
    attention_fwd_kernel[grid](q3, k3, v3, out, N, scale * 1.4426950408889634,
                               BLOCK_M=16, BLOCK_N=64, HEAD=D, CAUSAL=causal)
    return out.view(B, H, N, D)
'''}

STYLE_FLASH_TWO_PASS = {
    "attention_fwd_kernel": '''
@triton.jit
def attention_fwd_kernel(Q, K, V, Out, sq, sk, sv, so, H, N, D, scale,
                         BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, CAUSAL: tl.constexpr):
    """Two passes over the keys: first the row max and sum, then the normalised weights times V."""
    i = tl.program_id(0)
    b, h = tl.program_id(1) // H, tl.program_id(1) % H
    rows = i * BM + tl.arange(0, BM)
    dd = tl.arange(0, BD)
    qp = Q + b * sq[0] + h * sq[1]
    kp = K + b * sk[0] + h * sk[1]
    vp = V + b * sv[0] + h * sv[1]
    q = tl.load(qp + rows[:, None] * sq[2] + dd[None, :] * sq[3], mask=(rows[:, None] < N) & (dd[None, :] < D), other=0.0)
    end = tl.minimum(N, (i + 1) * BM) if CAUSAL else N
    mx = tl.full([BM], float("-inf"), tl.float32)
    for j in range(0, end, BN):
        cols = j + tl.arange(0, BN)
        kt = tl.load(kp + cols[:, None] * sk[2] + dd[None, :] * sk[3], mask=(cols[:, None] < N) & (dd[None, :] < D), other=0.0)
        s = tl.dot(q, tl.trans(kt)) * scale
        good = (cols[None, :] < N) & ((cols[None, :] <= rows[:, None]) | (not CAUSAL))
        mx = tl.maximum(mx, tl.max(tl.where(good, s, float("-inf")), 1))
    total = tl.zeros([BM], tl.float32)
    for j in range(0, end, BN):
        cols = j + tl.arange(0, BN)
        kt = tl.load(kp + cols[:, None] * sk[2] + dd[None, :] * sk[3], mask=(cols[:, None] < N) & (dd[None, :] < D), other=0.0)
        s = tl.dot(q, tl.trans(kt)) * scale
        good = (cols[None, :] < N) & ((cols[None, :] <= rows[:, None]) | (not CAUSAL))
        total += tl.sum(tl.where(good, tl.exp(s - mx[:, None]), 0.0), 1)
    acc = tl.zeros([BM, BD], tl.float32)
    for j in range(0, end, BN):
        cols = j + tl.arange(0, BN)
        kt = tl.load(kp + cols[:, None] * sk[2] + dd[None, :] * sk[3], mask=(cols[:, None] < N) & (dd[None, :] < D), other=0.0)
        vt = tl.load(vp + cols[:, None] * sv[2] + dd[None, :] * sv[3], mask=(cols[:, None] < N) & (dd[None, :] < D), other=0.0)
        s = tl.dot(q, tl.trans(kt)) * scale
        good = (cols[None, :] < N) & ((cols[None, :] <= rows[:, None]) | (not CAUSAL))
        p = tl.where(good, tl.exp(s - mx[:, None]), 0.0) / total[:, None]
        acc += tl.dot(p.to(vt.dtype), vt)
    op = Out + b * so[0] + h * so[1] + rows[:, None] * so[2] + dd[None, :] * so[3]
    tl.store(op, acc, mask=(rows[:, None] < N) & (dd[None, :] < D))
''',
    "flash_attention": '''
def flash_attention(q, k, v, causal=False, sm_scale=None):
    B, H, N, D = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    attention_fwd_kernel[(triton.cdiv(N, 64), B * H)](
        q, k, v, out, q.stride(), k.stride(), v.stride(), out.stride(), H, N, D,
        1 / math.sqrt(D) if sm_scale is None else sm_scale,
        BM=64, BN=32, BD=max(16, triton.next_power_of_2(D)), CAUSAL=causal)
    return out
'''}

STATS_CELLS = {"test_online_softmax_stats", "test_stats_values_hidden", "test_stats_extreme_hidden"}
TILED_OUTPUT_CELLS = {"test_tiled_attention", "test_tiled_output_hidden", "test_tiled_causal_hidden",
                      "test_tiled_extreme_hidden", "test_tiled_memory_hidden"}
FLASH_HIDDEN = {"test_flash_output_hidden", "test_flash_ragged_hidden", "test_flash_causal_hidden",
                "test_flash_scale_hidden", "test_flash_strides_hidden", "test_flash_memory_hidden"}
FLASH_CAUSAL_CELLS = {"test_flash_ragged_hidden", "test_flash_causal_hidden", "test_flash_scale_hidden",
                      "test_flash_strides_hidden"}

BUGGY = {
    "stats_sum_not_rescaled": ({"online_softmax_stats": STATS_NO_RESCALE}, STATS_CELLS),
    "stats_nan_on_empty_rows": ({"online_softmax_stats": STATS_NAN_ON_EMPTY_ROWS},
                                {"test_online_softmax_stats", "test_stats_extreme_hidden"}),
    "stats_2d_only": ({"online_softmax_stats": STATS_2D_ONLY}, {"test_stats_values_hidden"}),
    "tiled_full_row_of_scores": ({"tiled_attention": TILED_FULL_ROW},
                                 {"test_tiled_attention", "test_tiled_memory_hidden"}),
    "tiled_accumulator_not_rescaled": ({"tiled_attention": TILED_NO_RESCALE}, TILED_OUTPUT_CELLS),
    "tiled_causal_masks_diagonal": ({"tiled_attention": TILED_CAUSAL_STRICT},
                                    {"test_tiled_attention", "test_tiled_causal_hidden", "test_tiled_extreme_hidden"}),
    "tiled_no_scaling": ({"tiled_attention": TILED_NO_SCALE}, TILED_OUTPUT_CELLS),
    "tiled_2d_only": ({"tiled_attention": TILED_2D_ONLY}, {"test_tiled_output_hidden", "test_tiled_causal_hidden"}),
    "traffic_standard_no_p_read": ({"hbm_traffic_standard": TRAFFIC_STANDARD_NO_P_READ},
                                   {"test_hbm_traffic", "test_traffic_standard_hidden"}),
    "traffic_flash_floor": ({"hbm_traffic_flash": TRAFFIC_FLASH_FLOOR}, {"test_traffic_flash_hidden"}),
    "traffic_flash_float": ({"hbm_traffic_flash": TRAFFIC_FLASH_FLOAT}, {"test_hbm_traffic", "test_traffic_flash_hidden"}),
    "flash_block_n_is_whole_row": (FLASH_FULL_ROW, {"test_flash_memory_hidden"}),
    "flash_accumulator_not_rescaled": (FLASH_NO_RESCALE, FLASH_HIDDEN | {"test_flash_attention"}),
    "flash_ragged_keys_not_masked": (FLASH_NO_RAGGED_MASK, {"test_flash_attention", "test_flash_ragged_hidden"}),
    "flash_causal_masks_diagonal": (FLASH_CAUSAL_OFF_BY_ONE, FLASH_CAUSAL_CELLS | {"test_flash_attention"}),
    "flash_scale_applied_twice": (FLASH_DOUBLE_SCALE, FLASH_HIDDEN | {"test_flash_attention"}),
    "flash_scores_in_torch": (FLASH_TORCH_SCORES, FLASH_HIDDEN),
    "flash_calls_sdpa": (FLASH_CALLS_SDPA, FLASH_HIDDEN),
    "flash_noop_kernel": (FLASH_NOOP_KERNEL, FLASH_HIDDEN),
}

CORRECT = {
    "stats_log_space_tiled_keys_outer": {"online_softmax_stats": STYLE_STATS_LOG_SPACE,
                                         "tiled_attention": STYLE_TILED_KEYS_OUTER},
    "flash_exp2_contiguous_copies": STYLE_FLASH_EXP2_CONTIGUOUS,
    "flash_two_pass": STYLE_FLASH_TWO_PASS,
}
