"""Planted submissions for ch3_complexity.

Each case replaces some solution cells (keyed by grade_id) of an otherwise
correct submission. `loses` names the test cells that must score 0; every other
autograded cell must get full points."""

ASSIGNMENT = "ch3_complexity"
NOTEBOOK = "complexity.ipynb"

# --- counting -------------------------------------------------------------------

FLOPS_NO_OUTPUT_PROJECTION = '''
def attention_flops(n, d):
    return 3 * 2 * n * d * d + 2 * 2 * n * n * d  # Bug: W_O forgotten
'''

FLOPS_MULTIPLIES_ONLY = '''
def attention_flops(n, d):
    return 4 * n * d * d + 2 * n * n * d  # Bug: a*b*c per product, not 2*a*b*c
'''

FLOPS_FLOAT = '''
def attention_flops(n, d):
    return 8.0 * n * d ** 2 + 4.0 * n ** 2 * d  # Bug: a float, inexact for large sizes
'''

BYTES_ONE_HEAD = '''
def attention_activation_bytes(n, d, h, bytes_per_element):
    return bytes_per_element * (4 * n * d + n * n)  # Bug: one score matrix whatever h is
'''

CHUNK_CEIL = '''
def max_chunk_length(budget_bytes, d, h, bytes_per_element):
    if bytes_per_element * (4 * d + h) > budget_bytes:
        raise ValueError("not even one token fits")
    root = (-4 * d + math.sqrt(16 * d * d + 4 * h * budget_bytes / bytes_per_element)) / (2 * h)
    return math.ceil(root)  # Bug: rounds up past the budget
'''

CHUNK_FLOAT = '''
def max_chunk_length(budget_bytes, d, h, bytes_per_element):
    if bytes_per_element * (4 * d + h) > budget_bytes:
        raise ValueError("not even one token fits")
    # Bug: float square root; right for small budgets, off at the boundary of huge ones.
    return int((-4 * d + math.sqrt(16 * d * d + 4 * h * budget_bytes / bytes_per_element)) // (2 * h))
'''

CHUNK_ZERO_INSTEAD_OF_ERROR = '''
def max_chunk_length(budget_bytes, d, h, bytes_per_element):
    cap = budget_bytes // bytes_per_element
    c = (math.isqrt(16 * d * d + 4 * h * cap) - 4 * d) // (2 * h)
    while 4 * (c + 1) * d + h * (c + 1) ** 2 <= cap:
        c += 1
    return c  # Bug: 0 when nothing fits, instead of a ValueError
'''

RECEPTIVE_T_TIMES_W = '''
def receptive_field(num_layers, kernel_width):
    return num_layers * kernel_width
'''

RECEPTIVE_ONE_PLUS_T_TIMES_W = '''
def receptive_field(num_layers, kernel_width):
    return 1 + num_layers * kernel_width
'''

# --- local attention --------------------------------------------------------------

LOCAL_STRICT_WINDOW = '''
def local_attention(q, k, v, window):
    n, d_k = q.shape
    out = np.zeros((n, v.shape[1]))
    for i in range(n):
        start, stop = max(0, i - window + 1), min(n, i + window)  # Bug: |i - j| < window
        if stop <= start:
            start, stop = i, i + 1
        out[i] = softmax(k[start:stop] @ q[i] / np.sqrt(d_k)) @ v[start:stop]
    return out
'''

LOCAL_CAUSAL_WINDOW = '''
def local_attention(q, k, v, window):
    n, d_k = q.shape
    out = np.zeros((n, v.shape[1]))
    for i in range(n):
        start = max(0, i - window)  # Bug: only the keys before i, not those after
        out[i] = softmax(k[start:i + 1] @ q[i] / np.sqrt(d_k)) @ v[start:i + 1]
    return out
'''

LOCAL_UNSTABLE = '''
def local_attention(q, k, v, window):
    n, d_k = q.shape
    out = np.zeros((n, v.shape[1]))
    for i in range(n):
        lo, hi = max(0, i - window), min(n, i + window + 1)
        e = np.exp(k[lo:hi] @ q[i] / np.sqrt(d_k))
        out[i] = e @ v[lo:hi] / e.sum()
    return out
'''

LOCAL_FULL_SCORES = '''
def local_attention(q, k, v, window):
    n = q.shape[0]
    scores = q @ k.T / np.sqrt(q.shape[1])  # Bug: the whole n x n score matrix
    band = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :]) <= window
    return softmax(np.where(band, scores, -np.inf)) @ v
'''

LOCAL_BOOL_MASK = '''
def local_attention(q, k, v, window):
    n, d_k = q.shape
    idx = np.arange(n)
    band = np.abs(idx[:, None] - idx[None, :]) <= window  # Bug: an n x n boolean mask
    out = np.zeros((n, v.shape[1]))
    for i in range(n):
        keys = np.flatnonzero(band[i])
        out[i] = softmax(k[keys] @ q[i] / np.sqrt(d_k)) @ v[keys]
    return out
'''

# --- linear attention -------------------------------------------------------------

LINEAR_KERNEL_MATRIX = '''
def linear_attention(q, k, v):
    phi = lambda x: np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
    kernel = phi(q) @ phi(k).T  # Bug: the n x n kernel matrix
    return kernel @ v / kernel.sum(axis=1, keepdims=True)
'''

LINEAR_RELU = '''
def linear_attention(q, k, v):
    phi = lambda x: np.maximum(x, 0.0) + 1.0  # Bug: relu(x) + 1, not elu(x) + 1
    fq, fk = phi(q), phi(k)
    return fq @ (fk.T @ v) / (fq @ fk.sum(axis=0))[:, None]
'''

LINEAR_ELU_ONLY = '''
def linear_attention(q, k, v):
    phi = lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0)))  # Bug: elu(x), no + 1
    fq, fk = phi(q), phi(k)
    return fq @ (fk.T @ v) / (fq @ fk.sum(axis=0))[:, None]
'''

LINEAR_NO_NORMALISER = '''
def linear_attention(q, k, v):
    phi = lambda x: np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
    return phi(q) @ (phi(k).T @ v)  # Bug: the denominator is missing
'''

LINEAR_SCALED = '''
def linear_attention(q, k, v):
    phi = lambda x: np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
    fq, fk = phi(q / np.sqrt(q.shape[1])), phi(k)  # Bug: a 1/sqrt(d_k) that is not in the formula
    return fq @ (fk.T @ v) / (fq @ fk.sum(axis=0))[:, None]
'''

LINEAR_TORCH_KERNEL_MATRIX = '''
def linear_attention(q, k, v):
    fq, fk = (F.elu(torch.from_numpy(a)) + 1 for a in (q, k))
    kernel = fq @ fk.T  # Bug: the n x n kernel matrix, as a PyTorch tensor
    return (kernel @ torch.from_numpy(v) / kernel.sum(dim=1, keepdim=True)).numpy()
'''

# --- correct answers in other styles: full marks -------------------------------------

STYLE_FLOPS_FACTORED = '''
def attention_flops(n, d):
    return 2 * n * d * (4 * d + 2 * n)
'''

STYLE_BYTES_SUM = '''
def attention_activation_bytes(n, d, h, bytes_per_element):
    qkvo = 4 * n * d * bytes_per_element
    scores = h * n ** 2 * bytes_per_element
    return qkvo + scores
'''

STYLE_CHUNK_BINARY_SEARCH = '''
def max_chunk_length(budget_bytes, d, h, bytes_per_element):
    need = lambda c: bytes_per_element * (4 * c * d + h * c * c)
    if need(1) > budget_bytes:
        raise ValueError(f"budget {budget_bytes} is smaller than one token ({need(1)} bytes)")
    lo, hi = 1, 2
    while need(hi) <= budget_bytes:
        hi *= 2
    while hi - lo > 1:  # need(lo) fits, need(hi) does not
        mid = (lo + hi) // 2
        if need(mid) <= budget_bytes:
            lo = mid
        else:
            hi = mid
    return lo
'''

STYLE_CHUNK_FLOAT_THEN_FIX = '''
def max_chunk_length(budget_bytes, d, h, bytes_per_element):
    fits = lambda c: bytes_per_element * (4 * c * d + h * c * c) <= budget_bytes
    if not fits(1):
        raise ValueError("the budget does not fit a single token")
    c = max(1, int((math.sqrt(16 * d * d + 4 * h * budget_bytes / bytes_per_element) - 4 * d) / (2 * h)))
    while fits(c + 1):
        c += 1
    while not fits(c):
        c -= 1
    return c
'''

STYLE_RECEPTIVE_SUM = '''
def receptive_field(num_layers, kernel_width):
    seen = 1
    for _ in range(num_layers):
        seen += kernel_width - 1
    return seen
'''

STYLE_LOCAL_SLIDING_WINDOW_VIEW = '''
from numpy.lib.stride_tricks import sliding_window_view

def local_attention(q, k, v, window):
    n, d_k = q.shape
    w = min(window, n)
    pad = lambda a: np.pad(a, ((w, w), (0, 0)))
    k_win = sliding_window_view(pad(k), 2 * w + 1, axis=0)  # (n, d_k, 2w+1), a view
    v_win = sliding_window_view(pad(v), 2 * w + 1, axis=0)
    scores = np.einsum("nd,ndw->nw", q, k_win) / np.sqrt(d_k)
    offsets = np.arange(-w, w + 1)
    inside = (np.arange(n)[:, None] + offsets >= 0) & (np.arange(n)[:, None] + offsets < n)
    weights = softmax(np.where(inside, scores, -np.inf), axis=-1)
    return np.einsum("nw,ndw->nd", weights, v_win)
'''

STYLE_LOCAL_BLOCKS = '''
def local_attention(q, k, v, window, block=64):
    n = len(q)
    out = np.empty((n, v.shape[-1]))
    for s in range(0, n, block):
        e = min(n, s + block)
        lo, hi = max(0, s - window), min(n, e + window)
        scores = q[s:e] @ k[lo:hi].T / np.sqrt(q.shape[-1])
        rows, cols = np.arange(s, e)[:, None], np.arange(lo, hi)[None, :]
        scores = np.where(np.abs(rows - cols) <= window, scores, -np.inf)
        out[s:e] = softmax(scores) @ v[lo:hi]
    return out
'''

STYLE_LINEAR_EINSUM_WARNS = '''
def linear_attention(q, k, v):
    fq = np.where(q > 0, q + 1, np.exp(q))  # exp overflows for large q (numpy warns); where picks q + 1
    fk = np.where(k > 0, k + 1, np.exp(k))
    kv = np.einsum("nd,ne->de", fk, v)
    z = np.einsum("nd,d->n", fq, fk.sum(0))
    return np.einsum("nd,de->ne", fq, kv) / z[:, None]
'''

STYLE_LINEAR_TORCH = '''
def linear_attention(q, k, v):
    fq, fk = (F.elu(torch.from_numpy(a)) + 1 for a in (q, k))
    out = (fq @ (fk.T @ torch.from_numpy(v))) / (fq @ fk.sum(0)).unsqueeze(-1)
    return out.numpy()
'''

CORRECT = {
    "counts_factored_chunk_binary_search": {"attention_flops": STYLE_FLOPS_FACTORED,
                                            "attention_activation_bytes": STYLE_BYTES_SUM,
                                            "max_chunk_length": STYLE_CHUNK_BINARY_SEARCH,
                                            "receptive_field": STYLE_RECEPTIVE_SUM},
    "chunk_float_guess_then_fix": {"max_chunk_length": STYLE_CHUNK_FLOAT_THEN_FIX},
    "local_sliding_window_view": {"local_attention": STYLE_LOCAL_SLIDING_WINDOW_VIEW},
    "local_blocks_linear_einsum": {"local_attention": STYLE_LOCAL_BLOCKS, "linear_attention": STYLE_LINEAR_EINSUM_WARNS},
    "linear_torch": {"linear_attention": STYLE_LINEAR_TORCH},
}

FLOPS_CELLS = {"test_attention_flops", "test_attention_flops_hidden"}
CHUNK_CELLS = {"test_max_chunk_length", "test_chunk_small", "test_chunk_huge", "test_chunk_too_small"}
RECEPTIVE_CELLS = {"test_receptive_field", "test_receptive_field_hidden"}
LOCAL_CELLS = {"test_local_attention", "test_local_output", "test_local_extreme", "test_local_memory"}
LINEAR_CELLS = {"test_linear_attention", "test_linear_output", "test_linear_extreme", "test_linear_memory"}

BUGGY = {
    "flops_forgets_output_projection": ({"attention_flops": FLOPS_NO_OUTPUT_PROJECTION}, FLOPS_CELLS),
    "flops_counts_multiplies_only": ({"attention_flops": FLOPS_MULTIPLIES_ONLY}, FLOPS_CELLS),
    "flops_returns_float": ({"attention_flops": FLOPS_FLOAT}, FLOPS_CELLS),
    "bytes_one_head": ({"attention_activation_bytes": BYTES_ONE_HEAD},
                       {"test_attention_activation_bytes", "test_attention_activation_bytes_hidden"}),
    "chunk_rounds_up": ({"max_chunk_length": CHUNK_CEIL}, CHUNK_CELLS - {"test_chunk_too_small"}),
    "chunk_float_sqrt": ({"max_chunk_length": CHUNK_FLOAT}, {"test_chunk_huge"}),
    "chunk_zero_instead_of_error": ({"max_chunk_length": CHUNK_ZERO_INSTEAD_OF_ERROR},
                                    {"test_max_chunk_length", "test_chunk_too_small"}),
    "receptive_t_times_w": ({"receptive_field": RECEPTIVE_T_TIMES_W}, RECEPTIVE_CELLS),
    "receptive_one_plus_t_times_w": ({"receptive_field": RECEPTIVE_ONE_PLUS_T_TIMES_W}, RECEPTIVE_CELLS),
    "local_strict_window": ({"local_attention": LOCAL_STRICT_WINDOW}, LOCAL_CELLS),
    "local_causal_window": ({"local_attention": LOCAL_CAUSAL_WINDOW}, LOCAL_CELLS),
    "local_unstable_softmax": ({"local_attention": LOCAL_UNSTABLE}, {"test_local_extreme"}),
    # Right numbers, quadratic memory: the visible test measures memory too.
    "local_full_score_matrix": ({"local_attention": LOCAL_FULL_SCORES}, {"test_local_attention", "test_local_memory"}),
    "local_boolean_band_mask": ({"local_attention": LOCAL_BOOL_MASK}, {"test_local_attention", "test_local_memory"}),
    "linear_kernel_matrix": ({"linear_attention": LINEAR_KERNEL_MATRIX}, {"test_linear_attention", "test_linear_memory"}),
    # tracemalloc cannot see PyTorch's buffers, so the visible test misses it; the grader does not.
    "linear_torch_kernel_matrix": ({"linear_attention": LINEAR_TORCH_KERNEL_MATRIX}, {"test_linear_memory"}),
    "linear_relu_features": ({"linear_attention": LINEAR_RELU}, LINEAR_CELLS),
    "linear_elu_without_plus_one": ({"linear_attention": LINEAR_ELU_ONLY}, LINEAR_CELLS),
    "linear_no_normaliser": ({"linear_attention": LINEAR_NO_NORMALISER}, LINEAR_CELLS),
    "linear_extra_scaling": ({"linear_attention": LINEAR_SCALED}, LINEAR_CELLS),
}
