"""Masked single-sequence attention in NumPy, as built up in Chapter 2."""
import numpy as np

from bookutils.attention import softmax_rows


def causal_keep(n):
    """Boolean (n, n) array, True where query i may look at key j (j <= i)."""
    return np.tri(n, dtype=bool)


def masked_attention_2d(Q, K, V, keep):
    """Scaled dot-product attention of one sequence in which only the (query, key)
    pairs marked True in `keep` take part; `keep` broadcasts against the scores.
    Returns the output and the weights."""
    S = Q @ K.T / np.sqrt(Q.shape[1])
    A = softmax_rows(np.where(keep, S, -np.inf))
    return A @ V, A
