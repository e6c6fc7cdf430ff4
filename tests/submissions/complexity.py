"""Planted submissions for ch3_complexity.

Each case replaces some solution cells (keyed by grade_id) of an otherwise
correct submission. `loses` names the test cells that must score 0; every other
autograded cell must get full points."""

from tests.submissions.independent import CELLS as INDEPENDENT

ASSIGNMENT = "ch3_complexity"
NOTEBOOK = "complexity.ipynb"

# --- training FLOPs ----------------------------------------------------------------

TRAINING_FORWARD_ONLY = '''
def training_flops(n, d_model, heads, d_head):
    width = heads * d_head
    return 8 * n * d_model * width + 4 * heads * n * n * d_head  # Bug: the backward pass is missing
'''

TRAINING_BACKWARD_AS_FORWARD = '''
def training_flops(n, d_model, heads, d_head):
    forward = 8 * n * d_model * heads * d_head + 4 * heads * n * n * d_head
    return 2 * forward  # Bug: one gradient per product, not two
'''

TRAINING_HEADS_SPLIT_THE_WIDTH = '''
def training_flops(n, d_model, heads, d_head):
    # Bug: the chapter's count, 8nd^2 + 4n^2d, which assumes heads * d_head == d_model
    return 3 * (8 * n * d_model * d_model + 4 * n * n * d_model)
'''

TRAINING_FLOAT = '''
def training_flops(n, d_model, heads, d_head):
    return 3.0 * (8 * n * d_model * heads * d_head + 4 * heads * n**2 * d_head)  # Bug: a float
'''

TRAINING_FLOAT_ROUND_TRIP = '''
def training_flops(n, d_model, heads, d_head):
    forward = 8 * n * d_model * heads * d_head + 4 * heads * n * n * d_head
    return forward + int(2.0 * forward)  # Bug: exact only while 2 * forward fits in 53 bits
'''

# Right wherever the meta tensors can be built; the h x n x n scores of n = 10^9
# overflow PyTorch's size computation, so only the hidden cell is lost.
TRAINING_COUNTED_ON_META = '''
from torch.utils.flop_counter import FlopCounterMode

def training_flops(n, d_model, heads, d_head):
    meta = dict(device="meta", requires_grad=True)
    x = torch.empty(n, d_model, **meta)
    w_q, w_k, w_v = (torch.empty(d_model, heads * d_head, **meta) for _ in range(3))
    w_o = torch.empty(heads * d_head, d_model, **meta)
    with FlopCounterMode(display=False) as counter:
        q, k, v = ((x @ w).view(n, heads, d_head).transpose(0, 1) for w in (w_q, w_k, w_v))
        out = (torch.softmax(q @ k.transpose(1, 2), dim=-1) @ v).transpose(0, 1).reshape(n, -1) @ w_o
        out.sum().backward()
    return counter.get_total_flops()
'''

# Right everywhere, but counted by PyTorch on meta tensors where they fit (the chapter
# asks for a formula): only the hidden cell's PyTorch probe tells.
TRAINING_TORCH_SMALL = '''
from torch.utils.flop_counter import FlopCounterMode

def training_flops(n, d_model, heads, d_head):
    if n * d_model * heads * d_head > 10**7:
        return 3 * (8 * n * d_model * heads * d_head + 4 * heads * n * n * d_head)
    meta = dict(device="meta", requires_grad=True)
    x = torch.empty(n, d_model, **meta)
    w_q, w_k, w_v = (torch.empty(d_model, heads * d_head, **meta) for _ in range(3))
    w_o = torch.empty(heads * d_head, d_model, **meta)
    with FlopCounterMode(display=False) as counter:
        q, k, v = ((x @ w).view(n, heads, d_head).transpose(0, 1) for w in (w_q, w_k, w_v))
        out = (torch.softmax(q @ k.transpose(1, 2), dim=-1) @ v).transpose(0, 1).reshape(n, -1) @ w_o
        out.sum().backward()
    return int(counter.get_total_flops())
'''

# --- longest fitting chunk -------------------------------------------------------------

FITTING_FLOAT_MIDPOINT = '''
def longest_fitting(cost, budget):
    if cost(1) > budget:
        raise ValueError(f"budget {budget} is below one token")
    lo, hi = 1, 2
    while cost(hi) <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = int((lo + hi) / 2)  # Bug: a float midpoint, rounded once lo + hi passes 2^53
        if cost(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return lo
'''

FITTING_FIRST_THAT_DOES_NOT_FIT = '''
def longest_fitting(cost, budget):
    if cost(1) > budget:
        raise ValueError(f"budget {budget} is below one token")
    lo, hi = 1, 2
    while cost(hi) <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if cost(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return hi  # Bug: the first n that does not fit
'''

FITTING_LINEAR_SCAN = '''
def longest_fitting(cost, budget):
    if cost(1) > budget:
        raise ValueError(f"budget {budget} is below one token")
    n = 1
    while cost(n + 1) <= budget:  # Bug: one call per token, n calls in all
        n += 1
    return n
'''

# The chapter's closed form, its coefficients read off cost(1), cost(2) and cost(3):
# right for quadratic models only.
FITTING_QUADRATIC_ONLY = '''
def longest_fitting(cost, budget):
    c1, c2, c3 = cost(1), cost(2), cost(3)
    if c1 > budget:
        raise ValueError(f"budget {budget} is below one token")
    a = (c3 - 2 * c2 + c1) // 2
    b = c2 - c1 - 3 * a
    c = c1 - a - b
    return (math.isqrt(b * b - 4 * a * (c - budget)) - b) // (2 * a)  # Bug: assumes cost is a quadratic
'''

FITTING_ZERO_INSTEAD_OF_ERROR = '''
def longest_fitting(cost, budget):
    lo, hi = 0, 1
    while cost(hi) <= budget:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cost(mid) <= budget else (lo, mid)
    return lo  # Bug: 0 when nothing fits, no ValueError
'''

FITTING_STARTS_AT_ZERO = '''
def longest_fitting(cost, budget):
    hi = 0
    while cost(hi) <= budget:  # Bug: asks for cost(0), which is not defined
        hi = 2 * hi + 1
    lo = (hi - 1) // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cost(mid) <= budget else (lo, mid)
    if lo == 0:
        raise ValueError(f"budget {budget} is below one token")
    return lo
'''

FITTING_BUDGET_AS_BOUND = '''
def longest_fitting(cost, budget):
    if cost(1) > budget:
        raise ValueError(f"budget {budget} is below one token")
    lo, hi = 1, budget + 1  # Bug: assumes cost(n) >= n, so that no answer exceeds the budget
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cost(mid) <= budget else (lo, mid)
    return lo
'''

# Right in few calls, but bisect's indexes are C integers: answers past 2^63 overflow.
FITTING_BISECT_MODULE = '''
import bisect

def longest_fitting(cost, budget):
    if cost(1) > budget:
        raise ValueError(f"budget {budget} is below one token")
    hi = 2
    while cost(hi) <= budget:
        hi *= 2
    return bisect.bisect_right(range(1, hi), budget, key=cost)
'''

# --- receptive field ---------------------------------------------------------------

RECEPTIVE_PRODUCT_OF_WIDTHS = '''
def receptive_field(kernel_widths, dilations, strides):
    return math.prod(kernel_widths)  # Bug: w^T holds only for dilations 1, w, w^2, ... and strides 1
'''

RECEPTIVE_NO_DILATION = '''
def receptive_field(kernel_widths, dilations, strides):
    seen, spacing = 1, 1
    for w, s in zip(kernel_widths, strides):
        seen += (w - 1) * spacing  # Bug: the dilations are ignored
        spacing *= s
    return seen
'''

RECEPTIVE_W_TIMES_DILATION = '''
def receptive_field(kernel_widths, dilations, strides):
    seen, spacing = 1, 1
    for w, step, s in zip(kernel_widths, dilations, strides):
        seen += w * step * spacing  # Bug: w, not w - 1
        spacing *= s
    return seen
'''

RECEPTIVE_IGNORES_STRIDES = '''
def receptive_field(kernel_widths, dilations, strides):
    return 1 + sum((w - 1) * step for w, step in zip(kernel_widths, dilations))  # Bug: the strides are ignored
'''

RECEPTIVE_OWN_STRIDE_TOO = '''
def receptive_field(kernel_widths, dilations, strides):
    seen, spacing = 1, 1
    for w, step, s in zip(kernel_widths, dilations, strides):
        spacing *= s  # Bug: a layer's own stride counted for its own taps
        seen += (w - 1) * step * spacing
    return seen
'''

# --- dilated local attention ----------------------------------------------------------

def _dilated(window, weights="softmax(s)"):
    """A dilated_local_attention with global tokens whose window (keys of query i) or
    softmax is given: one deliberate change, the global tokens handled right."""
    return f'''
def _window(i, n, radius, dilation):
    {window}

def dilated_local_attention(q, k, v, radius, dilation, n_global=0):
    n, d_k = q.shape
    g = min(n_global, n)
    out = np.zeros((n, v.shape[1]))
    for i in range(n):
        js = np.arange(n) if i < g else np.union1d(np.arange(g), np.asarray(_window(i, n, radius, dilation), dtype=int))
        s = k[js] @ q[i] / np.sqrt(d_k)
        out[i] = {weights} @ v[js]
    return out
'''


DILATED_IGNORES_DILATION = _dilated("return range(max(0, i - radius), min(n, i + radius + 1))  # Bug: the plain window")
# Bug: reach radius, not radius * dilation.
DILATED_REACH_RADIUS = _dilated("return [j for j in range(max(0, i - radius), min(n, i + radius + 1)) if (j - i) % dilation == 0]")
# Bug: clipped to 0, the taps no longer pass through i.
DILATED_MISALIGNED_START = _dilated("return range(max(0, i - radius * dilation), min(n, i + radius * dilation + 1), dilation)")
_WINDOW = "return range(i - min(radius, i // dilation) * dilation, min(n, i + radius * dilation + 1), dilation)"
DILATED_UNSTABLE = _dilated(_WINDOW, weights="(np.exp(s) / np.exp(s).sum())")  # Bug: no maximum subtracted
# Bug: the global keys seen by the global queries only, not by everyone.
DILATED_GLOBAL_ONE_WAY = _dilated(_WINDOW).replace("np.union1d(np.arange(g), ", "np.union1d(np.arange(0), ")
# Bug: a global key inside the window counted twice.
DILATED_GLOBAL_TWICE = _dilated(_WINDOW).replace("np.union1d(np.arange(g), np.asarray(_window(i, n, radius, dilation), dtype=int))",
                                                 "np.concatenate([np.arange(g), np.asarray(_window(i, n, radius, dilation), dtype=int)])")

# Each query's window gathered into 2·radius + 1 slots (clipped at the ends) plus the global
# keys, the slots outside the sequence filled with a finite score.
DILATED_FINITE_FILL = '''
def dilated_local_attention(q, k, v, radius, dilation, n_global=0):
    n, d_k = q.shape
    g = min(n_global, n)
    offsets = np.arange(-radius, radius + 1) * dilation
    out = np.empty((n, v.shape[1]))
    for i in range(n):
        if i < g:
            js, valid = np.arange(n), np.ones(n, dtype=bool)
        else:
            window = i + offsets
            js = np.concatenate([np.arange(g), np.clip(window, 0, n - 1)])
            valid = np.concatenate([np.ones(g, dtype=bool), (window >= g) & (window < n)])
        s = np.where(valid, k[js] @ q[i] / np.sqrt(d_k), -1e4)  # Bug: loses to scores far below -1e4
        out[i] = softmax(s) @ v[js]
    return out
'''

# A float for the spacing between taps: exact while the span stays below 2^53.
RECEPTIVE_FLOAT_SPACING = '''
def receptive_field(kernel_widths, dilations, strides):
    seen, spacing = 1, 1.0
    for width, step, stride in zip(kernel_widths, dilations, strides):
        seen += (width - 1) * step * spacing
        spacing *= stride
    return int(seen)
'''

DILATED_FULL_SCORES = '''
def dilated_local_attention(q, k, v, radius, dilation, n_global=0):
    n = q.shape[0]
    scores = q @ k.T / np.sqrt(q.shape[1])  # Bug: the whole n x n score matrix
    offset = np.arange(n)[None, :] - np.arange(n)[:, None]
    keep = (np.abs(offset) <= radius * dilation) & (offset % dilation == 0)
    keep[:n_global, :] = True
    keep[:, :n_global] = True
    return softmax(np.where(keep, scores, -np.inf)) @ v
'''

DILATED_TORCH_MASK = '''
def dilated_local_attention(q, k, v, radius, dilation, n_global=0):
    n, d_k = q.shape
    idx = torch.arange(n)
    offset = idx[None, :] - idx[:, None]  # Bug: n x n tensors, which tracemalloc does not see
    keep = (offset.abs() <= radius * dilation) & (offset % dilation == 0)
    keep[:n_global, :] = True
    keep[:, :n_global] = True
    out = np.zeros((n, v.shape[1]))
    for i in range(n):
        js = keep[i].nonzero().flatten().numpy()
        out[i] = softmax(k[js] @ q[i] / np.sqrt(d_k)) @ v[js]
    return out
'''

# --- causal linear attention ---------------------------------------------------------

CAUSAL_NOT_CAUSAL = '''
def causal_linear_attention(q, k, v, chunk):
    phi = lambda x: np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
    fq, fk = phi(q), phi(k)
    kv = np.swapaxes(fk, -1, -2) @ v  # Bug: sums over every key, later ones included
    return fq @ kv / (fq @ np.swapaxes(fk.sum(axis=-2, keepdims=True), -1, -2))
'''

CAUSAL_STRICT_MASK = '''
def causal_linear_attention(q, k, v, chunk):
    phi = lambda x: np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
    fq, fk = phi(q), phi(k)
    n = q.shape[-2]
    S = np.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]))
    z = np.zeros(q.shape[:-2] + (1, q.shape[-1]))
    out = np.empty(q.shape[:-1] + (v.shape[-1],))
    for s in range(0, n, chunk):
        a, b, c = fq[..., s:s + chunk, :], fk[..., s:s + chunk, :], v[..., s:s + chunk, :]
        block = np.tril(a @ np.swapaxes(b, -1, -2), k=-1)  # Bug: token t does not see itself
        out[..., s:s + chunk, :] = (a @ S + block @ c) / ((a * z).sum(-1) + block.sum(-1))[..., None]
        S = S + np.swapaxes(b, -1, -2) @ c
        z = z + b.sum(axis=-2, keepdims=True)
    return out
'''

CAUSAL_STATE_UPDATED_FIRST = '''
def causal_linear_attention(q, k, v, chunk):
    phi = lambda x: np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
    fq, fk = phi(q), phi(k)
    n = q.shape[-2]
    S = np.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]))
    z = np.zeros(q.shape[:-2] + (1, q.shape[-1]))
    out = np.empty(q.shape[:-1] + (v.shape[-1],))
    for s in range(0, n, chunk):
        a, b, c = fq[..., s:s + chunk, :], fk[..., s:s + chunk, :], v[..., s:s + chunk, :]
        S = S + np.swapaxes(b, -1, -2) @ c  # Bug: the chunk is added to the state before it is used,
        z = z + b.sum(axis=-2, keepdims=True)  # so it is counted twice and seen by earlier tokens
        block = np.tril(a @ np.swapaxes(b, -1, -2))
        out[..., s:s + chunk, :] = (a @ S + block @ c) / ((a * z).sum(-1) + block.sum(-1))[..., None]
    return out
'''

# The chapter's token-by-token loop, copied: one sequence only, so the batch axes fail.
CAUSAL_BOOK_LOOP_ONE_SEQUENCE = '''
def causal_linear_attention(q, k, v, chunk):
    fq, fk = (np.maximum(a, 0) + np.exp(np.minimum(a, 0)) for a in (q, k))
    n, d = q.shape
    S, z = np.zeros((d, v.shape[1])), np.zeros(d)
    out = np.empty_like(v)
    for t in range(n):
        S += np.outer(fk[t], v[t])
        z += fk[t]
        out[t] = fq[t] @ S / (fq[t] @ z)
    return out
'''

CAUSAL_MASKED_MATRIX = '''
def causal_linear_attention(q, k, v, chunk):
    phi = lambda x: np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
    weights = np.tril(phi(q) @ np.swapaxes(phi(k), -1, -2))  # Bug: the n x n masked matrix
    return weights @ v / weights.sum(axis=-1, keepdims=True)
'''

CAUSAL_LAST_CHUNK_DROPPED = '''
def causal_linear_attention(q, k, v, chunk):
    phi = lambda x: np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
    fq, fk = phi(q), phi(k)
    n = q.shape[-2]
    S = np.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]))
    z = np.zeros(q.shape[:-2] + (1, q.shape[-1]))
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    for s in range(0, n - chunk + 1, chunk):  # Bug: a last, shorter chunk is never computed
        a, b, c = fq[..., s:s + chunk, :], fk[..., s:s + chunk, :], v[..., s:s + chunk, :]
        block = np.tril(a @ np.swapaxes(b, -1, -2))
        out[..., s:s + chunk, :] = (a @ S + block @ c) / ((a * z).sum(-1) + block.sum(-1))[..., None]
        S = S + np.swapaxes(b, -1, -2) @ c
        z = z + b.sum(axis=-2, keepdims=True)
    return out
'''

# --- correct answers in other styles: full marks -------------------------------------

STYLE_TRAINING_PER_PRODUCT = '''
def training_flops(n, d_model, heads, d_head):
    products = [(n, d_model, heads * d_head)] * 3 + [(n, heads * d_head, d_model)]
    products += [(n, d_head, n), (n, n, d_head)] * heads
    forward = sum(2 * a * b * c for a, b, c in products)
    return forward + sum(2 * 2 * a * b * c for a, b, c in products)
'''

STYLE_FITTING_RECURSIVE = '''
def longest_fitting(cost, budget):
    def within(lo, hi):  # cost(lo) fits, cost(hi) does not
        if hi - lo == 1:
            return lo
        mid = (lo + hi) // 2
        return within(mid, hi) if cost(mid) <= budget else within(lo, mid)

    if cost(1) > budget:
        raise ValueError(f"nothing fits in {budget} bytes")
    bound = 2
    while cost(bound) <= budget:
        bound *= 2
    return within(bound // 2, bound)
'''

# The answer built bit by bit from its highest bit down.
STYLE_FITTING_BITS = '''
def longest_fitting(cost, budget):
    if not cost(1) <= budget:
        raise ValueError("cost(1) exceeds the budget " + str(budget))
    top = 1
    while cost(top << 1) <= budget:
        top <<= 1
    n, bit = top, top >> 1
    while bit:
        if cost(n | bit) <= budget:
            n |= bit
        bit >>= 1
    return n
'''

# The classic lo <= hi search over [1, hi], then the chapter's final check of c and c + 1,
# with the budget written with thousands separators in its error.
STYLE_FITTING_CHECKS_ITS_ANSWER = '''
def longest_fitting(cost, budget):
    if cost(1) > budget:
        raise ValueError(f"a budget of {budget:,} bytes is too small for one token")
    hi = 1
    while cost(hi) <= budget:
        hi *= 2
    lo, top = 1, hi
    while lo <= top:
        mid = (lo + top) // 2
        if cost(mid) <= budget:
            lo = mid + 1
        else:
            top = mid - 1
    assert cost(top) <= budget < cost(top + 1)
    return top
'''

# Doubling from 1, then an inclusive search for the last n that fits.
STYLE_FITTING_INCLUSIVE = '''
from functools import lru_cache

def longest_fitting(cost, budget):
    cost = lru_cache(maxsize=None)(cost)
    if cost(1) > budget:
        raise ValueError(f"budget={budget}: not even one token fits")
    hi = 1
    while cost(hi) <= budget:
        hi *= 2
    lo, hi = hi // 2, hi - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cost(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo
'''

STYLE_RECEPTIVE_SIMULATED = '''
def receptive_field(kernel_widths, dilations, strides):
    reach, spacing = {0}, 1  # offsets of the inputs one output depends on
    for w, step, stride in zip(kernel_widths, dilations, strides):
        reach = {r + s * step * spacing for r in reach for s in range(w)}
        spacing *= stride
    return max(reach) - min(reach) + 1
'''

# Dilation delta splits the sequence into delta interleaved subsequences, and on each
# one the dilated window is a plain window of the same radius.
STYLE_DILATED_RESIDUE_CLASSES = '''
def dilated_local_attention(q, k, v, radius, dilation, n_global=0):
    n, g = len(q), min(n_global, len(q))
    out = np.empty((n, v.shape[1]))
    scale = np.sqrt(q.shape[1])
    for i in range(g):                                    # global queries see everything
        out[i] = softmax(k @ q[i] / scale) @ v
    for phase in range(min(dilation, n)):
        qs, ks, vs = q[phase::dilation], k[phase::dilation], v[phase::dilation]
        for i in range(len(qs)):
            if phase + i * dilation < g:
                continue
            lo, hi = max(0, i - radius), i + radius + 1
            window = phase + np.arange(lo, min(hi, len(ks))) * dilation
            extra = np.setdiff1d(np.arange(g), window)          # global keys outside the window
            keys, values = np.concatenate([ks[lo:hi], k[extra]]), np.concatenate([vs[lo:hi], v[extra]])
            out[phase + i * dilation] = softmax(keys @ qs[i] / scale) @ values
    return out
'''

DILATED_WITH_TORCH = '''
def dilated_local_attention(q, k, v, radius, dilation, n_global=0):
    qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))
    n = len(q)
    rows = []
    for i in range(n):
        js = torch.arange(-radius, radius + 1) * dilation + i
        js = js[(js >= 0) & (js < n)]
        js = torch.arange(n) if i < n_global else torch.unique(torch.cat([torch.arange(min(n_global, n)), js]))
        rows.append(torch.softmax(kt[js] @ qt[i] / q.shape[1] ** 0.5, dim=0) @ vt[js])
    return torch.stack(rows).numpy()
'''

# Right numbers and linear memory, but not in chunks: the exercise's algorithm is missing.
CAUSAL_RECURRENT_EINSUM = '''
def causal_linear_attention(q, k, v, chunk):
    fq = np.where(q > 0, q + 1, np.exp(np.minimum(q, 0)))
    fk = np.where(k > 0, k + 1, np.exp(np.minimum(k, 0)))
    S = np.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]))
    z = np.zeros(q.shape[:-2] + (q.shape[-1],))
    out = np.empty(q.shape[:-1] + (v.shape[-1],))
    for t in range(q.shape[-2]):  # one token at a time: chunk = 1, whatever is asked
        S += np.einsum("...d,...e->...de", fk[..., t, :], v[..., t, :])
        z += fk[..., t, :]
        out[..., t, :] = np.einsum("...d,...de->...e", fq[..., t, :], S) / np.einsum("...d,...d->...", fq[..., t, :], z)[..., None]
    return out
'''

CAUSAL_CUMSUM = '''
def causal_linear_attention(q, k, v, chunk):
    fq, fk = (np.where(a > 0, a + 1.0, np.exp(np.minimum(a, 0.0))) for a in (q, k))
    S = np.cumsum(fk[..., :, :, None] * v[..., :, None, :], axis=-3)  # (..., n, d_k, d_v): linear in n
    z = np.cumsum(fk, axis=-2)
    return np.einsum("...nd,...nde->...ne", fq, S) / np.einsum("...nd,...nd->...n", fq, z)[..., None]
'''

# Running sums of every token, with a chunk x chunk block built for show: the block's memory
# grows with the chunk as a chunked computation's does, the n x d_k x d_v sums give it away.
CAUSAL_CUMSUM_UNUSED_BLOCK = '''
def causal_linear_attention(q, k, v, chunk):
    c = max(1, min(chunk, q.shape[-2]))
    block = np.tril(np.ones((c, c)))                 # never used
    fq, fk = (np.where(a > 0, a + 1.0, np.exp(np.minimum(a, 0.0))) for a in (q, k))
    S = np.cumsum(fk[..., :, :, None] * v[..., :, None, :], axis=-3)
    z = np.cumsum(fk, axis=-2)
    return np.einsum("...nd,...nde->...ne", fq, S) / np.einsum("...nd,...nd->...n", fq, z)[..., None]
'''

CAUSAL_TORCH_CHUNKS = '''
def causal_linear_attention(q, k, v, chunk):
    fq, fk = (F.elu(torch.from_numpy(a)) + 1 for a in (q, k))
    vt = torch.from_numpy(v)
    S = torch.zeros(*q.shape[:-2], q.shape[-1], v.shape[-1], dtype=vt.dtype)
    z = torch.zeros(*q.shape[:-2], q.shape[-1], 1, dtype=vt.dtype)
    pieces = []
    for a, b, c in zip(fq.split(chunk, dim=-2), fk.split(chunk, dim=-2), vt.split(chunk, dim=-2)):
        block = torch.tril(a @ b.transpose(-1, -2))
        pieces.append((a @ S + block @ c) / (a @ z + block.sum(-1, keepdim=True)))
        S, z = S + b.transpose(-1, -2) @ c, z + b.sum(-2).unsqueeze(-1)
    return torch.cat(pieces, dim=-2).numpy()
'''

# As lean as chunking gets: one chunk x chunk block at a time, masked in place, no other
# array of that size (the chunk tests' margin of half a block must leave it room).
STYLE_CAUSAL_LEAN_BLOCKS = '''
def causal_linear_attention(q, k, v, chunk):
    fq = np.where(q > 0, q + 1.0, np.exp(np.minimum(q, 0.0)))
    fk = np.where(k > 0, k + 1.0, np.exp(np.minimum(k, 0.0)))
    n = q.shape[-2]
    state = np.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]))
    norm = np.zeros(q.shape[:-2] + (1, q.shape[-1]))
    out = np.empty(q.shape[:-1] + (v.shape[-1],))
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        a, b, c = fq[..., start:stop, :], fk[..., start:stop, :], v[..., start:stop, :]
        block = a @ np.swapaxes(b, -1, -2)
        for row in range(stop - start - 1):              # zero the future, row by row, in place
            block[..., row, row + 1:] = 0.0
        top = a @ state + block @ c
        bottom = np.sum(a * norm, axis=-1) + np.sum(block, axis=-1)
        out[..., start:stop, :] = top / bottom[..., None]
        del block
        state += np.swapaxes(b, -1, -2) @ c
        norm += np.sum(b, axis=-2, keepdims=True)
    return out
'''

CORRECT = {
    "counts_per_product_fitting_recursive": {"training_flops": STYLE_TRAINING_PER_PRODUCT,
                                             "longest_fitting": STYLE_FITTING_RECURSIVE,
                                             "receptive_field": STYLE_RECEPTIVE_SIMULATED},
    "fitting_bit_by_bit": {"longest_fitting": STYLE_FITTING_BITS},
    "fitting_inclusive_cached": {"longest_fitting": STYLE_FITTING_INCLUSIVE},
    "fitting_checks_its_answer": {"longest_fitting": STYLE_FITTING_CHECKS_ITS_ANSWER},
    "dilated_residue_classes": {"dilated_local_attention": STYLE_DILATED_RESIDUE_CLASSES},
    "causal_lean_blocks": {"causal_linear_attention": STYLE_CAUSAL_LEAN_BLOCKS},
    "written_from_the_release_alone": INDEPENDENT[ASSIGNMENT],
}

TRAINING_CELLS = {"test_training_flops", "test_training_flops_hidden"}
FITTING_CELLS = {"test_longest_fitting", "test_fitting_models", "test_fitting_huge", "test_fitting_too_small"}
RECEPTIVE_CELLS = {"test_receptive_field", "test_receptive_field_hidden"}
DILATED_CELLS = {"test_dilated_local_attention", "test_dilated_output", "test_dilated_global", "test_dilated_extreme",
                 "test_dilated_memory"}
CAUSAL_CELLS = {"test_causal_linear_attention", "test_causal_output", "test_causal_extreme", "test_causal_memory",
                "test_causal_chunked"}

BUGGY = {
    "training_forward_only": ({"training_flops": TRAINING_FORWARD_ONLY}, TRAINING_CELLS),
    "training_backward_as_forward": ({"training_flops": TRAINING_BACKWARD_AS_FORWARD}, TRAINING_CELLS),
    "training_heads_split_the_width": ({"training_flops": TRAINING_HEADS_SPLIT_THE_WIDTH}, TRAINING_CELLS),
    "training_returns_float": ({"training_flops": TRAINING_FLOAT}, TRAINING_CELLS),
    # Exact for every size of the visible tests and for the few hand-picked hidden ones whose
    # totals happen to fit in 53 bits; sizes drawn across the range expose it.
    "training_float_round_trip": ({"training_flops": TRAINING_FLOAT_ROUND_TRIP}, {"test_training_flops_hidden"}),
    "receptive_float_spacing": ({"receptive_field": RECEPTIVE_FLOAT_SPACING}, {"test_receptive_field_hidden"}),
    # Right for every draw of unit or mixed-sign scores; rows whose scores all lie far below -1e4
    # (the visible test's and the extreme cell's) expose it.
    "dilated_finite_fill": ({"dilated_local_attention": DILATED_FINITE_FILL},
                            {"test_dilated_local_attention", "test_dilated_extreme"}),
    "training_counted_on_meta_tensors": ({"training_flops": TRAINING_COUNTED_ON_META},
                                         {"test_training_flops_hidden"}),
    "fitting_float_midpoint": ({"longest_fitting": FITTING_FLOAT_MIDPOINT},
                               {"test_longest_fitting", "test_fitting_huge"}),
    "fitting_first_that_does_not_fit": ({"longest_fitting": FITTING_FIRST_THAT_DOES_NOT_FIT},
                                        FITTING_CELLS - {"test_fitting_too_small"}),
    "fitting_linear_scan": ({"longest_fitting": FITTING_LINEAR_SCAN}, FITTING_CELLS - {"test_fitting_too_small"}),
    "fitting_quadratic_only": ({"longest_fitting": FITTING_QUADRATIC_ONLY},
                               FITTING_CELLS - {"test_fitting_too_small"}),
    "fitting_zero_instead_of_error": ({"longest_fitting": FITTING_ZERO_INSTEAD_OF_ERROR},
                                      {"test_longest_fitting", "test_fitting_too_small"}),
    "fitting_starts_at_zero": ({"longest_fitting": FITTING_STARTS_AT_ZERO}, FITTING_CELLS),
    "fitting_budget_as_bound": ({"longest_fitting": FITTING_BUDGET_AS_BOUND},
                                FITTING_CELLS - {"test_fitting_too_small"}),
    # Answers past 2^63 (in the visible and huge tests) overflow bisect's C indexes.
    "fitting_bisect_module": ({"longest_fitting": FITTING_BISECT_MODULE}, {"test_longest_fitting", "test_fitting_huge"}),
    "receptive_product_of_widths": ({"receptive_field": RECEPTIVE_PRODUCT_OF_WIDTHS}, RECEPTIVE_CELLS),
    "receptive_no_dilation": ({"receptive_field": RECEPTIVE_NO_DILATION}, RECEPTIVE_CELLS),
    "receptive_w_times_dilation": ({"receptive_field": RECEPTIVE_W_TIMES_DILATION}, RECEPTIVE_CELLS),
    "receptive_ignores_strides": ({"receptive_field": RECEPTIVE_IGNORES_STRIDES}, RECEPTIVE_CELLS),
    "receptive_own_stride_too": ({"receptive_field": RECEPTIVE_OWN_STRIDE_TOO}, RECEPTIVE_CELLS),
    "dilated_ignores_dilation": ({"dilated_local_attention": DILATED_IGNORES_DILATION}, DILATED_CELLS),
    "dilated_reach_radius": ({"dilated_local_attention": DILATED_REACH_RADIUS}, DILATED_CELLS),
    "dilated_misaligned_start": ({"dilated_local_attention": DILATED_MISALIGNED_START}, DILATED_CELLS),
    # The visible test's scores near -1e5 underflow it to 0/0.
    "dilated_unstable_softmax": ({"dilated_local_attention": DILATED_UNSTABLE},
                                 {"test_dilated_local_attention", "test_dilated_extreme"}),
    "dilated_global_keys_one_way": ({"dilated_local_attention": DILATED_GLOBAL_ONE_WAY},
                                    {"test_dilated_local_attention", "test_dilated_global", "test_dilated_extreme",
                                     "test_dilated_memory"}),
    "dilated_global_keys_counted_twice": ({"dilated_local_attention": DILATED_GLOBAL_TWICE},
                                          {"test_dilated_local_attention", "test_dilated_global", "test_dilated_memory"}),
    # Right numbers, quadratic memory: the visible test measures NumPy's memory too.
    "dilated_full_score_matrix": ({"dilated_local_attention": DILATED_FULL_SCORES},
                                  {"test_dilated_local_attention", "test_dilated_memory"}),
    # PyTorch where the exercise asks for NumPy: every hidden cell is lost, and the visible test
    # too, whose memory is measured by the kernel as well when graded (tracemalloc does not see
    # the n x n mask; in the student's Jupyter the visible test passes).
    "dilated_torch_mask": ({"dilated_local_attention": DILATED_TORCH_MASK}, DILATED_CELLS),
    "dilated_with_torch": ({"dilated_local_attention": DILATED_WITH_TORCH},
                           DILATED_CELLS - {"test_dilated_local_attention"}),
    "causal_torch_chunks": ({"causal_linear_attention": CAUSAL_TORCH_CHUNKS},
                            CAUSAL_CELLS - {"test_causal_linear_attention"}),
    "training_with_torch_on_small_sizes": ({"training_flops": TRAINING_TORCH_SMALL}, {"test_training_flops_hidden"}),
    "causal_not_causal": ({"causal_linear_attention": CAUSAL_NOT_CAUSAL}, CAUSAL_CELLS),
    "causal_strict_mask": ({"causal_linear_attention": CAUSAL_STRICT_MASK}, CAUSAL_CELLS),
    "causal_state_updated_first": ({"causal_linear_attention": CAUSAL_STATE_UPDATED_FIRST}, CAUSAL_CELLS),
    "causal_book_loop_one_sequence": ({"causal_linear_attention": CAUSAL_BOOK_LOOP_ONE_SEQUENCE}, CAUSAL_CELLS),
    "causal_masked_matrix": ({"causal_linear_attention": CAUSAL_MASKED_MATRIX},
                             {"test_causal_linear_attention", "test_causal_memory", "test_causal_chunked"}),
    # Right numbers and linear memory, but no chunk x chunk block: the visible test measures the
    # peak at two chunk sizes as the hidden one does.
    "causal_token_by_token": ({"causal_linear_attention": CAUSAL_RECURRENT_EINSUM},
                              {"test_causal_linear_attention", "test_causal_chunked"}),
    "causal_running_sums": ({"causal_linear_attention": CAUSAL_CUMSUM},
                            {"test_causal_linear_attention", "test_causal_chunked"}),
    "causal_running_sums_beside_an_unused_block": ({"causal_linear_attention": CAUSAL_CUMSUM_UNUSED_BLOCK},
                                                   {"test_causal_linear_attention", "test_causal_chunked"}),
    # The memory tests' chunks divide their lengths, so only the output tests see the missing tail.
    "causal_last_chunk_dropped": ({"causal_linear_attention": CAUSAL_LAST_CHUNK_DROPPED},
                                  CAUSAL_CELLS - {"test_causal_memory", "test_causal_chunked"}),
}


# Planted cases a check also puts in the integrity report, with the reason it gives: PyTorch
# reached for by a graded call in the process without PyTorch, where NumPy is graded.
FLAGGED = {case: {"sandbox: uses PyTorch where the answer is graded as NumPy code"}
           for case in ("dilated_torch_mask", "dilated_with_torch", "causal_torch_chunks",
                        "training_counted_on_meta_tensors", "training_with_torch_on_small_sizes")}
# Reasons a planted case may also be flagged with, depending on the machine: where memory
# cgroups exist, the kernel sees the PyTorch memory that the notebook's NumPy probe does not.
MAY_BE_FLAGGED = {case: {"sandbox: memory measurements disagree"}
                  for case in ("dilated_torch_mask", "dilated_with_torch", "causal_torch_chunks")}
