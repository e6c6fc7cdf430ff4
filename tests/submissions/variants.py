"""Planted submissions for ch2_variants.

Each case replaces some solution cells (keyed by grade_id) of an otherwise
correct submission. `loses` names the test cells that must score 0; every other
autograded cell must get full points."""

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

# --- additive attention ------------------------------------------------------------------

# Every planted answer below handles the key mask the same, correct way, unless its bug is there.
_ADDITIVE_MASK = '''
def _masked_weights(scores, key_mask):
    if key_mask is None:
        return softmax(scores)
    real = np.asarray(key_mask)[..., None, :]
    top = np.max(np.where(real, scores, -np.inf), axis=-1, keepdims=True)
    e = np.where(real, np.exp(np.where(real, scores - np.where(np.isfinite(top), top, 0.0), 0.0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total > 0, total, 1.0)
'''

ADDITIVE_SPLIT_AT_D_K = _ADDITIVE_MASK + '''
def concat_additive_attention(q, k, v, w_cat, w_score, key_mask=None):
    d_k = k.shape[-1]
    # Bug: splits w_cat after d_k rows; right only when d_q == d_k.
    hidden = np.tanh((q @ w_cat[:d_k])[..., :, None, :] + (k @ w_cat[d_k:])[..., None, :, :])
    weights = _masked_weights(hidden @ w_score, key_mask)
    return weights @ v, weights
'''

ADDITIVE_KEY_FIRST = _ADDITIVE_MASK + '''
def concat_additive_attention(q, k, v, w_cat, w_score, key_mask=None):
    d_k = k.shape[-1]
    # Bug: the key's rows of w_cat taken first, as if the pair were [k, q].
    hidden = np.tanh((q @ w_cat[d_k:])[..., :, None, :] + (k @ w_cat[:d_k])[..., None, :, :])
    weights = _masked_weights(hidden @ w_score, key_mask)
    return weights @ v, weights
'''

ADDITIVE_2D_ONLY = _ADDITIVE_MASK + '''
def concat_additive_attention(q, k, v, w_cat, w_score, key_mask=None):
    d_q = q.shape[-1]
    hidden = np.tanh((q @ w_cat[:d_q])[:, None, :] + (k @ w_cat[d_q:])[None, :, :])
    weights = _masked_weights(hidden @ w_score, key_mask)
    return weights @ v, weights
'''

ADDITIVE_FINITE_MASK = '''
def concat_additive_attention(q, k, v, w_cat, w_score, key_mask=None):
    d_q = q.shape[-1]
    scores = np.tanh((q @ w_cat[:d_q])[..., :, None, :] + (k @ w_cat[d_q:])[..., None, :, :]) @ w_score
    if key_mask is None:
        weights = softmax(scores)
    else:
        real = np.asarray(key_mask, dtype=bool)[..., None, :]
        weights = softmax(np.where(real, scores, -1e4))  # Bug: scores below -1e4 lose to the masked keys
        weights = np.where(real.any(axis=-1, keepdims=True), weights, 0.0)
    return weights @ v, weights
'''

ADDITIVE_UNSTABLE = '''
def concat_additive_attention(q, k, v, w_cat, w_score, key_mask=None):
    d_q = q.shape[-1]
    e = np.exp(np.tanh((q @ w_cat[:d_q])[..., :, None, :] + (k @ w_cat[d_q:])[..., None, :, :]) @ w_score)
    if key_mask is not None:
        e = e * np.asarray(key_mask)[..., None, :]
    total = e.sum(axis=-1, keepdims=True)
    weights = e / np.where(total > 0, total, 1.0)
    return weights @ v, weights
'''

ADDITIVE_MASK_NAN_ROWS = '''
def concat_additive_attention(q, k, v, w_cat, w_score, key_mask=None):
    d_q = q.shape[-1]
    scores = np.tanh((q @ w_cat[:d_q])[..., :, None, :] + (k @ w_cat[d_q:])[..., None, :, :]) @ w_score
    if key_mask is not None:
        scores = np.where(np.asarray(key_mask)[..., None, :], scores, -np.inf)
    weights = softmax(scores)  # Bug: a row with every key masked is -inf - (-inf) = nan
    return weights @ v, weights
'''

ADDITIVE_MASK_AFTER_SOFTMAX = '''
def concat_additive_attention(q, k, v, w_cat, w_score, key_mask=None):
    d_q = q.shape[-1]
    weights = softmax(np.tanh((q @ w_cat[:d_q])[..., :, None, :] + (k @ w_cat[d_q:])[..., None, :, :]) @ w_score)
    if key_mask is not None:
        weights = weights * np.asarray(key_mask)[..., None, :]  # Bug: the rest no longer sums to 1
    return weights @ v, weights
'''

# Right numbers, but every [q_i; k_j] written out: the memory the exercise forbids.
ADDITIVE_CONCATENATED_PAIRS = _ADDITIVE_MASK + '''
def concat_additive_attention(q, k, v, w_cat, w_score, key_mask=None):
    n_q, n_k = q.shape[-2], k.shape[-2]
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    qs = np.broadcast_to(q[..., :, None, :], (*lead, n_q, n_k, q.shape[-1]))
    ks = np.broadcast_to(k[..., None, :, :], (*lead, n_q, n_k, k.shape[-1]))
    pairs = np.concatenate([qs, ks], axis=-1)
    weights = _masked_weights(np.tanh(pairs @ w_cat) @ w_score, key_mask)
    return weights @ v, weights
'''

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

ADDITIVE_WITH_TORCH = '''
def concat_additive_attention(q, k, v, w_cat, w_score, key_mask=None):
    d_q = q.shape[-1]
    tq, tk, tv, tw, ts = (torch.from_numpy(a) for a in (q, k, v, w_cat, w_score))
    scores = torch.tanh((tq @ tw[:d_q]).unsqueeze(-2) + (tk @ tw[d_q:]).unsqueeze(-3)) @ ts
    if key_mask is not None:
        scores = scores.masked_fill(~torch.from_numpy(np.asarray(key_mask)).unsqueeze(-2), float("-inf"))
    weights = torch.nan_to_num(torch.softmax(scores, dim=-1))
    return (weights @ tv).numpy(), weights.numpy()
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

STYLE_ADDITIVE_QUERY_LOOP = '''
def concat_additive_attention(q, k, v, w_cat, w_score, key_mask=None):
    d_q = q.shape[-1]
    from_q, from_k = q @ w_cat[:d_q], k @ w_cat[d_q:]
    real = np.ones(k.shape[:-1], dtype=bool) if key_mask is None else np.asarray(key_mask, dtype=bool)
    weights = np.zeros(q.shape[:-1] + (k.shape[-2],))
    for i in range(q.shape[-2]):                    # one query at a time: (..., n_k, d_h) alive at once
        s = np.tanh(from_q[..., i, None, :] + from_k) @ w_score
        s = np.where(real, s, -np.inf)
        top = s.max(axis=-1, keepdims=True)
        e = np.exp(s - np.where(np.isfinite(top), top, 0.0))
        total = e.sum(axis=-1, keepdims=True)
        weights[..., i, :] = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return weights @ v, weights
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
    "slope_from_log_p_additive_pairs": {"entropy_temperature_slope": STYLE_SLOPE_FROM_LOG_P,
                                        "concat_additive_attention": STYLE_ADDITIVE_QUERY_LOOP},
    "decoder_with_torch_sdpa": {"DecoderLayer": STYLE_DECODER_MANUAL},
}

ROPE_CELLS = {"test_rotary_half_split", "test_rope_values", "test_rope_rotation"}
PADDED_CELLS = {"test_left_padded_causal_attention", "test_left_padded_values", "test_left_padded_empty_rows"}
STEP_CELLS = {"test_decode_step", "test_decode_step_hidden"}
DECODE_CELLS = {"test_decode_with_kv_cache", "test_decode_with_kv_cache_hidden"}
SLOPE_CELLS = {"test_entropy_temperature_slope", "test_slope_values", "test_slope_limits"}
ADDITIVE_CELLS = {"test_concat_additive_attention", "test_additive_batched", "test_additive_extreme",
                  "test_additive_key_mask", "test_additive_memory"}
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
    "decode_fakes_its_calls": ({"decode_with_kv_cache": DECODE_FAKES_ITS_CALLS},
                               {"test_decode_with_kv_cache_hidden"}),
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
    "additive_finite_mask": ({"concat_additive_attention": ADDITIVE_FINITE_MASK}, {"test_additive_key_mask"}),
    # The extreme cell has d_q == d_k, where splitting after d_k rows happens to be right.
    "additive_split_at_d_k": ({"concat_additive_attention": ADDITIVE_SPLIT_AT_D_K},
                              ADDITIVE_CELLS - {"test_additive_extreme"}),
    "additive_key_rows_first": ({"concat_additive_attention": ADDITIVE_KEY_FIRST}, ADDITIVE_CELLS),
    # The visible and the mask tests use batch axes too.
    "additive_2d_only": ({"concat_additive_attention": ADDITIVE_2D_ONLY},
                         {"test_concat_additive_attention", "test_additive_batched", "test_additive_key_mask"}),
    "additive_nan_on_rows_with_no_key": ({"concat_additive_attention": ADDITIVE_MASK_NAN_ROWS},
                                         {"test_concat_additive_attention", "test_additive_key_mask"}),
    "additive_mask_after_softmax": ({"concat_additive_attention": ADDITIVE_MASK_AFTER_SOFTMAX},
                                    {"test_concat_additive_attention", "test_additive_key_mask"}),
    "additive_concatenated_pairs": ({"concat_additive_attention": ADDITIVE_CONCATENATED_PAIRS},
                                    {"test_concat_additive_attention", "test_additive_memory"}),
    # The key-mask cell's long w_score overflows it too.
    "additive_unstable_softmax": ({"concat_additive_attention": ADDITIVE_UNSTABLE},
                                  {"test_additive_extreme", "test_additive_key_mask"}),
    "decoder_self_attention_not_causal": ({"DecoderLayer": DECODER_NOT_CAUSAL}, DECODER_CELLS),
    "decoder_cross_keys_from_target": ({"DecoderLayer": DECODER_CROSS_KEYS_FROM_X}, DECODER_CELLS),
    "decoder_ignores_norm_first": ({"DecoderLayer": DECODER_IGNORES_NORM_FIRST}, {"test_decoder_pre_norm"}),
    # The visible test keeps PyTorch's initial LayerNorms (all alike), so only the hidden cell can tell.
    "decoder_post_norm_one_norm": ({"DecoderLayer": DECODER_POST_NORM_ONE_NORM}, {"test_decoder_post_norm"}),
    # Computed with PyTorch where the exercise asks for NumPy: every hidden cell of the exercise is lost.
    "rope_with_torch": ({"rotary_half_split": ROPE_WITH_TORCH}, ROPE_CELLS - {"test_rotary_half_split"}),
    "padded_with_torch": ({"left_padded_causal_attention": PADDED_WITH_TORCH},
                          PADDED_CELLS - {"test_left_padded_causal_attention"}),
    # decode_with_kv_cache calls the step, so it computes with PyTorch too.
    "step_with_torch_gqa": ({"decode_step": STEP_WITH_TORCH_GQA},
                            {"test_decode_step_hidden", "test_decode_with_kv_cache_hidden"}),
    "slope_with_autograd": ({"entropy_temperature_slope": SLOPE_WITH_AUTOGRAD},
                            SLOPE_CELLS - {"test_entropy_temperature_slope"}),
    "additive_with_torch": ({"concat_additive_attention": ADDITIVE_WITH_TORCH},
                            ADDITIVE_CELLS - {"test_concat_additive_attention"}),
    "decoder_wraps_torch_layer": ({"DecoderLayer": DECODER_WRAPS_TORCH_LAYER},
                                  DECODER_CELLS - {"test_decoder_layer"}),
    "decoder_with_multihead_module": ({"DecoderLayer": DECODER_WITH_MULTIHEAD_MODULE},
                                      DECODER_CELLS - {"test_decoder_layer"}),
}

# Planted cases a check also puts in the integrity report, with the reason it gives.
FLAGGED = {"decode_fakes_its_calls": {"sandbox: decode_step given caches it did not build"}}
