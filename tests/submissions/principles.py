"""Planted submissions for ch1_principles.

Each case replaces some solution cells (keyed by grade_id) of an otherwise
correct submission. `loses` names the test cells that must score 0; every other
autograded cell must get full points."""

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
    *lead, n, d_model = x.shape
    d_head = d_model // num_heads
    # Bug: reshapes (n, d_model) straight to (num_heads, n, d_head), mixing tokens into heads.
    split = lambda t: t.reshape(*lead, num_heads, n, d_head)
    heads, _ = scaled_dot_product_attention(split(x @ w_q), split(x @ w_k), split(x @ w_v))
    return heads.reshape(*lead, n, d_model) @ w_o
'''

MHA_INTERLEAVED_HEADS = '''
def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):
    *lead, n, d_model = x.shape
    d_head = d_model // num_heads
    # Bug: head h takes every num_heads-th column instead of a contiguous block.
    split = lambda t: np.swapaxes(t.reshape(*lead, n, d_head, num_heads), -1, -3).swapaxes(-1, -2)
    heads, _ = scaled_dot_product_attention(split(x @ w_q), split(x @ w_k), split(x @ w_v))
    return np.concatenate([heads[..., h, :, :] for h in range(num_heads)], axis=-1) @ w_o
'''

MHA_SCALES_BY_D_MODEL = '''
def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):
    *lead, n, d_model = x.shape
    d_head = d_model // num_heads
    split = lambda t: np.swapaxes(t.reshape(*lead, n, num_heads, d_head), -2, -3)
    q, k, v = split(x @ w_q), split(x @ w_k), split(x @ w_v)
    # Bug: scales by the model width instead of the head width.
    weights = softmax(q @ np.swapaxes(k, -1, -2) / np.sqrt(d_model), axis=-1)
    return np.swapaxes(weights @ v, -2, -3).reshape(*lead, n, d_model) @ w_o
'''

MHA_FORGETS_W_O = '''
def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):
    *lead, n, d_model = x.shape
    d_head = d_model // num_heads
    split = lambda t: np.swapaxes(t.reshape(*lead, n, num_heads, d_head), -2, -3)
    heads, _ = scaled_dot_product_attention(split(x @ w_q), split(x @ w_k), split(x @ w_v))
    return np.swapaxes(heads, -2, -3).reshape(*lead, n, d_model)
'''

MHA_UNBATCHED_ONLY = '''
def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):
    n, d_model = x.shape
    d_head = d_model // num_heads
    outs = []
    for h in range(num_heads):
        cols = slice(h * d_head, (h + 1) * d_head)
        out, _ = scaled_dot_product_attention((x @ w_q)[:, cols], (x @ w_k)[:, cols], (x @ w_v)[:, cols])
        outs.append(out)
    return np.concatenate(outs, axis=-1) @ w_o
'''

VARIANCE_SCALED_BY_D_K = '''
def dot_product_variance(d_k, n_pairs, rng):
    q = rng.standard_normal((n_pairs, d_k))
    k = rng.standard_normal((n_pairs, d_k))
    scores = np.sum(q * k, axis=-1)
    return float(np.var(scores)), float(np.var(scores / d_k))
'''

VARIANCE_GLOBAL_RNG = '''
def dot_product_variance(d_k, n_pairs, rng):
    q = np.random.standard_normal((n_pairs, d_k))
    k = np.random.standard_normal((n_pairs, d_k))
    scores = np.sum(q * k, axis=-1)
    return float(np.var(scores)), float(np.var(scores / np.sqrt(d_k)))
'''

GAP_FORGETS_OUTPUT_PERMUTATION = '''
def equivariance_gap(f, x, perm):
    return float(np.max(np.abs(f(x[perm]) - f(x))))
'''

GAP_INVERSE_PERMUTATION = '''
def equivariance_gap(f, x, perm):
    inverse = np.argsort(perm)
    return float(np.max(np.abs(f(x[perm]) - f(x)[inverse])))
'''

GAP_MEAN_NOT_MAX = '''
def equivariance_gap(f, x, perm):
    return float(np.mean(np.abs(f(x[perm]) - f(x)[perm])))
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

STYLE_MHA_LOOP = '''
def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):
    unbatched = x.ndim == 2
    if unbatched:
        x = x[None]
    d_model = x.shape[-1]
    d_head = d_model // num_heads
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    outputs = []
    for h in range(num_heads):
        cols = slice(h * d_head, (h + 1) * d_head)
        head, _ = scaled_dot_product_attention(q[..., cols], k[..., cols], v[..., cols])
        outputs.append(head)
    out = np.concatenate(outputs, axis=-1) @ w_o
    return out[0] if unbatched else out
'''

STYLE_MHA_TRANSPOSE = '''
def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):
    shape = x.shape
    x3 = x.reshape(-1, shape[-2], shape[-1])
    b, n, d = x3.shape
    h, dh = num_heads, d // num_heads
    def heads(w):
        return (x3 @ w).reshape(b, n, h, dh).transpose(0, 2, 1, 3)
    out, _ = scaled_dot_product_attention(heads(w_q), heads(w_k), heads(w_v))
    out = out.transpose(0, 2, 1, 3).reshape(b, n, d) @ w_o
    return out.reshape(shape)
'''

STYLE_VARIANCE_NORMAL_LOOPLESS = '''
def dot_product_variance(d_k, n_pairs, rng):
    pairs = rng.normal(0.0, 1.0, size=(2, n_pairs, d_k))
    s = np.einsum("nd,nd->n", pairs[0], pairs[1])
    return s.var(ddof=1).item(), (s / np.sqrt(d_k)).var(ddof=1).item()
'''

STYLE_GAP_PERMUTATION_MATRIX = '''
def equivariance_gap(f, x, perm):
    P = np.eye(len(perm))[perm]
    return np.abs(f(P @ x) - P @ f(x)).max()
'''

CORRECT = {
    "softmax_logsumexp": {"softmax": STYLE_SOFTMAX_LOGSUMEXP},
    "softmax_moveaxis": {"softmax": STYLE_SOFTMAX_MOVEAXIS},
    "sdpa_einsum_additive_mask": {"scaled_dot_product_attention": STYLE_SDPA_EINSUM},
    "sdpa_large_negative_mask": {"scaled_dot_product_attention": STYLE_SDPA_MATMUL_LARGE_NEGATIVE},
    "sdpa_returns_list": {"scaled_dot_product_attention": STYLE_SDPA_LIST_RESULT},
    "sdpa_log_mask_warns": {"scaled_dot_product_attention": STYLE_SDPA_LOG_MASK},
    "mha_loop_over_heads": {"multi_head_attention": STYLE_MHA_LOOP},
    "mha_transpose_batch": {"multi_head_attention": STYLE_MHA_TRANSPOSE,
                            "dot_product_variance": STYLE_VARIANCE_NORMAL_LOOPLESS,
                            "equivariance_gap": STYLE_GAP_PERMUTATION_MATRIX},
}

SDPA_CELLS = {"test_scaled_dot_product_attention", "test_sdpa_batched_and_masked", "test_sdpa_extreme_scores"}
MHA_CELLS = {"test_multi_head_attention", "test_mha_hidden"}

BUGGY = {
    "softmax_ignores_axis": ({"softmax": SOFTMAX_IGNORES_AXIS},
                             {"test_softmax", "test_softmax_any_axis", "test_softmax_stable"}),
    "softmax_unstable": ({"softmax": SOFTMAX_UNSTABLE}, {"test_softmax_stable", "test_sdpa_extreme_scores"}),
    "softmax_global_max": ({"softmax": SOFTMAX_GLOBAL_MAX}, {"test_softmax_stable", "test_sdpa_extreme_scores"}),
    "softmax_modifies_input": ({"softmax": SOFTMAX_IN_PLACE}, {"test_softmax_any_axis"}),
    # With huge scores the weights are one-hot with or without scaling, so the
    # extreme-score cell cannot tell; the others can.
    "sdpa_no_scaling": ({"scaled_dot_product_attention": SDPA_NO_SCALING},
                        SDPA_CELLS - {"test_sdpa_extreme_scores"} | MHA_CELLS),
    "sdpa_softmax_over_queries": ({"scaled_dot_product_attention": SDPA_SOFTMAX_OVER_QUERIES},
                                  SDPA_CELLS | MHA_CELLS),
    "sdpa_mask_after_softmax": ({"scaled_dot_product_attention": SDPA_MASK_AFTER_SOFTMAX},
                                {"test_scaled_dot_product_attention", "test_sdpa_batched_and_masked"}),
    "sdpa_scales_by_d_v": ({"scaled_dot_product_attention": SDPA_SCALE_BY_D_V},
                           {"test_scaled_dot_product_attention", "test_sdpa_batched_and_masked"}),
    "sdpa_2d_only": ({"scaled_dot_product_attention": SDPA_2D_ONLY},
                     {"test_scaled_dot_product_attention", "test_sdpa_batched_and_masked",
                      "test_sdpa_extreme_scores"} | MHA_CELLS),
    "mha_heads_wrong_axis": ({"multi_head_attention": MHA_HEADS_WRONG_AXIS}, MHA_CELLS),
    "mha_interleaved_heads": ({"multi_head_attention": MHA_INTERLEAVED_HEADS}, MHA_CELLS),
    "mha_scales_by_d_model": ({"multi_head_attention": MHA_SCALES_BY_D_MODEL}, MHA_CELLS),
    "mha_forgets_w_o": ({"multi_head_attention": MHA_FORGETS_W_O}, MHA_CELLS),
    "mha_unbatched_only": ({"multi_head_attention": MHA_UNBATCHED_ONLY}, MHA_CELLS),
    "variance_scaled_by_d_k": ({"dot_product_variance": VARIANCE_SCALED_BY_D_K},
                               {"test_dot_product_variance", "test_dot_product_variance_hidden"}),
    "variance_ignores_rng": ({"dot_product_variance": VARIANCE_GLOBAL_RNG}, {"test_dot_product_variance_hidden"}),
    "gap_forgets_output_permutation": ({"equivariance_gap": GAP_FORGETS_OUTPUT_PERMUTATION},
                                       {"test_equivariance_gap", "test_equivariance_gap_hidden"}),
    "gap_inverse_permutation": ({"equivariance_gap": GAP_INVERSE_PERMUTATION},
                                {"test_equivariance_gap", "test_equivariance_gap_hidden"}),
    "gap_mean_not_max": ({"equivariance_gap": GAP_MEAN_NOT_MAX}, {"test_equivariance_gap_hidden"}),
}
