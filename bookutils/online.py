"""The online (streaming) softmax of Chapter 4, for one row of scores.

The row is read one block at a time. All that is kept between blocks is the
running maximum m of the scores seen so far and the running sum
l = sum(exp(x_j - m)) over them; for attention, also the running, not yet
normalised, weighted sum acc = sum(exp(x_j - m) v_j). Masked scores are -inf.
Convention: before the first block, and for as long as every score seen is
-inf, the state is m = -inf, l = 0, acc = 0, and a row that ends in that state
gets all-zero weights and a zero output."""
import numpy as np


def absorb_block(m, l, block):
    """Fold one block of scores into the running (m, l).

    Returns (m_new, l_new, alpha, e): the new statistics, the factor
    alpha = exp(m - m_new) that carries anything summed against the old
    maximum over to the new one, and the block's exponentials
    e = exp(block - m_new). Both alpha and the entries of e are at most 1."""
    m_new = max(m, float(np.max(block)))
    if m_new == -np.inf:
        # Only -inf so far. exp(block - m_new) would be exp(-inf + inf) = nan;
        # the right contributions are zeros, and the state stays (-inf, 0).
        return m_new, 0.0, 1.0, np.zeros(len(block))
    alpha = np.exp(m - m_new)          # exactly 0 when m = -inf: nothing to rescale
    e = np.exp(block - m_new)          # exactly 0 for the masked scores
    return m_new, l * alpha + e.sum(), alpha, e


def streaming_stats(x, block):
    """(m, l) of the 1-D row x, read `block` scores at a time."""
    if block < 1:
        raise ValueError(f"block must be a positive integer, got {block}")
    m, l = -np.inf, 0.0
    for start in range(0, len(x), block):
        m, l, _, _ = absorb_block(m, l, x[start:start + block])
    return m, l


def streaming_softmax(x, block):
    """softmax(x) from one streaming pass for (m, l), then exp(x - m) / l.
    A row with no finite score gets all-zero weights."""
    x = np.asarray(x, dtype=float)
    m, l = streaming_stats(x, block)
    if l == 0.0:
        return np.zeros(len(x))
    return np.exp(x - m) / l


def streaming_weighted_sum(x, v, block):
    """softmax(x) @ v in a single pass over the blocks of x and the matching rows
    of v. Only one block of exponentials exists at a time; the partial output
    acc is rescaled by alpha whenever the maximum grows, and divided by l once,
    at the end. A row with no finite score gives a zero vector."""
    x = np.asarray(x, dtype=float)
    if block < 1:
        raise ValueError(f"block must be a positive integer, got {block}")
    m, l = -np.inf, 0.0
    acc = np.zeros(v.shape[1])
    for start in range(0, len(x), block):
        m, l, alpha, e = absorb_block(m, l, x[start:start + block])
        acc = alpha * acc + e @ v[start:start + block]
    return acc / l if l > 0.0 else acc


def merge_stats(first, second):
    """Combine the (m, l) summaries of two disjoint parts of one row into the
    summary of their union. The operation is associative and commutative."""
    (m_a, l_a), (m_b, l_b) = first, second
    m = max(m_a, m_b)
    if m == -np.inf:
        return m, 0.0
    return m, l_a * np.exp(m_a - m) + l_b * np.exp(m_b - m)


def streaming_trace(x, block):
    """The state after every block, for plotting: (ends, m, l, alpha), where
    ends[t] is the number of scores read after block t and alpha[t] the factor
    by which the running sum was multiplied when that block arrived."""
    x = np.asarray(x, dtype=float)
    ends, ms, ls, alphas = [], [], [], []
    m, l = -np.inf, 0.0
    for start in range(0, len(x), block):
        m, l, alpha, _ = absorb_block(m, l, x[start:start + block])
        ends.append(min(start + block, len(x)))
        ms.append(m)
        ls.append(l)
        alphas.append(alpha)
    return np.array(ends), np.array(ms), np.array(ls), np.array(alphas)
