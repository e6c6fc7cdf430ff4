"""Planted submissions for ch2_variants.

Each case replaces some solution cells (keyed by grade_id) of an otherwise
correct submission. `loses` names the test cells that must score 0; every other
autograded cell must get full points."""

from tests.submissions.independent import CELLS as INDEPENDENT

ASSIGNMENT = "ch2_variants"
NOTEBOOK = "variants.ipynb"

# --- rotary embeddings ------------------------------------------------------------


def _rope(angle="pos * 10000.0 ** (-2 * np.arange(h) / r)", turn=None, check="r % 2 or r > d",
          position="np.clip(np.arange(n) - (n - np.asarray(lengths))[:, None], 0, None)", rotated="r"):
    """A rotary_half_split for a left-padded batch with one deliberate change."""
    turn = turn or ("a, b = x[..., :h], x[..., h:r]\n"
                    "    out[..., :h], out[..., h:r] = a * np.cos(angle) - b * np.sin(angle), a * np.sin(angle) + b * np.cos(angle)")
    return f'''
def rotary_half_split(x, lengths, rotary_dim=None):
    n, d = x.shape[-2:]
    r = d if rotary_dim is None else rotary_dim
    if {check}:
        raise ValueError("rotary_dim must be even and at most the width")
    r = {rotated}
    h = r // 2
    pos = ({position})[:, None, :, None]
    angle = {angle}
    out = np.array(x, dtype=np.float64)
    {turn}
    return out
'''


# Bug: the chapter's layout, pairs (2i, 2i+1), instead of (i, i + r/2).
ROPE_INTERLEAVED = _rope(turn="a, b = x[..., 0:r:2], x[..., 1:r:2]\n"
                              "    out[..., 0:r:2], out[..., 1:r:2] = a * np.cos(angle) - b * np.sin(angle), a * np.sin(angle) + b * np.cos(angle)")
# Bug: a sign slip, so the map is no longer a rotation.
ROPE_NOT_A_ROTATION = _rope(turn="a, b = x[..., :h], x[..., h:r]\n"
                                 "    out[..., :h], out[..., h:r] = a * np.cos(angle) - b * np.sin(angle), b * np.cos(angle) - a * np.sin(angle)")
# Bug: i / r, not 2i / r.
ROPE_EXPONENT_HALVED = _rope(angle="pos * 10000.0 ** (-np.arange(h) / r)")
# Bug: the frequencies from the whole width d, not from the rotated width r.
ROPE_FREQUENCIES_FROM_D = _rope(angle="pos * 10000.0 ** (-2 * np.arange(h) / d)")
# Bug: every coordinate rotated, whatever rotary_dim says.
ROPE_ROTATES_EVERYTHING = _rope(rotated="d")
# Bug: positions counted from the first row, padding included (the scores between real
# tokens stay the same, since only their offsets count; their values do not).
ROPE_POSITIONS_FROM_ROW_0 = _rope(position="np.broadcast_to(np.arange(n), (len(lengths), n))")
# Bug: rotary_dim=0 read as "the whole width" (`rotary_dim or d`), though the prompt says it rotates nothing.
ROPE_ZERO_MEANS_WHOLE_WIDTH = _rope().replace("r = d if rotary_dim is None else rotary_dim", "r = rotary_dim or d")
# Bug: no ValueError for an odd rotary_dim or one wider than the row.
ROPE_NO_CHECK = _rope(check="False")

# --- left padding and causality ----------------------------------------------------

_SAFE_SOFTMAX = '''
def _masked_rows(scores, keep):
    scores = np.where(keep, scores, -np.inf)
    top = np.max(scores, axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total > 0, total, 1.0)
'''

PADDED_ON_THE_RIGHT = _SAFE_SOFTMAX + '''
def left_padded_causal_attention(q, k, v, lengths):
    n = q.shape[1]
    idx = np.arange(n)
    keep = (idx[None, None, :] <= idx[None, :, None]) & (idx[None, None, :] < np.asarray(lengths)[:, None, None])
    return _masked_rows(q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[2]), keep) @ v  # Bug: real keys first
'''

PADDED_NAN_ROWS = '''
def left_padded_causal_attention(q, k, v, lengths):
    n = q.shape[1]
    idx = np.arange(n)
    keep = (idx[None, None, :] <= idx[None, :, None]) & (idx[None, None, :] >= n - np.asarray(lengths)[:, None, None])
    scores = np.where(keep, q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[2]), -np.inf)
    return softmax(scores) @ v  # Bug: a row with no key gives 0/0 = nan
'''

PADDED_LOSES_DIAGONAL = _SAFE_SOFTMAX + '''
def left_padded_causal_attention(q, k, v, lengths):
    n = q.shape[1]
    idx = np.arange(n)
    keep = (idx[None, None, :] < idx[None, :, None]) & (idx[None, None, :] >= n - np.asarray(lengths)[:, None, None])
    return _masked_rows(q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[2]), keep) @ v  # Bug: j < i
'''

PADDED_MASK_AFTER_SOFTMAX = '''
def left_padded_causal_attention(q, k, v, lengths):
    n = q.shape[1]
    idx = np.arange(n)
    causal = idx[None, None, :] <= idx[None, :, None]
    real = idx[None, None, :] >= n - np.asarray(lengths)[:, None, None]
    weights = softmax(np.where(causal, q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[2]), -np.inf))
    return (weights * real) @ v  # Bug: padding removed after the softmax, rows no longer sum to 1
'''

PADDED_ADDITIVE_PENALTY = '''
def left_padded_causal_attention(q, k, v, lengths):
    n = q.shape[1]
    idx = np.arange(n)
    keep = (idx[None, None, :] <= idx[None, :, None]) & (idx[None, None, :] >= n - np.asarray(lengths)[:, None, None])
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[2]) - 1e9 * ~keep  # Bug: huge padding outweighs -1e9
    has_key = keep.any(axis=-1, keepdims=True)
    return np.where(has_key, softmax(scores), 0.0) @ v
'''

PADDED_MAX_OVER_ALL_KEYS = '''
def left_padded_causal_attention(q, k, v, lengths):
    n = q.shape[1]
    idx = np.arange(n)
    keep = (idx[None, None, :] <= idx[None, :, None]) & (idx[None, None, :] >= n - np.asarray(lengths)[:, None, None])
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[2])
    scores = scores - scores.max(axis=-1, keepdims=True)  # Bug: the maximum over padding keys too
    e = np.where(keep, np.exp(scores), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total > 0, total, 1.0) @ v
'''

# --- grouped-query KV cache ---------------------------------------------------------

STEP_INTERLEAVED_GROUPS = '''
def decode_step(x_t, cache_k, cache_v, w_q, w_k, w_v, n_heads):
    d = w_q.shape[1] // n_heads
    g = w_k.shape[1] // d
    keys = np.concatenate([cache_k, (x_t @ w_k).reshape(g, 1, d)], axis=1)
    values = np.concatenate([cache_v, (x_t @ w_v).reshape(g, 1, d)], axis=1)
    kv = np.arange(n_heads) % g  # Bug: heads 0, g, 2g, ... share a KV head instead of consecutive heads
    q = (x_t @ w_q).reshape(n_heads, 1, d)
    weights = softmax(q @ keys[kv].transpose(0, 2, 1) / np.sqrt(d))
    return (weights @ values[kv]).reshape(-1), keys, values
'''

STEP_PREPENDS = '''
def decode_step(x_t, cache_k, cache_v, w_q, w_k, w_v, n_heads):
    d = w_q.shape[1] // n_heads
    g = w_k.shape[1] // d
    # Bug: the new row goes first, so the cache is stored newest-first.
    keys = np.concatenate([(x_t @ w_k).reshape(g, 1, d), cache_k], axis=1)
    values = np.concatenate([(x_t @ w_v).reshape(g, 1, d), cache_v], axis=1)
    kv = np.arange(n_heads) // (n_heads // g)
    q = (x_t @ w_q).reshape(n_heads, 1, d)
    weights = softmax(q @ keys[kv].transpose(0, 2, 1) / np.sqrt(d))
    return (weights @ values[kv]).reshape(-1), keys, values
'''

DECODE_RECOMPUTES = '''
def decode_with_kv_cache(x, w_q, w_k, w_v, n_heads, prompt_length):
    # Right numbers, but no cache: everything is prefilled, whatever the prompt's length.
    n, d = len(x), w_q.shape[1] // n_heads
    g = w_k.shape[1] // d
    q = (x @ w_q).reshape(n, n_heads, d).transpose(1, 0, 2)
    k, v = (np.repeat((x @ w).reshape(n, g, d).transpose(1, 0, 2), n_heads // g, axis=0) for w in (w_k, w_v))
    scores = np.where(np.tri(n, dtype=bool), q @ k.transpose(0, 2, 1) / np.sqrt(d), -np.inf)
    return (softmax(scores) @ v).transpose(1, 0, 2).reshape(n, -1)
'''

DECODE_FAKES_ITS_CALLS = '''
def decode_with_kv_cache(x, w_q, w_k, w_v, n_heads, prompt_length):
    # Calls decode_step with caches of the right shapes but no keys in them, then
    # computes the answer all at once: the shapes of the calls alone look right.
    n, d = len(x), w_q.shape[1] // n_heads
    g = w_k.shape[1] // d
    for t in range(prompt_length, n):
        decode_step(x[t], np.zeros((g, t, d)), np.zeros((g, t, d)), w_q, w_k, w_v, n_heads)
    q = (x @ w_q).reshape(n, n_heads, d).transpose(1, 0, 2)
    k, v = (np.repeat((x @ w).reshape(n, g, d).transpose(1, 0, 2), n_heads // g, axis=0) for w in (w_k, w_v))
    scores = np.where(np.tri(n, dtype=bool), q @ k.transpose(0, 2, 1) / np.sqrt(d), -np.inf)
    return (softmax(scores) @ v).transpose(1, 0, 2).reshape(n, -1)
'''

PREFILL_NOT_CAUSAL = '''
def decode_with_kv_cache(x, w_q, w_k, w_v, n_heads, prompt_length):
    p, d = prompt_length, w_q.shape[1] // n_heads
    g = w_k.shape[1] // d
    k_cache, v_cache = ((x[:p] @ w).reshape(p, g, d).transpose(1, 0, 2) for w in (w_k, w_v))
    rows = []
    if p:
        q = (x[:p] @ w_q).reshape(p, n_heads, d).transpose(1, 0, 2)
        k, v = (np.repeat(c, n_heads // g, axis=0) for c in (k_cache, v_cache))
        weights = softmax(q @ k.transpose(0, 2, 1) / np.sqrt(d))  # Bug: every prompt token sees the whole prompt
        rows += list((weights @ v).transpose(1, 0, 2).reshape(p, -1))
    for t in range(p, len(x)):
        row, k_cache, v_cache = decode_step(x[t], k_cache, v_cache, w_q, w_k, w_v, n_heads)
        rows.append(row)
    return np.array(rows)
'''

DECODE_REBUILDS_CACHES = '''
def decode_with_kv_cache(x, w_q, w_k, w_v, n_heads, prompt_length):
    # Right numbers, but the caches are rebuilt from x at every step instead of passed on.
    p, d = prompt_length, w_q.shape[1] // n_heads
    g = w_k.shape[1] // d
    def caches(t):
        return ((x[:t] @ w).reshape(t, g, d).transpose(1, 0, 2) for w in (w_k, w_v))
    rows = []
    for s in range(p):  # the prompt: each token against the rows up to it
        k, v = caches(s + 1)
        q = (x[s] @ w_q).reshape(g, n_heads // g, 1, d)
        weights = softmax(q @ k[:, None].transpose(0, 1, 3, 2) / np.sqrt(d))
        rows.append((weights @ v[:, None]).reshape(-1))
    for t in range(p, len(x)):
        row, _, _ = decode_step(x[t], *caches(t), w_q, w_k, w_v, n_heads)
        rows.append(row)
    return np.array(rows)
'''

PREFILL_BY_DECODING = '''
def decode_with_kv_cache(x, w_q, w_k, w_v, n_heads, prompt_length):
    # Right numbers, but the prompt goes through decode_step token by token: no prefill.
    d = w_q.shape[1] // n_heads
    k_cache = v_cache = np.zeros((w_k.shape[1] // d, 0, d))
    rows = []
    for token in x:
        row, k_cache, v_cache = decode_step(token, k_cache, v_cache, w_q, w_k, w_v, n_heads)
        rows.append(row)
    return np.array(rows)
'''

PREFILL_HEADS_INTERLEAVED = '''
def decode_with_kv_cache(x, w_q, w_k, w_v, n_heads, prompt_length):
    p, d = prompt_length, w_q.shape[1] // n_heads
    g = w_k.shape[1] // d
    # Bug: the cache's heads are cut from the wrong axis (d_head entries are not contiguous).
    k_cache, v_cache = ((x[:p] @ w).reshape(p, d, g).transpose(2, 0, 1) for w in (w_k, w_v))
    rows = []
    for t in range(p):
        q = (x[t] @ w_q).reshape(n_heads, 1, d)
        kv = np.arange(n_heads) // (n_heads // g)
        weights = softmax(q @ k_cache[kv, :t + 1].transpose(0, 2, 1) / np.sqrt(d))
        rows.append((weights @ v_cache[kv, :t + 1]).reshape(-1))
    for t in range(p, len(x)):
        row, k_cache, v_cache = decode_step(x[t], k_cache, v_cache, w_q, w_k, w_v, n_heads)
        rows.append(row)
    return np.array(rows)
'''

# --- entropy against temperature -------------------------------------------------------

SLOPE_WRONG_POWER = '''
def entropy_temperature_slope(scores, tau):
    keep = np.isfinite(scores)
    s = np.where(keep, scores, 0.0)
    p = np.where(keep, softmax(scores / tau), 0.0)
    centred = s - (p * s).sum(-1, keepdims=True)
    return (p * centred ** 2).sum(-1) / tau ** 2  # Bug: one factor of tau lost in the chain rule
'''

SLOPE_NAN_ON_MASKED = '''
def entropy_temperature_slope(scores, tau):
    p = softmax(scores / tau)
    mean = (p * scores).sum(-1, keepdims=True)  # Bug: 0 * (-inf) = nan on masked keys
    return (p * (scores - mean) ** 2).sum(-1) / tau ** 3
'''

SLOPE_UNWEIGHTED_VARIANCE = '''
def entropy_temperature_slope(scores, tau):
    return np.var(scores, axis=-1) / tau ** 3  # Bug: the variance over keys, not under the weights p
'''

SLOPE_GLOBAL_MAX = '''
def entropy_temperature_slope(scores, tau):
    keep = np.isfinite(scores)
    s = np.where(keep, scores, 0.0)
    z = np.where(keep, scores, -np.inf) / tau
    e = np.exp(z - np.max(z))  # Bug: one maximum for the whole array; rows far below it give 0/0
    p = e / e.sum(axis=-1, keepdims=True)
    centred = s - (p * s).sum(axis=-1, keepdims=True)
    return (p * centred ** 2).sum(axis=-1) / tau ** 3
'''

SLOPE_RAW_MOMENTS = '''
def entropy_temperature_slope(scores, tau):
    keep = np.isfinite(scores)
    s = np.where(keep, scores, 0.0)
    p = np.where(keep, softmax(scores / tau), 0.0)
    # Bug: E[s^2] - E[s]^2 cancels catastrophically when the scores are far from 0.
    return ((p * s ** 2).sum(-1) - (p * s).sum(-1) ** 2) / tau ** 3
'''

# --- gradients of additive attention -------------------------------------------------------


def _grads(weights=None, g_logits="p * (g - np.sum(p * g, axis=-1, keepdims=True))", d_w=None,
           tanh_slope="1.0 - t * t"):
    """An additive_attention_grads with one deliberate change."""
    weights = weights or ("real = np.ones(s.shape, dtype=bool) if key_mask is None else "
                          "np.broadcast_to(np.asarray(key_mask)[..., None, :], s.shape)\n"
                          "    top = np.max(np.where(real, s, -np.inf), axis=-1, keepdims=True)\n"
                          "    e = np.where(real, np.exp(np.where(real, s - np.where(np.isfinite(top), top, 0.0), 0.0)), 0.0)\n"
                          "    total = e.sum(axis=-1, keepdims=True)\n"
                          "    p = e / np.where(total > 0, total, 1.0)")
    d_w = d_w or "(gs[..., None] * t).reshape(-1, t.shape[-1]).sum(axis=0)"
    return f"""
def additive_attention_grads(q, k, v, u_q, u_k, w_score, d_out, key_mask=None):
    t = np.tanh((q @ u_q)[..., :, None, :] + (k @ u_k)[..., None, :, :])
    s = t @ w_score
    {weights}
    g = d_out @ np.swapaxes(v, -1, -2)
    gs = {g_logits}
    d_w = {d_w}
    d_q = (gs[..., None] * w_score * ({tanh_slope})).sum(axis=-2) @ u_q.T
    return d_q, d_w
"""


# Bug: dL/dscore = p * dL/dp, the p p^T term of the softmax's Jacobian lost.
GRADS_NO_JACOBIAN_CORRECTION = _grads(g_logits="p * g")
# Bug: the derivative of tanh forgotten on the way to q.
GRADS_NO_TANH_SLOPE = _grads(tanh_slope="1.0")
# Bug: the derivative of tanh taken as 1 - tanh, not 1 - tanh^2.
GRADS_TANH_SLOPE_NOT_SQUARED = _grads(tanh_slope="1.0 - t")
# Bug: dL/dw_score summed over the queries and keys of each sequence but not over the batch.
GRADS_DW_PER_SEQUENCE = _grads(d_w="(gs[..., None] * t).sum(axis=(-3, -2))")
# Bug: no guard for a sequence without real keys: 0/0 = nan.
GRADS_NAN_WITHOUT_KEYS = _grads(weights=(
    "if key_mask is not None:\n"
    "        s = np.where(np.asarray(key_mask)[..., None, :], s, -np.inf)\n"
    "    p = softmax(s)"))
# Bug: masked keys given the score -1e4, which real scores near -1e5 lose to.
GRADS_FINITE_MASK = _grads(weights=(
    "p = softmax(s if key_mask is None else np.where(np.asarray(key_mask)[..., None, :], s, -1e4))\n"
    "    if key_mask is not None:\n"
    "        p = np.where(np.asarray(key_mask).any(axis=-1)[..., None, None], p, 0.0)"))
# Bug: the mask applied after the softmax, so the real keys' weights no longer sum to 1.
GRADS_MASK_AFTER_SOFTMAX = _grads(weights=(
    "p = softmax(s)\n"
    "    if key_mask is not None:\n"
    "        p = p * np.asarray(key_mask)[..., None, :]"))
# Bug: no maximum subtracted: exp overflows for scores in the hundreds.
GRADS_UNSTABLE_SOFTMAX = _grads(weights=(
    "e = np.exp(s) if key_mask is None else np.exp(s) * np.asarray(key_mask)[..., None, :]\n"
    "    total = e.sum(axis=-1, keepdims=True)\n"
    "    p = e / np.where(total > 0, total, 1.0)"))

# --- decoder layer -------------------------------------------------------------------------

_DECODER_INIT = '''
class DecoderLayer(torch.nn.Module):
    def __init__(self, d_model, num_heads, d_ff, norm_first=False):
        super().__init__()
        self.num_heads = num_heads
        self.norm_first = norm_first
        for block in ("self", "cross"):
            for part in "qkvo":
                setattr(self, f"{block}_{part}", torch.nn.Linear(d_model, d_model))
        self.ff1 = torch.nn.Linear(d_model, d_ff)
        self.ff2 = torch.nn.Linear(d_ff, d_model)
        self.norm1 = torch.nn.LayerNorm(d_model)
        self.norm2 = torch.nn.LayerNorm(d_model)
        self.norm3 = torch.nn.LayerNorm(d_model)

    def attend(self, x, source, block, causal):
        heads = lambda t: t.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)
        q, k, v = heads(getattr(self, block + "_q")(x)), heads(getattr(self, block + "_k")(source)), \\
            heads(getattr(self, block + "_v")(source))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return getattr(self, block + "_o")(out.transpose(1, 2).flatten(2))

    def ff(self, x):
        return self.ff2(torch.relu(self.ff1(x)))
'''

DECODER_NOT_CAUSAL = _DECODER_INIT + '''
    def forward(self, x, memory):
        sa = lambda t: self.attend(t, t, "self", causal=False)  # Bug: later tokens visible
        if self.norm_first:
            x = x + sa(self.norm1(x))
            x = x + self.attend(self.norm2(x), memory, "cross", False)
            return x + self.ff(self.norm3(x))
        x = self.norm1(x + sa(x))
        x = self.norm2(x + self.attend(x, memory, "cross", False))
        return self.norm3(x + self.ff(x))
'''

DECODER_CROSS_KEYS_FROM_X = _DECODER_INIT + '''
    def forward(self, x, memory):
        ca = lambda t: self.attend(t, t, "cross", False)  # Bug: keys and values from the target, not memory
        if self.norm_first:
            x = x + self.attend(self.norm1(x), self.norm1(x), "self", True)
            x = x + ca(self.norm2(x))
            return x + self.ff(self.norm3(x))
        x = self.norm1(x + self.attend(x, x, "self", True))
        x = self.norm2(x + ca(x))
        return self.norm3(x + self.ff(x))
'''

DECODER_IGNORES_NORM_FIRST = _DECODER_INIT + '''
    def forward(self, x, memory):
        x = self.norm1(x + self.attend(x, x, "self", True))
        x = self.norm2(x + self.attend(x, memory, "cross", False))
        return self.norm3(x + self.ff(x))
'''

DECODER_PRE_NORM_RESIDUAL_NORMALISED = _DECODER_INIT + '''
    def forward(self, x, memory):
        steps = [(self.norm1, lambda t: self.attend(t, t, "self", True)),
                 (self.norm2, lambda t: self.attend(t, memory, "cross", False)),
                 (self.norm3, self.ff)]
        for norm, f in steps:
            if self.norm_first:
                x = norm(x)  # Bug: the residual path carries the normalised x, not x itself
                x = x + f(x)
            else:
                x = norm(x + f(x))
        return x
'''

DECODER_POST_NORM_ONE_NORM = _DECODER_INIT + '''
    def forward(self, x, memory):
        if self.norm_first:
            x = x + self.attend(self.norm1(x), self.norm1(x), "self", True)
            x = x + self.attend(self.norm2(x), memory, "cross", False)
            return x + self.ff(self.norm3(x))
        x = self.norm1(x + self.attend(x, x, "self", True))
        x = self.norm1(x + self.attend(x, memory, "cross", False))  # Bug: norm1 reused
        return self.norm1(x + self.ff(x))
'''

# --- answers that compute with PyTorch where the exercise asks for NumPy, or that hand the
# decoder layer to PyTorch's own: the visible tests pass, the hidden ones do not ---------------

# The per-sequence loop of the visible test, made into the answer.
PADDED_WITH_TORCH = '''
def left_padded_causal_attention(q, k, v, lengths):
    out = np.zeros(q.shape[:2] + v.shape[-1:])
    for b, length in enumerate(lengths):
        real = slice(q.shape[1] - int(length), q.shape[1])
        if length:
            out[b, real] = F.scaled_dot_product_attention(*(torch.from_numpy(a[b, real]) for a in (q, k, v)),
                                                          is_causal=True).numpy()
    return out
'''

# The visible test's grouped-query call, made into the answer.
STEP_WITH_TORCH_GQA = '''
def decode_step(x_t, cache_k, cache_v, w_q, w_k, w_v, n_heads):
    d_head = w_q.shape[1] // n_heads
    g = w_k.shape[1] // d_head
    keys = np.concatenate([cache_k, (x_t @ w_k).reshape(g, 1, d_head)], axis=1)
    values = np.concatenate([cache_v, (x_t @ w_v).reshape(g, 1, d_head)], axis=1)
    tq = torch.from_numpy((x_t @ w_q).reshape(n_heads, 1, d_head))
    out = F.scaled_dot_product_attention(tq, torch.from_numpy(keys), torch.from_numpy(values), enable_gqa=True)
    return out.numpy().reshape(-1), keys, values
'''

# The visible test's autograd loop, made into the answer.
SLOPE_WITH_AUTOGRAD = '''
def entropy_temperature_slope(scores, tau):
    rows = np.asarray(scores, dtype=np.float64).reshape(-1, scores.shape[-1])
    t = torch.tensor(float(tau), dtype=torch.float64, requires_grad=True)
    slopes = []
    for row in rows:
        z = torch.from_numpy(row[np.isfinite(row)]) / t
        entropy = -(torch.softmax(z, dim=0) * torch.log_softmax(z, dim=0)).sum()
        slopes.append(torch.autograd.grad(entropy, t)[0].item())
    return np.array(slopes).reshape(scores.shape[:-1])
'''

ROPE_WITH_TORCH = '''
def rotary_half_split(x, lengths, rotary_dim=None):
    n, d = x.shape[-2:]
    r = d if rotary_dim is None else rotary_dim
    if r % 2 or r > d:
        raise ValueError(f"rotary_dim {r} for width {d}")
    t = torch.from_numpy(np.asarray(x, dtype=np.float64))
    pos = (torch.arange(n) - (n - torch.as_tensor(lengths))[:, None]).clamp(min=0).to(torch.float64)
    angle = pos[:, None, :, None] * 10000.0 ** (-torch.arange(r // 2) * 2.0 / r)
    a, b = t[..., :r // 2], t[..., r // 2:r]
    return torch.cat([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos(), t[..., r:]], dim=-1).numpy()
'''

# The visible test's autograd, made into the answer.
GRADS_WITH_AUTOGRAD = '''
def additive_attention_grads(q, k, v, u_q, u_k, w_score, d_out, key_mask=None):
    tq, tw = torch.tensor(q, requires_grad=True), torch.tensor(w_score, requires_grad=True)
    s = torch.tanh((tq @ torch.from_numpy(u_q)).unsqueeze(-2) + torch.from_numpy(k @ u_k).unsqueeze(-3)) @ tw
    if key_mask is not None:
        s = s.masked_fill(~torch.from_numpy(np.asarray(key_mask)).unsqueeze(-2), float("-inf"))
    p = torch.nan_to_num(torch.softmax(s, dim=-1))
    ((p @ torch.from_numpy(v)) * torch.from_numpy(d_out)).sum().backward()
    return tq.grad.numpy(), tw.grad.numpy()
'''

# The visible test's copy_from_torch run backwards: PyTorch's layer does the work.
DECODER_WRAPS_TORCH_LAYER = _DECODER_INIT + '''
    def forward(self, x, memory):
        d_model = self.self_q.in_features
        layer = torch.nn.TransformerDecoderLayer(d_model, self.num_heads, self.ff1.out_features, dropout=0.0,
                                                 batch_first=True, norm_first=self.norm_first, dtype=x.dtype)
        with torch.no_grad():
            for block, attn in (("self", layer.self_attn), ("cross", layer.multihead_attn)):
                parts = [getattr(self, f"{block}_{p}") for p in "qkv"]
                attn.in_proj_weight.copy_(torch.cat([p.weight for p in parts]))
                attn.in_proj_bias.copy_(torch.cat([p.bias for p in parts]))
                attn.out_proj.weight.copy_(getattr(self, f"{block}_o").weight)
                attn.out_proj.bias.copy_(getattr(self, f"{block}_o").bias)
            for mine, theirs in ((self.ff1, layer.linear1), (self.ff2, layer.linear2), (self.norm1, layer.norm1),
                                 (self.norm2, layer.norm2), (self.norm3, layer.norm3)):
                theirs.weight.copy_(mine.weight)
                theirs.bias.copy_(mine.bias)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1], dtype=x.dtype)
        return layer.eval()(x, memory, tgt_mask=mask, tgt_is_causal=True)
'''

# A hand-written forward whose self-attention is still PyTorch's module.
DECODER_WITH_MULTIHEAD_MODULE = _DECODER_INIT + '''
    def forward(self, x, memory):
        def self_block(t):
            attn = torch.nn.MultiheadAttention(t.shape[-1], self.num_heads, batch_first=True, dtype=t.dtype)
            with torch.no_grad():
                attn.in_proj_weight.copy_(torch.cat([self.self_q.weight, self.self_k.weight, self.self_v.weight]))
                attn.in_proj_bias.copy_(torch.cat([self.self_q.bias, self.self_k.bias, self.self_v.bias]))
                attn.out_proj.weight.copy_(self.self_o.weight)
                attn.out_proj.bias.copy_(self.self_o.bias)
            n = t.shape[1]
            mask = torch.ones(n, n, dtype=torch.bool).triu(1)
            return attn(t, t, t, attn_mask=mask, need_weights=False)[0]
        steps = [(self.norm1, self_block), (self.norm2, lambda t: self.attend(t, memory, "cross", False)),
                 (self.norm3, self.ff)]
        for norm, f in steps:
            x = x + f(norm(x)) if self.norm_first else norm(x + f(x))
        return x
'''

# --- correct answers in other styles: full marks ----------------------------------------------

STYLE_ROPE_COMPLEX = '''
def rotary_half_split(x, lengths, rotary_dim=None):
    n, d = x.shape[-2:]
    r = d if rotary_dim is None else rotary_dim
    if r % 2 or r > d:
        raise ValueError(f"rotary_dim {r} cannot be split into pairs within width {d}")
    h = r // 2
    out = np.array(x, dtype=np.float64)
    for b, length in enumerate(lengths):                    # one sequence at a time, real rows only
        start = n - int(length)
        z = x[b, :, start:, :h] + 1j * x[b, :, start:, h:r]   # pair (i, i + h) as one complex number
        turned = z * np.exp(1j * np.multiply.outer(np.arange(int(length)), 10000.0 ** (-np.arange(h) * 2.0 / r)))
        out[b, :, start:, :h], out[b, :, start:, h:r] = turned.real, turned.imag
    return out
'''

STYLE_PADDED_LOOP = '''
def left_padded_causal_attention(q, k, v, lengths):
    batch, n, d_k = q.shape
    out = np.zeros((batch, n, v.shape[-1]))
    for b, length in enumerate(lengths):
        start = n - int(length)
        for i in range(start, n):
            s = k[b, start:i + 1] @ q[b, i] / np.sqrt(d_k)
            out[b, i] = softmax(s) @ v[b, start:i + 1]
    return out
'''

STYLE_STEP_REPEAT = '''
def decode_step(x_t, cache_k, cache_v, w_q, w_k, w_v, n_heads):
    d = w_q.shape[1] // n_heads
    g = w_k.shape[1] // d
    new_k = np.append(cache_k, (x_t @ w_k).reshape(g, 1, d), axis=1)
    new_v = np.append(cache_v, (x_t @ w_v).reshape(g, 1, d), axis=1)
    k_all, v_all = np.repeat(new_k, n_heads // g, axis=0), np.repeat(new_v, n_heads // g, axis=0)
    q = (x_t @ w_q).reshape(n_heads, d)
    a = softmax(np.einsum("hd,htd->ht", q, k_all) / d ** 0.5)
    return np.einsum("ht,htd->hd", a, v_all).ravel(), new_k, new_v
'''

STYLE_DECODE_PREALLOCATED = '''
def decode_with_kv_cache(x, w_q, w_k, w_v, n_heads, prompt_length):
    d = w_q.shape[1] // n_heads
    g = w_k.shape[1] // d
    out = np.empty((len(x), w_q.shape[1]))
    k_cache = np.stack([(x[:prompt_length] @ w_k)[:, j * d:(j + 1) * d] for j in range(g)])
    v_cache = np.stack([(x[:prompt_length] @ w_v)[:, j * d:(j + 1) * d] for j in range(g)])
    for s in range(prompt_length):  # one query at a time against the rows up to it
        for h in range(n_heads):
            j = h * g // n_heads
            logits = k_cache[j, :s + 1] @ (x[s] @ w_q)[h * d:(h + 1) * d] / np.sqrt(d)
            out[s, h * d:(h + 1) * d] = softmax(logits) @ v_cache[j, :s + 1]
    for t in range(prompt_length, len(x)):
        out[t], k_cache, v_cache = decode_step(x[t], k_cache, v_cache, w_q, w_k, w_v, n_heads)
    return out
'''

STYLE_SLOPE_FROM_LOG_P = '''
def entropy_temperature_slope(scores, tau):
    # dH/dtau = -sum (log p + 1) dp/dtau with dp/dtau = -p (s - mean) / tau^2
    keep = np.isfinite(scores)
    z = np.where(keep, scores / tau, -np.inf)
    z = z - z.max(axis=-1, keepdims=True)
    log_p = np.where(keep, z - np.log(np.exp(z).sum(axis=-1, keepdims=True)), 0.0)
    p = np.where(keep, np.exp(log_p), 0.0)
    s = np.where(keep, scores, 0.0)
    dp = -p * (s - (p * s).sum(axis=-1, keepdims=True)) / tau ** 2
    return -((log_p + 1.0) * dp).sum(axis=-1)
'''

STYLE_GRADS_JACOBIAN_PER_QUERY = '''
def additive_attention_grads(q, k, v, u_q, u_k, w_score, d_out, key_mask=None):
    # One sequence and one query at a time, with the softmax's Jacobian written out (n_k x n_k).
    lead = q.shape[:-2]
    real = np.ones(lead + k.shape[-2:-1], dtype=bool) if key_mask is None else np.asarray(key_mask, dtype=bool)
    d_q, d_w = np.zeros(q.shape), np.zeros(w_score.shape)
    for b in np.ndindex(lead):
        keys = k[b][real[b]] @ u_k
        if len(keys) == 0:
            continue
        for i in range(q.shape[-2]):
            h = np.tanh(q[b][i] @ u_q + keys)                   # (n_real, d_a)
            p = softmax(h @ w_score)
            jacobian = np.diag(p) - np.outer(p, p)
            g_scores = jacobian @ (v[b][real[b]] @ d_out[b][i])
            d_w += g_scores @ h
            d_q[b][i] = (g_scores @ ((1.0 - h ** 2) * w_score)) @ u_q.T
    return d_q, d_w
'''

# Weights from a log-sum-exp, every sum taken in reverse order (scores from the last hidden unit
# down, gbar, dw_score and dq from the last key or pair), and the slope of tanh as sech^2 written
# with exp(-2|h|), which cannot overflow: rounded unlike the reference at every step.
STYLE_GRADS_LOG_SUM_EXP = '''
def additive_attention_grads(q, k, v, u_q, u_k, w_score, d_out, key_mask=None):
    pre = (q @ u_q)[..., :, None, :] + (k @ u_k)[..., None, :, :]      # (..., n_q, n_k, d_a)
    hidden = np.tanh(pre)
    scores = np.zeros(pre.shape[:-1])
    for unit in reversed(range(len(w_score))):
        scores = scores + hidden[..., unit] * w_score[unit]
    real = np.ones(scores.shape, dtype=bool) if key_mask is None else \\
        np.broadcast_to(np.asarray(key_mask, dtype=bool)[..., None, :], scores.shape)
    any_real = real.any(axis=-1, keepdims=True)
    top = np.where(any_real, np.where(real, scores, -np.inf).max(axis=-1, keepdims=True), 0.0)
    total = np.exp(np.where(real, scores - top, -np.inf))[..., ::-1].sum(axis=-1, keepdims=True)
    lse = top + np.log(np.where(any_real, total, 1.0))
    p = np.exp(np.where(real, scores - lse, -np.inf))                    # 0 for a masked key
    g = np.einsum("...ic,...jc->...ij", d_out, v)
    gbar = np.zeros(g.shape[:-1] + (1,))
    for j in reversed(range(g.shape[-1])):
        gbar = gbar + p[..., j:j + 1] * g[..., j:j + 1]
    g_scores = p * (g - gbar)
    d_a = len(w_score)
    dw_score = np.zeros(d_a)
    for term in (g_scores[..., None] * hidden).reshape(-1, d_a)[::-1]:
        dw_score = dw_score + term
    e = np.exp(-2.0 * np.abs(pre))
    sech2 = 4.0 * e / (1.0 + e) ** 2
    dh = np.zeros(pre.shape[:-2] + (d_a,))
    for j in reversed(range(pre.shape[-2])):
        dh = dh + g_scores[..., j, None] * (sech2[..., j, :] * w_score)
    dq = np.zeros(q.shape)
    for unit in reversed(range(d_a)):
        dq = dq + dh[..., unit, None] * u_q[:, unit]
    return dq, dw_score
'''

STYLE_DECODER_MANUAL = _DECODER_INIT + '''
    def forward(self, x, memory):
        steps = [(self.norm1, lambda t: self.attend(t, t, "self", True)),
                 (self.norm2, lambda t: self.attend(t, memory, "cross", False)),
                 (self.norm3, self.ff)]
        for norm, f in steps:
            x = x + f(norm(x)) if self.norm_first else norm(x + f(x))
        return x
'''

CORRECT = {
    "rope_complex_padded_loop": {"rotary_half_split": STYLE_ROPE_COMPLEX,
                                 "left_padded_causal_attention": STYLE_PADDED_LOOP},
    "step_repeat_decode_preallocated": {"decode_step": STYLE_STEP_REPEAT,
                                        "decode_with_kv_cache": STYLE_DECODE_PREALLOCATED},
    "slope_from_log_p_grads_jacobian": {"entropy_temperature_slope": STYLE_SLOPE_FROM_LOG_P,
                                        "additive_attention_grads": STYLE_GRADS_JACOBIAN_PER_QUERY},
    "grads_log_sum_exp_reversed_sech": {"additive_attention_grads": STYLE_GRADS_LOG_SUM_EXP},
    "decoder_with_torch_sdpa": {"DecoderLayer": STYLE_DECODER_MANUAL},
    "written_from_the_release_alone": INDEPENDENT[ASSIGNMENT],
}

ROPE_CELLS = {"test_rotary_half_split", "test_rope_values", "test_rope_rotation"}
PADDED_CELLS = {"test_left_padded_causal_attention", "test_left_padded_values", "test_left_padded_empty_rows"}
STEP_CELLS = {"test_decode_step", "test_decode_step_hidden"}
DECODE_CELLS = {"test_decode_with_kv_cache", "test_decode_with_kv_cache_hidden"}
SLOPE_CELLS = {"test_entropy_temperature_slope", "test_slope_values", "test_slope_limits"}
GRADS_CELLS = {"test_additive_attention_grads", "test_additive_grads_values", "test_additive_grads_key_mask",
               "test_additive_grads_extreme"}
DECODER_CELLS = {"test_decoder_layer", "test_decoder_post_norm", "test_decoder_pre_norm"}

BUGGY = {
    # A rotation all the same: lengths and offsets are kept, only the values differ.
    "rope_interleaved_pairs": ({"rotary_half_split": ROPE_INTERLEAVED}, ROPE_CELLS - {"test_rope_rotation"}),
    "rope_not_a_rotation": ({"rotary_half_split": ROPE_NOT_A_ROTATION}, ROPE_CELLS),
    "rope_exponent_halved": ({"rotary_half_split": ROPE_EXPONENT_HALVED}, ROPE_CELLS - {"test_rope_rotation"}),
    # Only the partial cases tell (r < d); the scores still depend on offsets alone.
    "rope_frequencies_from_d": ({"rotary_half_split": ROPE_FREQUENCIES_FROM_D}, ROPE_CELLS - {"test_rope_rotation"}),
    "rope_rotates_everything": ({"rotary_half_split": ROPE_ROTATES_EVERYTHING}, ROPE_CELLS),
    "rope_positions_from_row_0": ({"rotary_half_split": ROPE_POSITIONS_FROM_ROW_0}, ROPE_CELLS - {"test_rope_rotation"}),
    # Most bad widths still fail with NumPy's own ValueError (shapes that do not broadcast),
    # the visible one included; rotary_dim = 5 for a row of 4 does not.
    "rope_no_error_on_odd_rotary_dim": ({"rotary_half_split": ROPE_NO_CHECK}, {"test_rope_rotation"}),
    "rope_zero_rotary_dim_means_the_whole_width": ({"rotary_half_split": ROPE_ZERO_MEANS_WHOLE_WIDTH},
                                                   {"test_rope_rotation"}),
    "padded_on_the_right": ({"left_padded_causal_attention": PADDED_ON_THE_RIGHT}, PADDED_CELLS),
    "padded_nan_on_empty_rows": ({"left_padded_causal_attention": PADDED_NAN_ROWS},
                                 PADDED_CELLS - {"test_left_padded_values"}),
    "padded_loses_diagonal": ({"left_padded_causal_attention": PADDED_LOSES_DIAGONAL},
                              PADDED_CELLS - {"test_left_padded_empty_rows"}),
    # Right for junk in the hundreds; padding of 1e12 and beyond (in the visible test too)
    # outweighs the penalty, or leaves every kept exp at 0.
    "padded_additive_penalty": ({"left_padded_causal_attention": PADDED_ADDITIVE_PENALTY},
                                {"test_left_padded_causal_attention", "test_left_padded_values"}),
    "padded_max_over_all_keys": ({"left_padded_causal_attention": PADDED_MAX_OVER_ALL_KEYS},
                                 {"test_left_padded_causal_attention", "test_left_padded_values"}),
    "padded_mask_after_softmax": ({"left_padded_causal_attention": PADDED_MASK_AFTER_SOFTMAX},
                                  PADDED_CELLS - {"test_left_padded_empty_rows"}),
    # decode_with_kv_cache calls decode_step, so a broken step costs both.
    "step_interleaved_groups": ({"decode_step": STEP_INTERLEAVED_GROUPS}, STEP_CELLS | DECODE_CELLS),
    # Attention ignores key order, so the outputs stay right; the cache does not.
    "step_prepends_to_cache": ({"decode_step": STEP_PREPENDS}, STEP_CELLS),
    "decode_recomputes_without_cache": ({"decode_with_kv_cache": DECODE_RECOMPUTES},
                                        {"test_decode_with_kv_cache_hidden"}),
    # Its calls were given caches it did not build: an integrity failure, so no test of it counts.
    "decode_fakes_its_calls": ({"decode_with_kv_cache": DECODE_FAKES_ITS_CALLS}, DECODE_CELLS),
    "prefill_not_causal": ({"decode_with_kv_cache": PREFILL_NOT_CAUSAL}, DECODE_CELLS),
    "prefill_heads_interleaved": ({"decode_with_kv_cache": PREFILL_HEADS_INTERLEAVED}, DECODE_CELLS),
    "prefill_by_decoding": ({"decode_with_kv_cache": PREFILL_BY_DECODING}, {"test_decode_with_kv_cache_hidden"}),
    "decode_rebuilds_caches": ({"decode_with_kv_cache": DECODE_REBUILDS_CACHES}, {"test_decode_with_kv_cache_hidden"}),
    "slope_wrong_power_of_tau": ({"entropy_temperature_slope": SLOPE_WRONG_POWER}, SLOPE_CELLS),
    "slope_nan_on_masked_keys": ({"entropy_temperature_slope": SLOPE_NAN_ON_MASKED},
                                 {"test_entropy_temperature_slope", "test_slope_limits"}),
    "slope_unweighted_variance": ({"entropy_temperature_slope": SLOPE_UNWEIGHTED_VARIANCE}, SLOPE_CELLS),
    # The visible test's row at 1e6 and the hidden rows near a million expose both.
    "slope_raw_moments": ({"entropy_temperature_slope": SLOPE_RAW_MOMENTS},
                          {"test_entropy_temperature_slope", "test_slope_limits"}),
    "slope_global_max": ({"entropy_temperature_slope": SLOPE_GLOBAL_MAX},
                         {"test_entropy_temperature_slope", "test_slope_limits"}),
    "grads_no_jacobian_correction": ({"additive_attention_grads": GRADS_NO_JACOBIAN_CORRECTION}, GRADS_CELLS),
    "grads_no_tanh_slope": ({"additive_attention_grads": GRADS_NO_TANH_SLOPE}, GRADS_CELLS),
    "grads_tanh_slope_not_squared": ({"additive_attention_grads": GRADS_TANH_SLOPE_NOT_SQUARED}, GRADS_CELLS),
    # The extreme cell has no batch axes, where one sequence's sum is the whole sum.
    "grads_dw_per_sequence": ({"additive_attention_grads": GRADS_DW_PER_SEQUENCE},
                              GRADS_CELLS - {"test_additive_grads_extreme"}),
    "grads_nan_without_keys": ({"additive_attention_grads": GRADS_NAN_WITHOUT_KEYS},
                               {"test_additive_attention_grads", "test_additive_grads_key_mask"}),
    "grads_finite_mask": ({"additive_attention_grads": GRADS_FINITE_MASK},
                          {"test_additive_attention_grads", "test_additive_grads_key_mask"}),
    "grads_mask_after_softmax": ({"additive_attention_grads": GRADS_MASK_AFTER_SOFTMAX},
                                 {"test_additive_attention_grads", "test_additive_grads_key_mask"}),
    # Scores moved by 1e5 overflow it, in the visible test and in both hidden cells that move them.
    "grads_unstable_softmax": ({"additive_attention_grads": GRADS_UNSTABLE_SOFTMAX},
                               {"test_additive_attention_grads", "test_additive_grads_key_mask",
                                "test_additive_grads_extreme"}),
    "decoder_self_attention_not_causal": ({"DecoderLayer": DECODER_NOT_CAUSAL}, DECODER_CELLS),
    "decoder_cross_keys_from_target": ({"DecoderLayer": DECODER_CROSS_KEYS_FROM_X}, DECODER_CELLS),
    # The visible test runs both configurations, with random LayerNorm weights and biases.
    "decoder_ignores_norm_first": ({"DecoderLayer": DECODER_IGNORES_NORM_FIRST},
                                   {"test_decoder_layer", "test_decoder_pre_norm"}),
    "decoder_pre_norm_residual_normalised": ({"DecoderLayer": DECODER_PRE_NORM_RESIDUAL_NORMALISED},
                                             {"test_decoder_layer", "test_decoder_pre_norm"}),
    "decoder_post_norm_one_norm": ({"DecoderLayer": DECODER_POST_NORM_ONE_NORM},
                                   {"test_decoder_layer", "test_decoder_post_norm"}),
    # Computed with PyTorch where the exercise asks for NumPy: every hidden cell of the exercise is lost.
    "rope_with_torch": ({"rotary_half_split": ROPE_WITH_TORCH}, ROPE_CELLS - {"test_rotary_half_split"}),
    "padded_with_torch": ({"left_padded_causal_attention": PADDED_WITH_TORCH},
                          PADDED_CELLS - {"test_left_padded_causal_attention"}),
    # decode_with_kv_cache calls the step, so it computes with PyTorch too.
    "step_with_torch_gqa": ({"decode_step": STEP_WITH_TORCH_GQA},
                            {"test_decode_step_hidden", "test_decode_with_kv_cache_hidden"}),
    "slope_with_autograd": ({"entropy_temperature_slope": SLOPE_WITH_AUTOGRAD},
                            SLOPE_CELLS - {"test_entropy_temperature_slope"}),
    "grads_with_autograd": ({"additive_attention_grads": GRADS_WITH_AUTOGRAD},
                            GRADS_CELLS - {"test_additive_attention_grads"}),
    "decoder_wraps_torch_layer": ({"DecoderLayer": DECODER_WRAPS_TORCH_LAYER},
                                  DECODER_CELLS - {"test_decoder_layer"}),
    "decoder_with_multihead_module": ({"DecoderLayer": DECODER_WITH_MULTIHEAD_MODULE},
                                      DECODER_CELLS - {"test_decoder_layer"}),
}

# Planted cases a check also puts in the integrity report, with the reason it gives (PyTorch
# reached for by a graded call in the process without PyTorch, where NumPy is graded).
FLAGGED = {"decode_fakes_its_calls": {"sandbox: decode_step given caches it did not build"},
           **{case: {"sandbox: uses PyTorch where the answer is graded as NumPy code"}
              for case in ("rope_with_torch", "padded_with_torch", "step_with_torch_gqa", "slope_with_autograd",
                           "grads_with_autograd")},
           **{case: {"sandbox: runs PyTorch's attention layers in DecoderLayer"}
              for case in ("decoder_wraps_torch_layer", "decoder_with_multihead_module")}}
