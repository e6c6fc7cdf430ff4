"""Split-K decoding in NumPy (Chapter 4): one query row against a long cache,
cut into chunks that are processed independently and then merged.

A chunk's softmax state is (m, l, o): its largest score m, the sum
l = sum(exp(s_j - m)) over its keys, and its own normalised output
o = sum(exp(s_j - m) v_j) / l. A chunk with no visible key is (-inf, 0, 0)."""
import numpy as np


def chunk_state(scores, values):
    """(m, l, o) of one chunk of a row: scores (c,), values (c, d_v)."""
    if len(scores) == 0 or np.max(scores) == -np.inf:
        return -np.inf, 0.0, np.zeros(values.shape[1])
    m = float(np.max(scores))
    e = np.exp(scores - m)
    return m, float(e.sum()), e @ values / e.sum()


def merge_two(first, second):
    """The state of the union of two disjoint chunks of one row. Each output is
    weighted by its share of the total sum, measured against the larger maximum."""
    (m1, l1, o1), (m2, l2, o2) = first, second
    if m2 == -np.inf:
        return first
    if m1 == -np.inf:
        return second
    m = max(m1, m2)
    w1, w2 = l1 * np.exp(m1 - m), l2 * np.exp(m2 - m)
    return m, w1 + w2, (w1 * o1 + w2 * o2) / (w1 + w2)


def split_k_row(q, k, v, chunk, scale=None):
    """softmax(scale q k^T) v for one query row q (d,), from per-chunk states of
    `chunk` keys each, folded left to right with merge_two."""
    scale = 1.0 / np.sqrt(q.shape[0]) if scale is None else scale
    state = (-np.inf, 0.0, np.zeros(v.shape[1]))
    for start in range(0, k.shape[0], chunk):
        part = chunk_state(k[start:start + chunk] @ q * scale, v[start:start + chunk])
        state = merge_two(state, part)
    return state[2]
