"""Reference implementations for Chapter 3 (Complexity)."""
import numpy as np

from autograde.reference.principles import softmax


def training_flops(n, d_model, heads, d_head):
    """Forward plus backward FLOPs of one multi-head self-attention layer.

    Forward: Q, K, V and the output projection are (n x d_model)(d_model x h d_head)
    products (the output one transposed), 2 n d_model h d_head FLOPs each; per head,
    QK^T and AV cost 2 n n d_head each. Backward: the gradient of a product with
    respect to each of its two inputs is one more product of the same cost, so
    the backward pass costs twice the forward pass."""
    inner = heads * d_head
    forward = 4 * (2 * n * d_model * inner) + heads * 2 * (2 * n * n * d_head)
    return 3 * forward


def chunk_bytes(c, heads, groups, d_head, bytes_per_element, score_bytes):
    """Q and the output for `heads` heads, K and V for `groups` heads, and one
    c x c score matrix per query head, held in `score_bytes` per entry."""
    return bytes_per_element * c * d_head * (2 * heads + 2 * groups) + score_bytes * heads * c * c


def call_bound(answer):
    """The most calls to cost that longest_fitting may make for this answer (0:
    nothing fits): a doubling search up to the first n that does not fit, then
    a bisection, makes 2 * answer.bit_length() at most; the rest is room for a
    separate first call and a final check of the answer."""
    return 2 * answer.bit_length() + 6


def longest_fitting(cost, budget):
    """Largest n >= 1 with cost(n) <= budget, for any non-decreasing cost on the
    positive integers: double n until it no longer fits, then bisect between the
    last n that fits and the first that does not. Integers throughout, so
    answers of any size are exact."""
    first = cost(1)
    if first > budget:
        raise ValueError(f"cost(1) = {first} is over the budget of {budget}: not even one token fits")
    fits, over = 1, 2
    while cost(over) <= budget:
        fits, over = over, 2 * over
    while over - fits > 1:  # cost(fits) <= budget < cost(over)
        middle = (fits + over) // 2
        if cost(middle) <= budget:
            fits = middle
        else:
            over = middle
    return fits


def receptive_field(kernel_widths, dilations, strides=None):
    """Layer l of width w_l and dilation delta_l widens the view by (w_l - 1) delta_l of its
    own input's positions, each the product of the strides below it apart in the input."""
    seen, spacing = 1, 1
    strides = [1] * len(kernel_widths) if strides is None else strides
    for w, step, stride in zip(kernel_widths, dilations, strides):
        seen += (w - 1) * step * spacing
        spacing *= stride
    return seen


def dilated_local_attention(q, k, v, radius, dilation, n_global=0):
    """Query i attends to keys i + m * dilation, |m| <= radius, inside the sequence, and to
    the first n_global (global) keys; a global query attends to every key."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    n = len(q)
    g = min(n_global, n)
    out = np.empty((n, v.shape[1]))
    for i in range(n):
        if i < g:
            js = np.arange(n)
        else:
            first = i - min(radius, i // dilation) * dilation
            stop = min(n, i + radius * dilation + 1)
            js = np.union1d(np.arange(g), np.arange(first, stop, dilation))
        out[i] = softmax(k[js] @ q[i] / np.sqrt(q.shape[1])) @ v[js]
    return out


def elu_plus_one(x):
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def causal_linear_attention(q, k, v, chunk):
    """o_t = phi(q_t) Gamma_t / phi(q_t) z_t (rows) with Gamma_t, z_t summed over j <= t,
    computed chunk by chunk: a masked chunk x chunk block inside each chunk, the
    running state (Gamma, z) for everything before it. Leading axes are batch axes."""
    fq, fk = elu_plus_one(np.asarray(q, dtype=np.float64)), elu_plus_one(np.asarray(k, dtype=np.float64))
    v = np.asarray(v, dtype=np.float64)
    n = q.shape[-2]
    state = np.zeros(fk.shape[:-2] + (fk.shape[-1], v.shape[-1]))
    total = np.zeros(fk.shape[:-2] + (fk.shape[-1],))
    out = np.empty(v.shape)
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        block = np.tril(fq[..., s:e, :] @ np.swapaxes(fk[..., s:e, :], -1, -2))
        numer = fq[..., s:e, :] @ state + block @ v[..., s:e, :]
        denom = np.einsum("...cd,...d->...c", fq[..., s:e, :], total) + block.sum(axis=-1)
        out[..., s:e, :] = numer / denom[..., None]
        state = state + np.swapaxes(fk[..., s:e, :], -1, -2) @ v[..., s:e, :]
        total = total + fk[..., s:e, :].sum(axis=-2)
    return out
