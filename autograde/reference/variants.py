"""Reference implementations for Chapter 2 (Variants)."""
import numpy as np

from autograde.reference.principles import softmax


def rotary_half_split(x, positions, rotary_dim=None, base=10000.0):
    """RoPE pairing coordinate i with i + r/2 over the first r = rotary_dim coordinates (the
    rest pass through); positions broadcast against x.shape[:-1]."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    r = d if rotary_dim is None else int(rotary_dim)
    if r % 2 or r > d:
        raise ValueError(f"rotary embeddings need an even rotary_dim no larger than the width {d}, got {r}")
    half = r // 2
    angle = np.asarray(positions, dtype=np.float64)[..., None] * base ** (-2.0 * np.arange(half) / r)
    cos, sin = np.cos(angle), np.sin(angle)
    first, second = x[..., :half], x[..., half:r]
    return np.concatenate([first * cos - second * sin, first * sin + second * cos, x[..., r:]], axis=-1)


def rotary_left_padded(x, lengths, rotary_dim=None):
    """Exercise 1: x of shape (batch, heads, n, d) padded on the left; sequence b's real
    tokens are its last lengths[b] rows, at positions 0, 1, ...; padding rows are left alone."""
    n = np.shape(x)[-2]
    positions = np.arange(n)[None, :] - (n - np.asarray(lengths))[:, None]     # (batch, n)
    return rotary_half_split(x, np.maximum(positions, 0)[:, None, :], rotary_dim)


def causal_mask(n):
    rows, cols = np.indices((n, n))
    return cols <= rows


def left_padded_keep(lengths, n):
    """(batch, n, n): key j is a real token (j >= n - length) and not in the future."""
    real = np.arange(n)[None, :] >= n - np.asarray(lengths)[:, None]
    return causal_mask(n)[None] & real[:, None, :]


def masked_softmax_or_zero(scores, keep):
    """Softmax over the kept entries of each row; a row with none kept is all zeros."""
    kept_max = np.max(np.where(keep, scores, -np.inf), axis=-1, keepdims=True)
    shifted = np.where(keep, scores - np.where(np.isfinite(kept_max), kept_max, 0.0), -np.inf)
    e = np.exp(shifted)
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def left_padded_causal_attention(q, k, v, lengths):
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    return masked_softmax_or_zero(scores, left_padded_keep(lengths, q.shape[-2])) @ v


def gqa_shapes(w_q, w_k, n_heads):
    d_head = w_q.shape[1] // n_heads
    return d_head, w_k.shape[1] // d_head


def decode_step(x_t, cache_k, cache_v, w_q, w_k, w_v, n_heads):
    """Grouped-query decoding step; caches are (n_kv_heads, t, d_head)."""
    x_t = np.asarray(x_t, dtype=np.float64)
    d_head, n_kv = gqa_shapes(w_q, w_k, n_heads)
    cache_k = np.concatenate([cache_k, (x_t @ w_k).reshape(n_kv, 1, d_head)], axis=1)
    cache_v = np.concatenate([cache_v, (x_t @ w_v).reshape(n_kv, 1, d_head)], axis=1)
    group = np.arange(n_heads) // (n_heads // n_kv)          # query head h reads KV head h // group size
    q = (x_t @ w_q).reshape(n_heads, 1, d_head)
    weights = softmax(q @ np.swapaxes(cache_k[group], -1, -2) / np.sqrt(d_head))
    return (weights @ cache_v[group]).reshape(n_heads * d_head), cache_k, cache_v


def causal_gqa_attention(x, w_q, w_k, w_v, n_heads):
    """What grouped-query decoding must reproduce, computed all at once."""
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    d_head, n_kv = gqa_shapes(w_q, w_k, n_heads)
    q = (x @ w_q).reshape(n, n_heads, d_head).transpose(1, 0, 2)
    k, v = ((x @ w).reshape(n, n_kv, d_head).transpose(1, 0, 2) for w in (w_k, w_v))
    k, v = (np.repeat(t, n_heads // n_kv, axis=0) for t in (k, v))
    scores = np.where(causal_mask(n), q @ np.swapaxes(k, -1, -2) / np.sqrt(d_head), -np.inf)
    return (softmax(scores) @ v).transpose(1, 0, 2).reshape(n, n_heads * d_head)


def entropy_temperature_slope(scores, tau):
    """dH/dtau for p = softmax(scores / tau): the variance of the scores under p, over tau^3."""
    s = np.asarray(scores, dtype=np.float64)
    keep = np.isfinite(s)
    p = masked_softmax_or_zero(s / tau, keep)
    s = np.where(keep, s, 0.0)
    mean = np.sum(p * s, axis=-1, keepdims=True)
    return np.sum(p * (s - mean) ** 2, axis=-1) / tau ** 3


def additive_attention_grads(q, k, v, u_q, u_k, w_score, d_out, key_mask=None):
    """Gradients of L = sum(d_out * output) with respect to q and w_score, for additive attention
    with scores w_score . tanh(q_i U_q + k_j U_k) and a softmax over the real keys (key_mask
    (..., n_k), True for a real key); a query with no real key has output 0 and gradient 0.
    Returns (dq of q's shape, dw_score of shape (d_a,), summed over every batch axis)."""
    q, k, v, u_q, u_k, w_score, d_out = (np.asarray(a, dtype=np.float64) for a in (q, k, v, u_q, u_k, w_score, d_out))
    hidden = np.tanh((q @ u_q)[..., :, None, :] + (k @ u_k)[..., None, :, :])      # (..., n_q, n_k, d_a)
    scores = hidden @ w_score
    keep = np.ones(scores.shape, dtype=bool) if key_mask is None else \
        np.broadcast_to(np.asarray(key_mask, dtype=bool)[..., None, :], scores.shape)
    p = masked_softmax_or_zero(scores, keep)
    d_p = d_out @ np.swapaxes(v, -1, -2)                                           # dL/dp
    d_s = p * (d_p - np.sum(p * d_p, axis=-1, keepdims=True))                     # dL/dscores
    dw_score = np.einsum("...ij,...ija->...a", d_s, hidden).reshape(-1, hidden.shape[-1]).sum(axis=0)
    d_pre = d_s[..., None] * w_score * (1.0 - hidden ** 2)                         # before the tanh
    return d_pre.sum(axis=-2) @ u_q.T, dw_score
