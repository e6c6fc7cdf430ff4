"""Single-sequence, unmasked attention in NumPy, as built up in Chapter 1."""
import numpy as np


def softmax_row(s):
    """Softmax of a 1-D array of scores (the max is subtracted for stability)."""
    e = np.exp(s - s.max())
    return e / e.sum()


def softmax_rows(S):
    """softmax_row applied to every row of a 2-D array."""
    return np.stack([softmax_row(row) for row in S])


def attention_weights_2d(Q, K):
    """Weights A = softmax(Q K^T / sqrt(d_k)) for one sequence, row by row."""
    return softmax_rows(Q @ K.T / np.sqrt(Q.shape[1]))


def attention_2d(Q, K, V):
    """Scaled dot-product attention output for one unmasked sequence."""
    return attention_weights_2d(Q, K) @ V
