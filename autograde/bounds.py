"""Error bounds for Triton kernels compared with a float64 reference.

A tolerance that fits one machine's rounding fails another's: the hidden tests of
Chapter 4 accept an answer when every element lies within the first-order
rounding-error bound of the computation the exercise describes, evaluated
element by element on the very inputs of the test (the standard bound for a sum
of m products, |fl(a . b) - a . b| <= gamma_m sum |a_k b_k|, carried through
each step). The bound grows with the size of the scores, as the error of P
recomputed from a float32 log-sum-exp does: exp(s - lse) is off by about
|s| * 2^-24 relative, 3e-5 for scores near 500, whatever the code.

Units (relative rounding errors):
- float32 arithmetic and accumulation, as the exercise asks: U = 2^-24;
- the operands of tl.dot: on a GPU, float32 operands are cut to TF32 (10 bits
  of mantissa, truncated rather than rounded: 2^-10; book/flash/triton_basics.md)
  unless the kernel asks for IEEE float32, and P and dS are cast to the inputs'
  16-bit type; in the interpreter, float32 products are float32;
- each result is stored in the output type (2^-24, 2^-11, 2^-8).

tests/test_checks.py shows that the instructor's solution and every correct
style of tests/submissions stay within a quarter of these bounds on every draw
(autograde.compare.record_margins)."""
import math

import numpy as np

U = 2.0 ** -24
TINY = 2.0 ** -126            # float32's smallest normal number: exp(x) below it may flush to 0
# (relative unit, absolute spacing at the bottom of the range) of each storage type:
# below its smallest normal number a type keeps a fixed absolute spacing (float16: 2^-24).
STORAGE = {"float32": (2.0 ** -24, 2.0 ** -150), "float16": (2.0 ** -11, 2.0 ** -25),
           "bfloat16": (2.0 ** -8, 2.0 ** -134)}
TF32 = (2.0 ** -10, 2.0 ** -150)     # truncated to 10 mantissa bits


def units(dtype, native):
    """(storage of the inputs and outputs, rounding of a tl.dot operand), each as
    (relative unit, absolute spacing of the smallest numbers)."""
    name = str(dtype).removeprefix("torch.")
    storage = STORAGE[name]
    if name == "float32":
        return storage, (TF32 if native else (0.0, 0.0))
    return storage, storage


def _dot(m, operand):
    """gamma for a dot product of m terms: each product and each addition in float32,
    both operands rounded by the relative unit `operand`."""
    return (m + 1) * U + 2 * operand


def _scores(q, k, scale, causal):
    """Exact scores and the sums of |q_c k_c| behind them, (..., n_q, n_k), masked entries -inf and 0."""
    s = q @ np.swapaxes(k, -1, -2) * scale
    a = np.abs(q) @ np.swapaxes(np.abs(k), -1, -2) * abs(scale)
    if causal:
        keep = np.tril(np.ones(s.shape[-2:], dtype=bool))
        s, a = np.where(keep, s, -np.inf), np.where(keep, a, 0.0)
    return s, a


def _expand(x, heads):
    return np.repeat(x, heads // x.shape[-3], axis=-3) if x.shape[-3] != heads else x


def _fold(x, kv_heads):
    """Sum (..., H, n, d) over each group of H / kv_heads query heads."""
    heads = x.shape[-3]
    if heads == kv_heads:
        return x
    return x.reshape(x.shape[:-3] + (kv_heads, heads // kv_heads) + x.shape[-2:]).sum(axis=-3)


def backward_bounds(q, k, v, do, o, lse, causal, sm_scale, dtype, native):
    """Element-wise bounds on |found - exact| for (dq, dk, dv) of a backward pass that is
    handed q, k, v, do and o in `dtype` (here their float64 values) and lse in float32,
    and computes, in float32: S = scale q k^T, P = exp(S - lse), dV = P^T dO,
    dP = dO V^T, D = rowsum(dO * O), dS = P * (dP - D), dQ = scale dS K, dK = scale dS^T Q.
    o and lse are the values handed to the kernels (exact, or those of a replay)."""
    q, k, v, do, o, lse = (np.asarray(a, dtype=np.float64) for a in (q, k, v, do, o, lse))
    (storage, storage_abs), (operand, operand_abs) = units(dtype, native)
    heads, kv_heads, n_q, d = q.shape[-3], k.shape[-3], q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    ke, ve = _expand(k, heads), _expand(v, heads)
    s, a = _scores(q, ke, scale, causal)
    lse = lse[..., None]
    x = s - lse
    p = np.exp(x)                                             # 0 where masked
    kept = np.isfinite(x)
    x = np.where(kept, x, 0.0)
    # P: the product q . k and its scaling, lse stored in float32, the subtraction, exp (a few
    # units, and the rounding of its argument), its underflow below TINY, and the cast of P
    # for the products.
    eps = _dot(d, operand) * a + U * np.abs(np.where(kept, s, 0.0)) + U * np.abs(lse) + 2 * U * np.abs(x) + 4 * U
    p_err = np.where(kept, p * (eps + operand) + TINY + operand_abs, 0.0)
    n_sum = n_q * (heads // kv_heads)                         # terms of a dK or dV entry, over the group
    pt = np.swapaxes(p, -1, -2)
    dv = np.swapaxes(p_err, -1, -2) @ np.abs(do) + _dot(n_sum, operand) * (pt @ np.abs(do)) + n_sum * TINY
    dp = do @ np.swapaxes(ve, -1, -2)
    dp_err = _dot(d, operand) * (np.abs(do) @ np.swapaxes(np.abs(ve), -1, -2)) + d * TINY
    delta = (do * o).sum(axis=-1, keepdims=True)
    delta_err = (_dot(d, 0.0) + storage) * (np.abs(do) * np.abs(o)).sum(axis=-1, keepdims=True) + d * TINY
    ds = p * (dp - delta)
    ds_err = np.where(kept, p_err * (1 + U) * np.abs(dp - delta) + p * (dp_err + delta_err) + (U + operand) * np.abs(ds)
                      + TINY + operand_abs, 0.0)
    dq = np.abs(scale) * (ds_err @ np.abs(ke) + _dot(ke.shape[-2], operand) * (np.abs(ds) @ np.abs(ke))
                          + ke.shape[-2] * TINY)
    dk = np.abs(scale) * (np.swapaxes(ds_err, -1, -2) @ np.abs(q)
                          + _dot(n_sum, operand) * (np.swapaxes(np.abs(ds), -1, -2) @ np.abs(q)) + n_sum * TINY)
    exact = (ds @ ke * scale, _fold(np.swapaxes(ds, -1, -2) @ q * scale, kv_heads), _fold(pt @ do, kv_heads))
    # Stored in the output type, dQ and dK after a last multiplication by the scale.
    return tuple(err + (U + storage) * np.abs(value) + storage_abs
                 for err, value in zip((dq, _fold(dk, kv_heads), _fold(dv, kv_heads)), exact))


def forward_bounds(q, k, v, causal, sm_scale, dtype, native):
    """Element-wise bounds on |found - exact| for attention's output and log-sum-exp, as a
    forward kernel computes them in float32: per query, o = sum_j p_j v_j / sum_j p_j with
    p_j = exp(s_j - m), over blocks of keys with running maxima, and lse = m + ln sum_j p_j.
    A rescaling exp(m_old - m_new) multiplies a row's sum and its output alike and cancels in
    their ratio; an exp whose argument is a merge of partial maxima does not, and the
    arguments of p_j's exps add up to |s_j - m|. A relative error eps_j of p_j moves the output
    by sum_j P_j eps_j (v_j - o) and the log-sum-exp by sum_j P_j eps_j; the sums add their own
    rounding, and the output is stored in `dtype`. q (..., n_q, d), k and v (..., n_k, d)."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    (storage, storage_abs), (operand, operand_abs) = units(dtype, native)
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    s, a = _scores(q, k, scale, causal)
    m = s.max(axis=-1, keepdims=True)
    kept = np.isfinite(s)
    x = np.where(kept, s - m, 0.0)
    p = np.where(kept, np.exp(x), 0.0)
    total = p.sum(axis=-1, keepdims=True)
    weights = p / total
    out = weights @ v
    keys = kept.sum(axis=-1, keepdims=True)
    eps = np.where(kept, _dot(d, operand) * a + U * np.abs(np.where(kept, s, 0.0)) + 4 * U * np.abs(x) + 16 * U
                   + operand, 0.0)
    moved = weights * eps
    # exp's underflow and the operand's smallest spacing, relative to the sum of weights (>= 1)
    floor = (TINY + operand_abs) * keys / total
    out_bound = moved @ np.abs(v) + moved.sum(axis=-1, keepdims=True) * np.abs(out) \
        + floor * np.abs(v).max(axis=-2, keepdims=True) \
        + (_dot(keys, operand) + (keys + 8) * U) * (weights @ np.abs(v)) + (U + storage) * np.abs(out) + storage_abs
    lse = m + np.log(total)
    lse_bound = moved.sum(axis=-1, keepdims=True) + (keys + 8) * U + 2 * U * np.abs(lse) + floor
    return out_bound, lse_bound[..., 0]


def decode_bounds(q, k_cache, v_cache, cache_lens, sm_scale, dtype, native):
    """forward_bounds of one decoding step: q (B, H_q, D) against the first cache_lens[b]
    positions of caches (B, H_kv, L_max, D), query head h on key/value head h // (H_q / H_kv)."""
    q, k_cache, v_cache = (np.asarray(a, dtype=np.float64) for a in (q, k_cache, v_cache))
    heads = q.shape[1]
    bound = np.zeros(q.shape[:2] + v_cache.shape[-1:])
    for b, n in enumerate(int(n) for n in cache_lens):
        keys, values = (_expand(c[b, :, :n], heads) for c in (k_cache, v_cache))
        bound[b] = forward_bounds(q[b][:, None], keys, values, False, sm_scale, dtype, native)[0][:, 0]
    return bound
