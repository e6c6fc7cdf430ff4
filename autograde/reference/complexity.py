"""Reference implementations for Chapter 3 (Complexity)."""
import math

import numpy as np

from autograde.reference.principles import softmax


def attention_flops(n, d):
    # Q, K, V and output projections: 4 matmuls (n x d)(d x d); QK^T and AV: 2 of (n x d)(d x n) size.
    return 4 * (2 * n * d * d) + 2 * (2 * n * n * d)


def attention_activation_bytes(n, d, h, bytes_per_element):
    return bytes_per_element * (4 * n * d + h * n * n)


def max_chunk_length(budget_bytes, d, h, bytes_per_element):
    """Largest integer c with b(4cd + hc^2) <= budget, in exact integer arithmetic."""
    limit = budget_bytes // bytes_per_element  # b * (integer) <= B  <=>  integer <= B // b

    def need(c):
        return 4 * c * d + h * c * c

    c = (math.isqrt(16 * d * d + 4 * h * limit) - 4 * d) // (2 * h)
    while need(c + 1) <= limit:
        c += 1
    while c > 0 and need(c) > limit:
        c -= 1
    if c < 1:
        raise ValueError(f"not even one token fits: {bytes_per_element * need(1)} bytes needed, "
                         f"budget {budget_bytes}")
    return c


def receptive_field(num_layers, kernel_width):
    return 1 + num_layers * (kernel_width - 1)


def local_attention(q, k, v, window):
    """Each query i attends to keys j with |i - j| <= window; O(n * window) memory."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    n = len(q)
    out = np.empty((n, v.shape[1]))
    for i in range(n):
        lo, hi = max(0, i - window), min(n, i + window + 1)
        out[i] = softmax(k[lo:hi] @ q[i] / np.sqrt(q.shape[1])) @ v[lo:hi]
    return out


def elu_plus_one(x):
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def linear_attention(q, k, v):
    """phi(q_i) . sum_j phi(k_j) v_j^T / phi(q_i) . sum_j phi(k_j); O(n d^2), no n x n."""
    fq, fk = elu_plus_one(np.asarray(q, dtype=np.float64)), elu_plus_one(np.asarray(k, dtype=np.float64))
    kv = fk.T @ np.asarray(v, dtype=np.float64)  # (d_k, d_v)
    return (fq @ kv) / (fq @ fk.sum(axis=0))[:, None]
