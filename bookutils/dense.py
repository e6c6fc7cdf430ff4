"""Vectorised single-sequence attention in NumPy, as used in Chapter 3."""
import numpy as np


def dense_attention(Q, K, V):
    """Scaled dot-product attention of one sequence, all queries at once.

    Builds the whole (n_q, n_k) score matrix and turns it into weights in
    place, so the largest array alive is that one matrix (plus the output)."""
    W = Q @ K.T
    W *= 1.0 / np.sqrt(Q.shape[1])
    W -= W.max(axis=1, keepdims=True)    # stable softmax, row by row
    np.exp(W, out=W)
    W /= W.sum(axis=1, keepdims=True)
    return W @ V
