"""Planted submissions for ch1_principles.

Each case replaces some solution cells (keyed by grade_id) of an otherwise
correct submission. `loses` names the test cells that must score 0; every other
autograded cell must get full points."""

from tests.submissions.independent import CELLS as INDEPENDENT

ASSIGNMENT = "ch1_principles"
NOTEBOOK = "principles.ipynb"

SOFTMAX_IGNORES_AXIS = '''
def softmax(x, axis=-1):
    shifted = x - np.max(x, axis=-1, keepdims=True)
    exps = np.exp(shifted)
    return exps / np.sum(exps, axis=-1, keepdims=True)
'''

SOFTMAX_UNSTABLE = '''
def softmax(x, axis=-1):
    exps = np.exp(x)
    return exps / np.sum(exps, axis=axis, keepdims=True)
'''

SOFTMAX_GLOBAL_MAX = '''
def softmax(x, axis=-1):
    # Bug: one maximum for the whole array; slices far below it underflow to 0/0.
    exps = np.exp(x - np.max(x))
    return exps / np.sum(exps, axis=axis, keepdims=True)
'''

SOFTMAX_IN_PLACE = '''
def softmax(x, axis=-1):
    x -= np.max(x, axis=axis, keepdims=True)
    np.exp(x, out=x)
    x /= np.sum(x, axis=axis, keepdims=True)
    return x
'''

SOFTMAX_WITH_TORCH = '''
import torch

def softmax(x, axis=-1):
    return torch.softmax(torch.from_numpy(np.asarray(x, dtype=np.float64)), dim=axis).numpy()
'''

# The torch_attention of Exercise 6's visible test, copied as the answer to Exercise 2.
SDPA_WITH_TORCH = '''
import torch
import torch.nn.functional as F

def scaled_dot_product_attention(q, k, v, mask=None):
    tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64)) for a in (q, k, v))
    tm = None if mask is None else torch.from_numpy(np.ascontiguousarray(mask, dtype=bool))
    eye = torch.eye(tk.shape[-2], dtype=torch.float64).expand(*tk.shape[:-1], tk.shape[-2])
    weights = F.scaled_dot_product_attention(tq, tk, eye, attn_mask=tm)
    return F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm).numpy(), weights.numpy()
'''

SDPA_NO_SCALING = '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores, axis=-1)
    return weights @ v, weights
'''

SDPA_SOFTMAX_OVER_QUERIES = '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores, axis=-2)
    return weights @ v, weights
'''

SDPA_MASK_AFTER_SOFTMAX = '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    weights = softmax(scores, axis=-1)
    if mask is not None:
        weights = np.where(mask, weights, 0.0)
    return weights @ v, weights
'''

SDPA_SCALE_BY_D_V = '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(v.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores, axis=-1)
    return weights @ v, weights
'''

SDPA_FINITE_MASK = '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -1e4)  # Bug: loses to kept scores far below -1e4
    weights = softmax(scores, axis=-1)
    return weights @ v, weights
'''

SDPA_ADDITIVE_PENALTY = '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores - 1e4 * (1 - mask)  # Bug: a masked key scoring 1e4 above the kept ones still wins
    weights = softmax(scores, axis=-1)
    return weights @ v, weights
'''

SDPA_2D_ONLY = '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ k.T / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores, axis=-1)
    return weights @ v, weights
'''

MHA_HEADS_WRONG_AXIS = '''
def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):
    *lead, n, _ = x.shape
    # Bug: reshapes (n, H * width) straight to (H, n, width), mixing tokens into heads.
    split = lambda t: t.reshape(*lead, num_heads, n, t.shape[-1] // num_heads)
    heads, _ = scaled_dot_product_attention(split(x @ w_q), split(x @ w_k), split(x @ w_v))
    return heads.reshape(*lead, n, w_o.shape[0]) @ w_o
'''

MHA_INTERLEAVED_HEADS = '''
def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):
    # Bug: head h takes every num_heads-th column instead of a contiguous block.
    split = lambda t: np.stack([t[..., h::num_heads] for h in range(num_heads)], axis=-3)
    heads, _ = scaled_dot_product_attention(split(x @ w_q), split(x @ w_k), split(x @ w_v))
    return np.concatenate([heads[..., h, :, :] for h in range(num_heads)], axis=-1) @ w_o
'''

MHA_SCALES_BY_D_V = '''
def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):
    *lead, n, _ = x.shape
    split = lambda t: np.swapaxes(t.reshape(*lead, n, num_heads, -1), -2, -3)
    q, k, v = split(x @ w_q), split(x @ w_k), split(x @ w_v)
    # Bug: scales by the value width instead of the query/key width.
    weights = softmax(q @ np.swapaxes(k, -1, -2) / np.sqrt(v.shape[-1]), axis=-1)
    return np.swapaxes(weights @ v, -2, -3).reshape(*lead, n, -1) @ w_o
'''

MHA_FORGETS_W_O = '''
def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):
    *lead, n, _ = x.shape
    split = lambda t: np.swapaxes(t.reshape(*lead, n, num_heads, -1), -2, -3)
    heads, _ = scaled_dot_product_attention(split(x @ w_q), split(x @ w_k), split(x @ w_v))
    return np.swapaxes(heads, -2, -3).reshape(*lead, n, -1)
'''

MHA_UNBATCHED_ONLY = '''
def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):
    n, _ = x.shape
    d_k, d_v = w_q.shape[1] // num_heads, w_v.shape[1] // num_heads
    outs = []
    for h in range(num_heads):
        qk, vs = slice(h * d_k, (h + 1) * d_k), slice(h * d_v, (h + 1) * d_v)
        out, _ = scaled_dot_product_attention((x @ w_q)[:, qk], (x @ w_k)[:, qk], (x @ w_v)[:, vs])
        outs.append(out)
    return np.concatenate(outs, axis=-1) @ w_o
'''

MHA_ASSUMES_SQUARE_HEADS = '''
def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):
    # Bug: every head is d_model // num_heads wide, whatever the weights say.
    d_head = x.shape[-1] // num_heads
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    outs = []
    for h in range(num_heads):
        cols = slice(h * d_head, (h + 1) * d_head)
        outs.append(scaled_dot_product_attention(q[..., cols], k[..., cols], v[..., cols])[0])
    return np.concatenate(outs, axis=-1) @ w_o
'''

MHA_VALUE_WIDTH_FOR_KEYS = '''
def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):
    # Bug: slices queries and keys with the value width d_v.
    width = w_v.shape[1] // num_heads
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    outs = []
    for h in range(num_heads):
        cols = slice(h * width, (h + 1) * width)
        outs.append(scaled_dot_product_attention(q[..., cols], k[..., cols], v[..., cols])[0])
    return np.concatenate(outs, axis=-1) @ w_o
'''

JVP_FORGETS_OUTER_TERM = '''
def softmax_jvp(x, u, axis=-1):
    # Bug: only diag(p) u; the - p p^T u term is missing.
    return softmax(x, axis=axis) * u
'''

JVP_LAST_AXIS_ONLY = '''
def softmax_jvp(x, u, axis=-1):
    p = softmax(x, axis=axis)
    # Bug: the sum runs over the last axis whatever axis was asked for.
    return p * (u - np.sum(p * u, axis=-1, keepdims=True))
'''

JVP_OWN_UNSTABLE_SOFTMAX = '''
def softmax_jvp(x, u, axis=-1):
    e = np.exp(x)  # Bug: overflows for large scores
    p = e / np.sum(e, axis=axis, keepdims=True)
    return p * (u - np.sum(p * u, axis=axis, keepdims=True))
'''

JVP_CHANGES_U = '''
def softmax_jvp(x, u, axis=-1):
    p = softmax(x, axis=axis)
    u -= np.sum(p * u, axis=axis, keepdims=True)  # Bug: writes into the caller's u
    u *= p
    return u
'''

CHECKS_ONLY_ROW_SUMS = '''
def passes_attention_checks(attention):
    # Bug: properties every softmax has, whatever the scores; nothing ties them to q and k.
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    out, weights = attention(q, k, v)
    return bool(out.shape == (3, 2) and np.allclose(weights.sum(axis=-1), 1.0) and np.all(weights >= 0))
'''

CHECKS_NEVER_MASK = '''
def passes_attention_checks(attention):
    # Bug: never passes a mask, so a mask ignored or misread goes unnoticed.
    rng = np.random.default_rng(1)
    for scale in (1.0, 50.0):
        q, k, v = rng.normal(scale=scale, size=(3, 4)), rng.normal(scale=scale, size=(5, 4)), rng.normal(size=(5, 2))
        expected, weights = scaled_dot_product_attention(q, k, v)
        out, found = attention(q, k, v)
        if not (np.allclose(out, expected) and np.allclose(found, weights)):
            return False
    return True
'''

CHECKS_SQUARE_AND_SMALL = '''
def passes_attention_checks(attention):
    # Bug: d_k == d_v and modest scores, so a 1/sqrt(d_v) scale or an overflowing exp goes unnoticed.
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 4))
    mask = np.array([[True, False, True, True, False]] * 3)
    for m in (None, mask):
        expected, weights = scaled_dot_product_attention(q, k, v, m)
        out, found = attention(q, k, v, mask=m)
        if not (np.allclose(out, expected) and np.allclose(found, weights)):
            return False
    return True
'''

CHECKS_EXACT_EQUALITY = '''
def passes_attention_checks(attention):
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(scale=30, size=(2, 3, 4)), rng.normal(scale=30, size=(2, 5, 4)), rng.normal(size=(2, 5, 2))
    mask = np.array([[True, False, True, True, False]] * 3)
    for qs, ks, m in [(q, k, None), (q, k, mask), (10 * np.abs(q), -10 * np.abs(k), mask)]:
        expected, weights = scaled_dot_product_attention(qs, ks, v, m)
        try:
            out, found = attention(qs, ks, v, mask=m)
        except Exception:
            return False
        # Bug: exact equality; a correct implementation that adds in another order fails.
        if not (np.array_equal(out, expected) and np.array_equal(found, weights)):
            return False
    return True
'''

# The solution's checks, changed in one place each.
_SOLUTION_CHECKS = '''
def passes_attention_checks(attention):
    rng = np.random.default_rng(0)
    batch, n_q, n_k, d_k, d_v = 2, 3, 5, 4, 2
    mask = rng.random((n_q, n_k)) < 0.5
    mask[:, 0] = True
    mask[:, 1] = False
    MASK_CHANGE
    probes = [(rng.normal(scale=s, size=(batch, n_q, d_k)), rng.normal(scale=s, size=(batch, n_k, d_k)))
              for s in (1.0, 40.0)]
    probes.append((np.abs(rng.normal(scale=300.0, size=(batch, n_q, d_k))),
                   -np.abs(rng.normal(scale=300.0, size=(batch, n_k, d_k)))))
    for q, k in probes:
        v = rng.normal(size=(batch, n_k, d_v))
        for keep in (None, mask):
            CALL
            slow = np.empty((batch, n_q, n_k))
            for b, i in np.ndindex(batch, n_q):
                logits = np.array([q[b, i] @ k[b, j] for j in range(n_k)]) / d_k ** 0.5
                if keep is not None:
                    logits[~np.asarray(keep[i], dtype=bool)] = -np.inf
                top = logits.max()
                slow[b, i] = np.exp(logits - top) / np.exp(logits - top).sum()
            if not (np.allclose(weights, slow, equal_nan=True) and np.allclose(out, slow @ v, equal_nan=True)):
                return False
    return True
'''
_GUARDED_CALL = """try:
                out, weights = attention(q, k, v, mask=keep)
            except Exception:
                return False"""

# Bug: the mask handed over as float 0/1, where the specification's mask is boolean;
# a correct attention that relies on that (~mask) raises, and is rejected.
CHECKS_FLOAT_MASK = _SOLUTION_CHECKS.replace("MASK_CHANGE", "mask = mask.astype(float)").replace("CALL", _GUARDED_CALL)

# Bug: an attention that raises makes the checks raise, instead of returning False.
CHECKS_LET_ERRORS_ESCAPE = _SOLUTION_CHECKS.replace("MASK_CHANGE", "").replace(
    "CALL", "out, weights = attention(q, k, v, mask=keep)")

# Bug: a query with no key to attend to, which Exercise 2 excludes; correct implementations
# may differ there (nan, or zeros), and one that returns zeros is rejected.
CHECKS_PROBE_EMPTY_ROWS = _SOLUTION_CHECKS.replace("MASK_CHANGE", "mask[2] = False").replace("CALL", _GUARDED_CALL)

# Bug: masks only on scores of ordinary size, so a finite mask value of -1e4 goes unnoticed.
CHECKS_MASK_ON_SMALL_SCORES = _SOLUTION_CHECKS.replace("MASK_CHANGE", "").replace("CALL", _GUARDED_CALL).replace(
    "for keep in (None, mask):", "for keep in (None, mask) if q.max() < 100 else (None,):")

# Bug: as many keys as key columns (n_k = d_k), so a scale of 1/sqrt(n_k) looks right.
CHECKS_KEYS_AS_WIDE_AS_THEY_ARE_LONG = _SOLUTION_CHECKS.replace("MASK_CHANGE", "").replace(
    "CALL", _GUARDED_CALL).replace("batch, n_q, n_k, d_k, d_v = 2, 3, 5, 4, 2", "batch, n_q, n_k, d_k, d_v = 2, 3, 4, 4, 2")

# An attack: no checks at all, just the answers in the order the tests ask (the visible
# cell: two correct implementations, then four wrong ones) and used to ask in the hidden
# cells (two correct implementations, then the wrong ones).
CHECKS_BY_CALL_COUNT = '''
_asked = []

def passes_attention_checks(attention):
    _asked.append(attention)
    return len(_asked) in (1, 2, 7, 8)
'''

SYMMETRIES_INVARIANCE = '''
def commuting_permutations(f, n, d):
    x = np.random.default_rng(0).normal(size=(n, d))
    y = f(x)
    return [p for p in itertools.permutations(range(n))
            if np.max(np.abs(f(x[list(p)]) - y)) <= 1e-8 * np.max(np.abs(y))]  # invariance, not equivariance
'''

SYMMETRIES_INVERSE_PERMUTATION = '''
def commuting_permutations(f, n, d):
    x = np.random.default_rng(0).normal(size=(n, d))
    y = f(x)
    return [p for p in itertools.permutations(range(n))
            if np.max(np.abs(f(x[list(p)]) - y[np.argsort(p)])) <= 1e-8 * np.max(np.abs(y))]
'''

SYMMETRIES_ABSOLUTE_TOLERANCE = '''
def commuting_permutations(f, n, d):
    x = np.random.default_rng(0).normal(size=(n, d))
    y = f(x)
    return [p for p in itertools.permutations(range(n)) if np.max(np.abs(f(x[list(p)]) - y[list(p)])) < 1e-9]
'''

SYMMETRIES_ALLCLOSE_DEFAULTS = '''
def commuting_permutations(f, n, d):
    x = np.random.default_rng(0).normal(size=(n, d))
    y = f(x)
    return [p for p in itertools.permutations(range(n)) if np.allclose(f(x[list(p)]), y[list(p)])]
'''

SYMMETRIES_SAME_ROWS_ANY_ORDER = '''
def commuting_permutations(f, n, d):
    # Bug: "the same output vectors in a different order" is not enough; the order must follow p.
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(n, d)) for _ in range(3)]
    def rows(a):
        return a[np.lexsort(a.T[::-1])]
    return [p for p in itertools.permutations(range(n))
            if all(np.allclose(rows(f(x[list(p)])), rows(f(x)), rtol=1e-9, atol=0) for x in xs)]
'''

SYMMETRIES_ONLY_SWAPS = '''
def commuting_permutations(f, n, d):
    # Checks the identity and each swap of two tokens, as if those were all the reorderings.
    x = np.random.default_rng(0).normal(size=(n, d))
    y = f(x)
    found = [tuple(range(n))]
    for i in range(n):
        for j in range(i + 1, n):
            p = list(range(n))
            p[i], p[j] = j, i
            if np.max(np.abs(f(x[p]) - y[p])) <= 1e-8 * np.max(np.abs(y)):
                found.append(tuple(p))
    return found
'''

# --- correct answers in other styles: full marks -----------------------------

STYLE_SOFTMAX_LOGSUMEXP = '''
def softmax(x, axis=-1):
    x = np.asarray(x, dtype=float)
    m = np.max(x, axis=axis, keepdims=True)
    lse = m + np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))
    return np.exp(x - lse)
'''

STYLE_SOFTMAX_MOVEAXIS = '''
def softmax(x, axis=-1):
    moved = np.moveaxis(np.array(x, dtype=np.float64), axis, -1)
    moved = moved - moved.max(-1)[..., None]
    out = np.exp(moved)
    out /= out.sum(-1)[..., None]
    return np.moveaxis(out, -1, axis)
'''

STYLE_SDPA_LIST_RESULT = '''
def scaled_dot_product_attention(q, k, v, mask=None):
    d_k = q.shape[-1]
    logits = np.matmul(q, np.moveaxis(k, -1, -2)) / np.sqrt(d_k)
    logits = np.where(np.broadcast_to(True if mask is None else mask, logits.shape), logits, -np.inf)
    w = softmax(logits)
    return [np.matmul(w, v), w]
'''

STYLE_SDPA_LOG_MASK = '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores + np.log(mask)  # log(1) = 0, log(0) = -inf (numpy warns about it)
    weights = softmax(scores, axis=-1)
    return weights @ v, weights
'''

STYLE_SDPA_EINSUM = '''
def scaled_dot_product_attention(q, k, v, mask=None):
    d_k = k.shape[-1]
    scores = np.einsum("...qd,...kd->...qk", q, k) / d_k ** 0.5
    if mask is not None:
        scores = scores + np.where(mask, 0.0, -1e30)
    weights = softmax(scores)
    output = np.einsum("...qk,...kd->...qd", weights, v)
    return output, weights
'''

STYLE_SDPA_MATMUL_LARGE_NEGATIVE = '''
import math

def scaled_dot_product_attention(q, k, v, mask=None):
    scores = np.matmul(q, np.swapaxes(k, -2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        mask = np.broadcast_to(mask, scores.shape)
        scores = scores.copy()
        scores[~mask] = -1e9
    weights = softmax(scores, axis=-1)
    return np.matmul(weights, v), weights
'''

# The maximum over the kept keys only, and zeros written where the mask says so.
STYLE_SDPA_MASKED_MAX = '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    keep = np.ones(scores.shape, dtype=bool) if mask is None else np.broadcast_to(mask, scores.shape)
    top = np.max(scores, axis=-1, where=keep, initial=-np.inf, keepdims=True)
    e = np.exp(scores - top, where=keep, out=np.zeros_like(scores))
    weights = e / e.sum(axis=-1, keepdims=True)
    return weights @ v, weights
'''

STYLE_MHA_LOOP = '''
def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):
    unbatched = x.ndim == 2
    if unbatched:
        x = x[None]
    d_k, d_v = w_q.shape[1] // num_heads, w_v.shape[1] // num_heads
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    outputs = []
    for h in range(num_heads):
        qk, vs = slice(h * d_k, (h + 1) * d_k), slice(h * d_v, (h + 1) * d_v)
        head, _ = scaled_dot_product_attention(q[..., qk], k[..., qk], v[..., vs])
        outputs.append(head)
    out = np.concatenate(outputs, axis=-1) @ w_o
    return out[0] if unbatched else out
'''

STYLE_MHA_EINSUM_WEIGHTS = '''
def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):
    d_model = x.shape[-1]
    # One weight tensor per projection, (d_model, heads, width): the heads become an axis.
    wq, wk, wv = (w.reshape(d_model, num_heads, -1) for w in (w_q, w_k, w_v))
    q, k, v = (np.einsum("...nd,dhe->...hne", x, w) for w in (wq, wk, wv))
    heads, _ = scaled_dot_product_attention(q, k, v)
    wo = w_o.reshape(num_heads, v.shape[-1], -1)
    return np.einsum("...hne,heo->...no", heads, wo)
'''

STYLE_MHA_TRANSPOSE = '''
def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):
    shape = x.shape
    x3 = x.reshape(-1, shape[-2], shape[-1])
    b, n, _ = x3.shape
    def heads(w):
        return (x3 @ w).reshape(b, n, num_heads, -1).transpose(0, 2, 1, 3)
    out, _ = scaled_dot_product_attention(heads(w_q), heads(w_k), heads(w_v))
    out = out.transpose(0, 2, 1, 3).reshape(b, n, -1) @ w_o
    return out.reshape(*shape[:-1], w_o.shape[1])
'''

JVP_FORMS_JACOBIAN = '''
def softmax_jvp(x, u, axis=-1):
    # Bug: builds each slice's n x n Jacobian, right values but n^2 memory.
    p = np.moveaxis(softmax(x, axis=axis), axis, -1)
    J = np.einsum("...i,ij->...ij", p, np.eye(p.shape[-1])) - p[..., :, None] * p[..., None, :]
    out = np.einsum("...ij,...j->...i", J, np.moveaxis(u, axis, -1))
    return np.moveaxis(out, -1, axis)
'''

STYLE_JVP_TWO_TERMS = '''
def softmax_jvp(x, u, axis=-1):
    x = np.asarray(x, dtype=float)
    shifted = x - x.max(axis=axis, keepdims=True)
    p = np.exp(shifted)
    p = p / p.sum(axis=axis, keepdims=True)
    pu = p * u
    return pu - p * pu.sum(axis=axis, keepdims=True)
'''

STYLE_CHECKS_AGAINST_TORCH = '''
import torch
import torch.nn.functional as F

def passes_attention_checks(attention):
    """Compares with PyTorch; weights come out as the output for identity values."""
    rng = np.random.default_rng(7)
    q, k, v = rng.normal(size=(2, 3, 6)), rng.normal(size=(2, 4, 6)), rng.normal(size=(2, 4, 1))
    keep = np.array([[True, True, False, False], [False, True, True, False], [True, False, False, True]])
    # The last pair: keys opposite to the queries, every score far below -1e4.
    for qs, ks in [(q, k), (100 * q, 100 * k), (300 * np.abs(q), -300 * np.abs(k))]:
        for mask in (None, keep):
            tq, tk, tv = (torch.from_numpy(a) for a in (qs, ks, v))
            tm = None if mask is None else torch.from_numpy(mask)
            eye = torch.eye(4, dtype=torch.float64).expand(2, 4, 4)
            try:
                out, weights = attention(qs, ks, v, mask=mask)
                ok = (np.allclose(out, F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm).numpy())
                      and np.allclose(weights, F.scaled_dot_product_attention(tq, tk, eye, attn_mask=tm).numpy()))
            except Exception:
                return False
            if not ok:
                return False
    return True
'''

STYLE_CHECKS_PROPERTIES = '''
def passes_attention_checks(attention):
    """Properties from the chapter, then one comparison with my own attention."""
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(2, 4, 5)), rng.normal(size=(2, 7, 5)), rng.normal(size=(2, 7, 3))
    mask = rng.random((4, 7)) < 0.5
    mask[:, 2] = True
    try:
        for qs, ks in [(q, k), (1e3 * q, k), (300 * np.abs(q), -300 * np.abs(k))]:  # last: all scores << -1e4
            out, w = attention(qs, ks, v, mask=mask)
            if not (np.all(np.isfinite(out)) and np.allclose(w.sum(axis=-1), 1) and np.all(w[:, ~mask] == 0)):
                return False
            ref_out, ref_w = scaled_dot_product_attention(qs, ks, v, mask)
            if not (np.allclose(w, ref_w) and np.allclose(out, ref_out)):
                return False
    except Exception:
        return False
    return True
'''

STYLE_SYMMETRIES_PERMUTATION_MATRICES = '''
def commuting_permutations(f, n, d):
    rng = np.random.default_rng(7)
    xs = [rng.normal(size=(n, d)) for _ in range(2)]
    result = []
    for perm in itertools.permutations(range(n)):
        P = np.eye(n)[list(perm)]
        if all(np.allclose(f(P @ x), P @ f(x), rtol=1e-6, atol=1e-9 * np.abs(f(x)).max()) for x in xs):
            result.append(perm)
    return result
'''

STYLE_SYMMETRIES_RECURSIVE_FROBENIUS = '''
def _orderings(items):
    if len(items) <= 1:
        return [list(items)]
    return [[first] + rest for i, first in enumerate(items) for rest in _orderings(items[:i] + items[i + 1:])]

def commuting_permutations(f, n, d):
    x = np.random.default_rng(123).standard_normal((n, d))
    fx = f(x)
    keep = set()
    for order in _orderings(list(range(n))):
        gap = np.linalg.norm(f(x[order]) - fx[order]) / np.linalg.norm(fx)  # the page's relative gap
        if gap < 1e-6:
            keep.add(tuple(order))
    return keep
'''

CORRECT = {
    "softmax_logsumexp": {"softmax": STYLE_SOFTMAX_LOGSUMEXP},
    "softmax_moveaxis": {"softmax": STYLE_SOFTMAX_MOVEAXIS},
    "sdpa_einsum_additive_mask": {"scaled_dot_product_attention": STYLE_SDPA_EINSUM},
    "sdpa_large_negative_mask": {"scaled_dot_product_attention": STYLE_SDPA_MATMUL_LARGE_NEGATIVE},
    "sdpa_returns_list": {"scaled_dot_product_attention": STYLE_SDPA_LIST_RESULT},
    "sdpa_masked_max": {"scaled_dot_product_attention": STYLE_SDPA_MASKED_MAX},
    "sdpa_log_mask_warns": {"scaled_dot_product_attention": STYLE_SDPA_LOG_MASK},
    "mha_loop_over_heads": {"multi_head_attention": STYLE_MHA_LOOP,
                            "passes_attention_checks": STYLE_CHECKS_AGAINST_TORCH},
    "mha_einsum_weight_tensors": {"multi_head_attention": STYLE_MHA_EINSUM_WEIGHTS,
                                  "passes_attention_checks": STYLE_CHECKS_PROPERTIES},
    "mha_transpose_batch": {"multi_head_attention": STYLE_MHA_TRANSPOSE,
                            "softmax_jvp": STYLE_JVP_TWO_TERMS,
                            "commuting_permutations": STYLE_SYMMETRIES_PERMUTATION_MATRICES},
    "symmetries_recursive_frobenius": {"commuting_permutations": STYLE_SYMMETRIES_RECURSIVE_FROBENIUS},
    "written_from_the_release_alone": INDEPENDENT[ASSIGNMENT],
}

SDPA_CELLS = {"test_scaled_dot_product_attention", "test_sdpa_batched_and_masked", "test_sdpa_extreme_scores"}
MHA_CELLS = {"test_multi_head_attention", "test_mha_hidden"}
JVP_CELLS = {"test_softmax_jvp", "test_softmax_jvp_hidden"}
SYMMETRY_CELLS = {"test_commuting_permutations", "test_commuting_permutations_hidden"}

BUGGY = {
    # softmax_jvp builds on the student's softmax, so a softmax mistake costs it too.
    "softmax_ignores_axis": ({"softmax": SOFTMAX_IGNORES_AXIS},
                             {"test_softmax", "test_softmax_any_axis", "test_softmax_stable"} | JVP_CELLS),
    # The visible attention test's scores of 1e6 overflow it too.
    "softmax_unstable": ({"softmax": SOFTMAX_UNSTABLE},
                         {"test_softmax", "test_softmax_stable", "test_scaled_dot_product_attention",
                          "test_sdpa_extreme_scores"} | JVP_CELLS),
    "softmax_global_max": ({"softmax": SOFTMAX_GLOBAL_MAX},
                           {"test_softmax_stable", "test_sdpa_extreme_scores", "test_softmax_jvp_hidden"}),
    # Graded, the student's changes to its arguments never reach the test's arrays,
    # so the visible test passes there (run in the notebook, it fails).
    "softmax_modifies_input": ({"softmax": SOFTMAX_IN_PLACE}, {"test_softmax_any_axis", "test_softmax_jvp_hidden"}),
    # The answers that build on softmax then compute with PyTorch too.
    "softmax_with_torch": ({"softmax": SOFTMAX_WITH_TORCH},
                           {"test_softmax_any_axis", "test_softmax_stable", "test_sdpa_batched_and_masked",
                            "test_sdpa_extreme_scores", "test_softmax_jvp_hidden"}),
    "sdpa_copied_from_torch": ({"scaled_dot_product_attention": SDPA_WITH_TORCH},
                               {"test_sdpa_batched_and_masked", "test_sdpa_extreme_scores"}),
    # With huge scores the weights are one-hot with or without scaling, so the
    # extreme-score cell cannot tell; the others can.
    "sdpa_no_scaling": ({"scaled_dot_product_attention": SDPA_NO_SCALING},
                        SDPA_CELLS - {"test_sdpa_extreme_scores"} | MHA_CELLS),
    "sdpa_softmax_over_queries": ({"scaled_dot_product_attention": SDPA_SOFTMAX_OVER_QUERIES},
                                  SDPA_CELLS | MHA_CELLS),
    "sdpa_mask_after_softmax": ({"scaled_dot_product_attention": SDPA_MASK_AFTER_SOFTMAX},
                                {"test_scaled_dot_product_attention", "test_sdpa_batched_and_masked",
                                 "test_sdpa_extreme_scores"}),
    # Right on unit-scale masks; the visible test's mask on scores of -1e6 and +1e6, and the
    # extreme cell's masks on scores in the thousands and beyond, expose it.
    "sdpa_finite_mask": ({"scaled_dot_product_attention": SDPA_FINITE_MASK},
                         {"test_scaled_dot_product_attention", "test_sdpa_extreme_scores"}),
    "sdpa_additive_penalty": ({"scaled_dot_product_attention": SDPA_ADDITIVE_PENALTY},
                              {"test_scaled_dot_product_attention", "test_sdpa_extreme_scores"}),
    # The visible multi-head test compares one head with the student's own attention, so only the hidden one sees it.
    "sdpa_scales_by_d_v": ({"scaled_dot_product_attention": SDPA_SCALE_BY_D_V},
                           {"test_scaled_dot_product_attention", "test_sdpa_batched_and_masked", "test_mha_hidden"}),
    "sdpa_2d_only": ({"scaled_dot_product_attention": SDPA_2D_ONLY},
                     {"test_scaled_dot_product_attention", "test_sdpa_batched_and_masked",
                      "test_sdpa_extreme_scores"} | MHA_CELLS),
    "mha_heads_wrong_axis": ({"multi_head_attention": MHA_HEADS_WRONG_AXIS}, MHA_CELLS),
    "mha_interleaved_heads": ({"multi_head_attention": MHA_INTERLEAVED_HEADS}, MHA_CELLS),
    "mha_scales_by_d_v": ({"multi_head_attention": MHA_SCALES_BY_D_V}, MHA_CELLS),
    "mha_forgets_w_o": ({"multi_head_attention": MHA_FORGETS_W_O}, MHA_CELLS),
    "mha_unbatched_only": ({"multi_head_attention": MHA_UNBATCHED_ONLY}, MHA_CELLS),
    "mha_assumes_square_heads": ({"multi_head_attention": MHA_ASSUMES_SQUARE_HEADS}, MHA_CELLS),
    # The visible tests' heads are too few to expose it; the hidden ones do.
    "mha_value_width_for_keys": ({"multi_head_attention": MHA_VALUE_WIDTH_FOR_KEYS}, {"test_mha_hidden"}),
    "jvp_forgets_outer_term": ({"softmax_jvp": JVP_FORGETS_OUTER_TERM}, JVP_CELLS),
    "jvp_last_axis_only": ({"softmax_jvp": JVP_LAST_AXIS_ONLY}, JVP_CELLS),
    "jvp_own_unstable_softmax": ({"softmax_jvp": JVP_OWN_UNSTABLE_SOFTMAX}, JVP_CELLS),
    "jvp_changes_u": ({"softmax_jvp": JVP_CHANGES_U}, {"test_softmax_jvp_hidden"}),
    "jvp_forms_jacobian": ({"softmax_jvp": JVP_FORMS_JACOBIAN}, {"test_softmax_jvp_hidden"}),
    "checks_only_row_sums": ({"passes_attention_checks": CHECKS_ONLY_ROW_SUMS},
                             {"test_passes_attention_checks", "test_attention_checks_catch_bugs"}),
    "checks_never_mask": ({"passes_attention_checks": CHECKS_NEVER_MASK},
                          {"test_passes_attention_checks", "test_attention_checks_catch_bugs"}),
    "checks_square_and_small": ({"passes_attention_checks": CHECKS_SQUARE_AND_SMALL},
                                {"test_passes_attention_checks", "test_attention_checks_catch_bugs"}),
    "checks_exact_equality": ({"passes_attention_checks": CHECKS_EXACT_EQUALITY},
                              {"test_passes_attention_checks", "test_attention_checks_accept_correct"}),
    # Each of these four the visible cell now catches too (a correct attention that needs a
    # boolean mask, one that raises, one with -1e4, PyTorch's zeros on a row with no key).
    "checks_float_mask": ({"passes_attention_checks": CHECKS_FLOAT_MASK},
                          {"test_passes_attention_checks", "test_attention_checks_accept_correct"}),
    "checks_let_errors_escape": ({"passes_attention_checks": CHECKS_LET_ERRORS_ESCAPE},
                                 {"test_passes_attention_checks", "test_attention_checks_catch_bugs"}),
    "checks_probe_empty_rows": ({"passes_attention_checks": CHECKS_PROBE_EMPTY_ROWS},
                                {"test_passes_attention_checks", "test_attention_checks_accept_correct"}),
    "checks_mask_on_small_scores": ({"passes_attention_checks": CHECKS_MASK_ON_SMALL_SCORES},
                                    {"test_passes_attention_checks", "test_attention_checks_catch_bugs"}),
    "checks_n_k_equal_to_d_k": ({"passes_attention_checks": CHECKS_KEYS_AS_WIDE_AS_THEY_ARE_LONG},
                                {"test_attention_checks_catch_bugs"}),
    # Answers by call number, in the order the hidden implementations used to come in: the
    # visible cell passes; the hidden ones mix correct and wrong implementations in an order
    # drawn from the submission, and need the plainest of each judged right.
    "checks_by_call_count": ({"passes_attention_checks": CHECKS_BY_CALL_COUNT},
                             {"test_attention_checks_accept_correct", "test_attention_checks_catch_bugs"}),
    "symmetries_invariance": ({"commuting_permutations": SYMMETRIES_INVARIANCE}, SYMMETRY_CELLS),
    "symmetries_inverse_permutation": ({"commuting_permutations": SYMMETRIES_INVERSE_PERMUTATION}, SYMMETRY_CELLS),
    "symmetries_only_swaps": ({"commuting_permutations": SYMMETRIES_ONLY_SWAPS}, SYMMETRY_CELLS),
    # Passes the visible cell (no fixed reordering there); the hidden cyclic shift exposes it.
    "symmetries_same_rows_any_order": ({"commuting_permutations": SYMMETRIES_SAME_ROWS_ANY_ORDER},
                                       {"test_commuting_permutations_hidden"}),
    # Right for outputs of ordinary size; wrong at 1e12 (rounding exceeds the fixed tolerance)
    # or at 1e-12 (np.allclose's atol=1e-8 accepts every reordering).
    "symmetries_absolute_tolerance": ({"commuting_permutations": SYMMETRIES_ABSOLUTE_TOLERANCE},
                                      {"test_commuting_permutations_hidden"}),
    "symmetries_allclose_defaults": ({"commuting_permutations": SYMMETRIES_ALLCLOSE_DEFAULTS},
                                     {"test_commuting_permutations_hidden"}),
}


# Planted cases a check also puts in the integrity report, with the reason it gives: PyTorch
# reached for by a graded call in the process without PyTorch, where NumPy is graded.
FLAGGED = {case: {"sandbox: uses PyTorch where the answer is graded as NumPy code"}
           for case in ("softmax_with_torch", "sdpa_copied_from_torch")}
