"""The backward pass of attention for one head, in NumPy (Chapter 4).

Dense gradients from the stored probabilities P, and the first (dK, dV) pass
of FlashAttention's two-pass tiled backward: P is recomputed one tile at a time
from the queries, the keys and the log-sum-exp that the forward pass stored, so
no N x N array ever exists. Single head, no mask: the page on the backward pass
shows these."""
import math

import numpy as np


def forward_with_lse(q, k, v):
    """(O, lse) of softmax(q k^T / sqrt(d)) v for one head: the two things the
    forward kernel stores for the backward pass. Dense, for reference."""
    s = q @ k.T / math.sqrt(q.shape[1])
    top = s.max(axis=1, keepdims=True)
    e = np.exp(s - top)
    total = e.sum(axis=1, keepdims=True)
    return (e / total) @ v, (top + np.log(total))[:, 0]


def dense_backward(q, k, v, do):
    """(dQ, dK, dV) with the whole N x N matrices P, dP and dS in memory."""
    scale = 1.0 / math.sqrt(q.shape[1])
    s = q @ k.T * scale
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    dp = do @ v.T
    d_row = (p * dp).sum(axis=1, keepdims=True)        # equals rowsum(dO * O)
    ds = p * (dp - d_row)
    return scale * ds @ k, scale * ds.T @ q, p.T @ do


def tiled_dkdv(q, k, v, o, do, lse, block_q, block_k):
    """(dK, dV) from the forward's O and lse, one block_q x block_k tile of P at a time:
    the first pass of the two-pass backward. One key block at a time (a program
    of the dK, dV kernel) keeps its dK and dV while every query block streams
    past. Each tile of P is recomputed from lse, exactly normalised, with no
    running maximum. (The dQ pass runs the loops the other way round.)"""
    n_q, n_k = q.shape[0], k.shape[0]
    scale = 1.0 / math.sqrt(q.shape[1])
    delta = np.sum(do * o, axis=1)                     # D_i = sum_j P_ij dP_ij
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    for left in range(0, n_k, block_k):
        right = min(left + block_k, n_k)
        for top in range(0, n_q, block_q):
            bottom = min(top + block_q, n_q)
            p = np.exp(q[top:bottom] @ k[left:right].T * scale - lse[top:bottom, None])
            dp = do[top:bottom] @ v[left:right].T
            ds = p * (dp - delta[top:bottom, None])
            dv[left:right] += p.T @ do[top:bottom]
            dk[left:right] += scale * ds.T @ q[top:bottom]
    return dk, dv


def backward_flops(n, d, recompute=True):
    """FLOPs of the backward pass of one head (2 per multiply-add): the products
    dV = P^T dO, dP = dO V^T, dQ = dS K and dK = dS^T Q, each 2 n^2 d, plus
    S = Q K^T again when P is recomputed rather than stored."""
    products = 5 if recompute else 4
    return products * 2 * n * n * d


def forward_flops(n, d):
    """FLOPs of the forward pass of one head: S = Q K^T and O = P V."""
    return 2 * 2 * n * n * d
