"""Reference implementations for Chapter 2 (Variants)."""
import numpy as np

from autograde.reference.principles import scaled_dot_product_attention, softmax


def sinusoidal_positional_encoding(n_positions, d_model):
    if d_model % 2:
        raise ValueError(f"d_model must be even, got {d_model}")
    # Column pairs (2i, 2i+1) share one angle; stack sin and cos, then interleave.
    angle = np.outer(np.arange(n_positions), 10000.0 ** (-np.arange(0, d_model, 2) / d_model))
    return np.stack([np.sin(angle), np.cos(angle)], axis=-1).reshape(n_positions, d_model)


def causal_mask(n):
    rows, cols = np.indices((n, n))
    return cols <= rows


def cross_attention(x_dec, memory, w_q, w_k, w_v):
    out, _ = scaled_dot_product_attention(x_dec @ w_q, memory @ w_k, memory @ w_v)
    return out


def decode_step(x_t, cache_k, cache_v, w_q, w_k, w_v):
    """One token: append its key and value, attend over the whole cache."""
    x_t = np.asarray(x_t, dtype=np.float64)
    cache_k = np.concatenate([cache_k, (x_t @ w_k)[None]], axis=0)
    cache_v = np.concatenate([cache_v, (x_t @ w_v)[None]], axis=0)
    out, _ = scaled_dot_product_attention((x_t @ w_q)[None], cache_k, cache_v)
    return out[0], cache_k, cache_v


def causal_self_attention(x, w_q, w_k, w_v):
    """What decoding with a KV cache must reproduce, computed all at once."""
    out, _ = scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v, causal_mask(len(x)))
    return out


def attention_entropy(weights):
    p = np.asarray(weights, dtype=np.float64)
    logs = np.log(np.where(p > 0, p, 1.0))  # 0 log 0 = 0
    return -np.sum(p * logs, axis=-1)


def additive_attention(q, k, v, w_q, w_k, w_score):
    hidden = np.tanh((q @ w_q)[..., :, None, :] + (k @ w_k)[..., None, :, :])
    weights = softmax(hidden @ w_score, axis=-1)
    return weights @ v, weights
