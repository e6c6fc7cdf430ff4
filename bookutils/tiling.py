"""Tiled attention of Chapter 4 in NumPy: the loop structure of FlashAttention's
forward pass, one (query block, key block) tile at a time."""
import numpy as np


def blockwise_attention(q, k, v, block_q, block_k, causal=False, visit=None):
    """softmax(q k^T / sqrt(d)) v for one sequence, computed tile by tile.

    Outer loop: block_q queries at a time. Inner loop: block_k keys and values
    at a time, folded into each query's running maximum m, running sum l and
    unnormalised output acc by the online softmax. No score array larger than
    block_q x block_k ever exists. With causal=True, query i sees key j only
    when j <= i; a tile whose first key comes after its last query is entirely
    masked and is skipped. If given, visit(qb, kb) is called with the block
    indices of every tile that is computed, in the order they are computed."""
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be positive, got {block_q} and {block_k}")
    n_queries, n_keys = q.shape[0], k.shape[0]
    scale = 1.0 / np.sqrt(q.shape[1])
    out = np.empty((n_queries, v.shape[1]))

    for qb, top in enumerate(range(0, n_queries, block_q)):
        bottom = min(top + block_q, n_queries)           # query rows top .. bottom-1
        q_blk = q[top:bottom] * scale
        m = np.full(bottom - top, -np.inf)
        l = np.zeros(bottom - top)
        acc = np.zeros((bottom - top, v.shape[1]))

        for kb, left in enumerate(range(0, n_keys, block_k)):
            if causal and left >= bottom:
                break                                    # this tile and those right of it: all j > i
            right = min(left + block_k, n_keys)          # key columns left .. right-1
            if visit is not None:
                visit(qb, kb)
            s = q_blk @ k[left:right].T
            if causal and right - 1 > top:               # the tile reaches above the diagonal
                above = np.arange(left, right)[None, :] > np.arange(top, bottom)[:, None]
                s[above] = -np.inf

            m_next = np.maximum(m, s.max(axis=1))
            # Subtract 0 instead of m_next in rows that have seen only -inf, so that
            # their exponentials are exp(-inf) = 0 rather than exp(-inf + inf) = nan.
            shift = np.where(m_next == -np.inf, 0.0, m_next)
            alpha = np.exp(m - shift)                    # rescales what was summed so far
            e = np.exp(s - shift[:, None])
            l = alpha * l + e.sum(axis=1)
            acc = alpha[:, None] * acc + e @ v[left:right]
            m = m_next

        seen = l > 0                                     # rows with no visible key keep 0
        acc[seen] /= l[seen, None]
        out[top:bottom] = acc
    return out
