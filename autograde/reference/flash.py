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
