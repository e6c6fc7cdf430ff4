"""Reference implementations for Chapter 4 (FlashAttention), in float64 NumPy."""
import math

import numpy as np


def online_softmax_stats(x, block_size):
    """Row max m and l = sum(exp(x - m)) over the last axis, reading block_size
    columns at a time and rescaling the running sum whenever the max grows."""
    x = np.asarray(x, dtype=np.float64)
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    m = np.full(x.shape[:-1], -np.inf)
    l = np.zeros(x.shape[:-1])
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]
        m_new = np.maximum(m, block.max(axis=-1))
        # A row that is -inf so far keeps l = 0; exp(-inf - -inf) would be NaN.
        safe = np.where(np.isneginf(m_new), 0.0, m_new)
        l = l * np.exp(m - safe) + np.exp(block - safe[..., None]).sum(axis=-1)
        m = m_new
    return m, l


def attention_with_lse(q, k, v, causal=False, sm_scale=None):
    """Exact attention over the last two axes, and the log-sum-exp of each row of
    scaled scores (what a FlashAttention forward pass keeps for the backward)."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        n_q, n_k = s.shape[-2:]
        s = np.where(np.tril(np.ones((n_q, n_k), dtype=bool)), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    return (p / l) @ v, (m + np.log(l))[..., 0]


def attention(q, k, v, causal=False, sm_scale=None):
    return attention_with_lse(q, k, v, causal, sm_scale)[0]


def tiled_attention(q, k, v, block_m, block_n, causal=False):
    """FlashAttention's forward pass in NumPy: for each block of block_m queries,
    stream blocks of block_n keys, keeping only a block_m x block_n score tile.
    Causal tiles entirely above the diagonal are skipped."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    n_q, d = q.shape[-2:]
    n_k = k.shape[-2]
    scale = 1.0 / math.sqrt(d)
    out = np.empty(q.shape[:-1] + (v.shape[-1],))
    for i0 in range(0, n_q, block_m):
        qi = q[..., i0:i0 + block_m, :]
        rows = np.arange(i0, i0 + qi.shape[-2])
        m = np.full(qi.shape[:-1], -np.inf)
        l = np.zeros(qi.shape[:-1])
        acc = np.zeros(qi.shape[:-1] + (v.shape[-1],))
        stop = min(n_k, i0 + qi.shape[-2]) if causal else n_k
        for j0 in range(0, stop, block_n):
            s = qi @ np.swapaxes(k[..., j0:j0 + block_n, :], -1, -2) * scale
            if causal:
                cols = np.arange(j0, j0 + s.shape[-1])
                s = np.where(cols[None, :] <= rows[:, None], s, -np.inf)
            m_new = np.maximum(m, s.max(axis=-1))
            alpha = np.exp(m - m_new)
            p = np.exp(s - m_new[..., None])
            l = l * alpha + p.sum(axis=-1)
            acc = acc * alpha[..., None] + p @ v[..., j0:j0 + block_n, :]
            m = m_new
        out[..., i0:i0 + block_m, :] = acc / l[..., None]
    return out


def hbm_traffic_standard(n, d):
    """Elements moved by standard attention (one head): read Q, K (2nd), write S
    (n^2); read S, write P (2n^2); read P, V (n^2 + nd), write O (nd)."""
    return 4 * n * d + 4 * n * n


def hbm_traffic_flash(n, d, block_m):
    """Elements moved by the tiled forward pass: Q read once and O written once
    (2nd); every one of the ceil(n / block_m) query blocks reads all of K and V."""
    return 2 * n * d + 2 * n * d * (-(-n // block_m))


# ---------------------------------------------------------------- merging partial softmax states

def merge_softmax_states(m, l, o):
    """Merge C partial softmax states of one row (axis 0 indexes the key chunks):
    m[c] is chunk c's max score, l[c] = sum(exp(s - m[c])) and o[c] its normalised
    output (zeros where l[c] = 0). Returns the (m, l, o) of all the chunks together."""
    m, l, o = (np.asarray(a, dtype=np.float64) for a in (m, l, o))
    m_all = m.max(axis=0)
    safe = np.where(np.isneginf(m_all), 0.0, m_all)
    weight = l * np.exp(m - safe)                    # each chunk's sum, carried to the common max
    l_all = weight.sum(axis=0)
    total = (weight[..., None] * o).sum(axis=0)
    o_all = np.divide(total, l_all[..., None], out=np.zeros_like(total), where=l_all[..., None] > 0)
    return m_all, l_all, o_all


# ---------------------------------------------------------------- the backward pass

def _expand_heads(x, heads):
    """(..., H_kv, n, d) -> (..., heads, n, d), each key/value head shared by heads // H_kv query heads."""
    return np.repeat(x, heads // x.shape[-3], axis=-3) if x.ndim >= 3 and x.shape[-3] != heads else x


def attention_backward(q, k, v, do, causal=False, sm_scale=None, o=None, lse=None):
    """(dq, dk, dv) of o = softmax(scale q k^T) v for the upstream gradient do, dense,
    in float64. k and v may have fewer heads than q on axis -3 (grouped-query
    attention); dk and dv are then summed over each group of query heads.

    Given o and lse (from a forward pass), P is exp(scale q k^T - lse) and D is
    rowsum(do * o), as a FlashAttention backward computes them from what it is
    handed, even when k is not the k they came from."""
    q, k, v, do = (np.asarray(a, dtype=np.float64) for a in (q, k, v, do))
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    heads = q.shape[-3] if q.ndim >= 3 else None
    ke, ve = (_expand_heads(a, heads) for a in (k, v)) if heads else (k, v)
    s = q @ np.swapaxes(ke, -1, -2) * scale
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    if lse is None:
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
    else:
        p = np.exp(s - np.asarray(lse, dtype=np.float64)[..., None])
    o = p @ ve if o is None else np.asarray(o, dtype=np.float64)
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(ve, -1, -2)
    ds = p * (dp - (do * o).sum(axis=-1, keepdims=True))
    dq = ds @ ke * scale
    dk = np.swapaxes(ds, -1, -2) @ q * scale
    if heads and k.shape[-3] != heads:
        group = heads // k.shape[-3]
        fold = lambda x: x.reshape(x.shape[:-3] + (k.shape[-3], group) + x.shape[-2:]).sum(axis=-3)  # noqa: E731
        dk, dv = fold(dk), fold(dv)
    return dq, dk, dv


def hbm_traffic_backward(n, d, block_m, block_n):
    """Elements moved by the two-pass tiled backward of one head (the chapter's IO model).
    Preprocessing: read O and dO, write D (2nd + n). dK/dV pass: each key block reads
    its K and V once and writes its dK and dV (4nd in all); each of the
    ceil(n / block_n) key blocks reads all of Q, dO, lse and D (2nd + 2n). dQ pass: each
    query block reads its Q, dO, lse and D once and writes dQ (3nd + 2n in all); each of
    the ceil(n / block_m) query blocks reads all of K and V (2nd)."""
    key_blocks, query_blocks = -(-n // block_n), -(-n // block_m)
    preprocess = 2 * n * d + n
    dkdv = 4 * n * d + key_blocks * (2 * n * d + 2 * n)
    dq = 3 * n * d + 2 * n + query_blocks * 2 * n * d
    return preprocess + dkdv + dq


# ---------------------------------------------------------------- decoding

def decode_attention(q, k_cache, v_cache, cache_lens, sm_scale=None):
    """One new query per sequence against its KV cache: q (B, H_q, D), caches
    (B, H_kv, L_max, D) of which the first cache_lens[b] positions are valid; query
    head h reads key/value head h // (H_q // H_kv). Returns (B, H_q, D)."""
    q, k_cache, v_cache = (np.asarray(a, dtype=np.float64) for a in (q, k_cache, v_cache))
    batch, heads, d = q.shape
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    group = heads // k_cache.shape[1]
    out = np.zeros((batch, heads, v_cache.shape[-1]))
    for b in range(batch):
        length = int(cache_lens[b])
        for h in range(heads):
            keys, values = k_cache[b, h // group, :length], v_cache[b, h // group, :length]
            s = keys @ q[b, h] * scale
            p = np.exp(s - s.max())
            out[b, h] = p @ values / p.sum()
    return out
