"""Planted submissions for ch2_variants.

Each case replaces some solution cells (keyed by grade_id) of an otherwise
correct submission. `loses` names the test cells that must score 0; every other
autograded cell must get full points."""

ASSIGNMENT = "ch2_variants"
NOTEBOOK = "variants.ipynb"

# --- positional encoding ------------------------------------------------------

PE_SIN_COS_SWAPPED = '''
def sinusoidal_positional_encoding(n_positions, d_model):
    if d_model % 2:
        raise ValueError("d_model must be even")
    angle = np.arange(n_positions)[:, None] / 10000.0 ** (np.arange(0, d_model, 2) / d_model)
    pe = np.zeros((n_positions, d_model))
    pe[:, 0::2] = np.cos(angle)
    pe[:, 1::2] = np.sin(angle)
    return pe
'''

PE_EXPONENT_DOUBLED = '''
def sinusoidal_positional_encoding(n_positions, d_model):
    if d_model % 2:
        raise ValueError("d_model must be even")
    # Bug: 2 * (2i) in the exponent, the column index doubled once too often.
    angle = np.arange(n_positions)[:, None] / 10000.0 ** (2 * np.arange(0, d_model, 2) / d_model)
    pe = np.zeros((n_positions, d_model))
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle)
    return pe
'''

PE_EXPONENT_HALVED = '''
def sinusoidal_positional_encoding(n_positions, d_model):
    if d_model % 2:
        raise ValueError("d_model must be even")
    i = np.arange(d_model // 2)
    angle = np.arange(n_positions)[:, None] / 10000.0 ** (i / d_model)  # Bug: i instead of 2i
    pe = np.zeros((n_positions, d_model))
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle)
    return pe
'''

PE_FLOAT32 = '''
def sinusoidal_positional_encoding(n_positions, d_model):
    if d_model % 2:
        raise ValueError("d_model must be even")
    angle = np.arange(n_positions, dtype=np.float32)[:, None] / np.float32(10000.0) ** (
        np.arange(0, d_model, 2, dtype=np.float32) / np.float32(d_model))
    pe = np.zeros((n_positions, d_model), dtype=np.float32)
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle)
    return pe
'''

# Correct for every even width; for an odd one it quietly returns a table.
PE_WHERE_NO_CHECK = '''
def sinusoidal_positional_encoding(n_positions, d_model):
    column = np.arange(d_model)
    angle = np.arange(n_positions)[:, None] / 10000.0 ** (2 * (column // 2) / d_model)
    return np.where(column % 2 == 0, np.sin(angle), np.cos(angle))
'''

# --- causal mask ----------------------------------------------------------------

MASK_STRICT = '''
def causal_mask(n):
    return np.tril(np.ones((n, n), dtype=bool), k=-1)  # Bug: j < i, the diagonal is lost
'''

MASK_UPPER = '''
def causal_mask(n):
    return np.triu(np.ones((n, n), dtype=bool))  # Bug: j >= i, the future instead of the past
'''

MASK_FLOATS = '''
def causal_mask(n):
    return np.tril(np.ones((n, n)))  # Bug: 0.0/1.0 floats, not booleans
'''

# --- cross-attention ------------------------------------------------------------

CROSS_KEYS_FROM_DECODER = '''
def cross_attention(x_dec, memory, w_q, w_k, w_v):
    q, k, v = x_dec @ w_q, x_dec @ w_k, memory @ w_v
    weights = softmax(q @ k.T / np.sqrt(k.shape[-1]), axis=-1)
    return weights @ v
'''

CROSS_SCALE_BY_D_V = '''
def cross_attention(x_dec, memory, w_q, w_k, w_v):
    q, k, v = x_dec @ w_q, memory @ w_k, memory @ w_v
    weights = softmax(q @ k.T / np.sqrt(v.shape[-1]), axis=-1)
    return weights @ v
'''

CROSS_UNSTABLE = '''
def cross_attention(x_dec, memory, w_q, w_k, w_v):
    q, k, v = x_dec @ w_q, memory @ w_k, memory @ w_v
    e = np.exp(q @ k.T / np.sqrt(k.shape[-1]))
    return (e / e.sum(axis=-1, keepdims=True)) @ v
'''

# --- KV cache -------------------------------------------------------------------

STEP_QUERY_MISSES_ITSELF = '''
def decode_step(x_t, cache_k, cache_v, w_q, w_k, w_v):
    query = x_t @ w_q
    # Bug: attends over the old cache before appending the new token.
    weights = softmax(cache_k @ query / np.sqrt(w_k.shape[1]))
    out = weights @ cache_v
    return out, np.vstack([cache_k, x_t @ w_k]), np.vstack([cache_v, x_t @ w_v])
'''

STEP_PREPENDS = '''
def decode_step(x_t, cache_k, cache_v, w_q, w_k, w_v):
    # Bug: the new row goes first, so the cache is stored newest-first.
    cache_k = np.vstack([x_t @ w_k, cache_k])
    cache_v = np.vstack([x_t @ w_v, cache_v])
    weights = softmax(cache_k @ (x_t @ w_q) / np.sqrt(cache_k.shape[1]))
    return weights @ cache_v, cache_k, cache_v
'''

DECODE_WRONG_POSITIONS = '''
def decode_with_kv_cache(x, w_q, w_k, w_v):
    outputs = []
    for t in range(len(x)):
        seen = x[:max(t, 1)]  # Bug: recomputes from scratch and stops one token short
        k, v = seen @ w_k, seen @ w_v
        weights = softmax(k @ (x[t] @ w_q) / np.sqrt(k.shape[1]))
        outputs.append(weights @ v)
    return np.array(outputs)
'''

DECODE_RECOMPUTES = '''
def decode_with_kv_cache(x, w_q, w_k, w_v):
    # Right numbers, but no cache: every step re-projects the whole prefix.
    outputs = []
    for t in range(len(x)):
        k, v = x[:t + 1] @ w_k, x[:t + 1] @ w_v
        weights = softmax(k @ (x[t] @ w_q) / np.sqrt(k.shape[1]))
        outputs.append(weights @ v)
    return np.array(outputs)
'''

# --- entropy --------------------------------------------------------------------

ENTROPY_NAN_ON_ZERO = '''
def attention_entropy(weights):
    return -np.sum(weights * np.log(weights), axis=-1)
'''

ENTROPY_LOG2 = '''
def attention_entropy(weights):
    safe = np.where(weights > 0, weights, 1.0)
    return -np.sum(weights * np.log2(safe), axis=-1)
'''

ENTROPY_FIRST_AXIS = '''
def attention_entropy(weights):
    safe = np.where(weights > 0, weights, 1.0)
    return -np.sum(weights * np.log(safe), axis=0)
'''

ENTROPY_KEEPDIMS = '''
def attention_entropy(weights):
    safe = np.where(weights > 0, weights, 1.0)
    return -np.sum(weights * np.log(safe), axis=-1, keepdims=True)
'''

# --- additive attention -----------------------------------------------------------

ADDITIVE_TANH_OUTSIDE = '''
def additive_attention(q, k, v, w_q, w_k, w_score):
    summed = np.expand_dims(q @ w_q, -2) + np.expand_dims(k @ w_k, -3)
    weights = softmax(np.tanh(summed @ w_score), axis=-1)  # Bug: tanh after the projection
    return weights @ v, weights
'''

ADDITIVE_OVER_QUERIES = '''
def additive_attention(q, k, v, w_q, w_k, w_score):
    scores = np.tanh(np.expand_dims(q @ w_q, -2) + np.expand_dims(k @ w_k, -3)) @ w_score
    weights = softmax(scores, axis=-2)  # Bug: normalised over the queries
    return weights @ v, weights
'''

ADDITIVE_2D_ONLY = '''
def additive_attention(q, k, v, w_q, w_k, w_score):
    scores = np.tanh((q @ w_q)[:, None, :] + (k @ w_k)[None, :, :]) @ w_score
    weights = softmax(scores, axis=-1)
    return weights @ v, weights
'''

ADDITIVE_UNSTABLE = '''
def additive_attention(q, k, v, w_q, w_k, w_score):
    scores = np.tanh(np.expand_dims(q @ w_q, -2) + np.expand_dims(k @ w_k, -3)) @ w_score
    e = np.exp(scores)
    weights = e / e.sum(axis=-1, keepdims=True)
    return weights @ v, weights
'''

# --- encoder layer ------------------------------------------------------------------

_ENCODER_INIT = '''
class EncoderLayer(torch.nn.Module):
    def __init__(self, d_model, num_heads, d_ff, norm_first=False):
        super().__init__()
        self.num_heads = num_heads
        self.norm_first = norm_first
        self.w_q = torch.nn.Linear(d_model, d_model)
        self.w_k = torch.nn.Linear(d_model, d_model)
        self.w_v = torch.nn.Linear(d_model, d_model)
        self.w_o = torch.nn.Linear(d_model, d_model)
        self.ff1 = torch.nn.Linear(d_model, d_ff)
        self.ff2 = torch.nn.Linear(d_ff, d_model)
        self.norm1 = torch.nn.LayerNorm(d_model)
        self.norm2 = torch.nn.LayerNorm(d_model)
'''

_ENCODER_HEAD = _ENCODER_INIT + '''
    def attn(self, x, scale_width=None):
        b, n, d = x.shape
        h = self.num_heads
        split = lambda t: t.reshape(b, n, h, d // h).permute(0, 2, 1, 3)
        q, k, v = split(self.w_q(x)), split(self.w_k(x)), split(self.w_v(x))
        width = scale_width or d // h
        weights = torch.softmax(q @ k.transpose(-2, -1) / width ** 0.5, dim=-1)
        return self.w_o((weights @ v).permute(0, 2, 1, 3).reshape(b, n, d))

    def ff(self, x):
        return self.ff2(torch.relu(self.ff1(x)))
'''

ENCODER_NORM_BEFORE_RESIDUAL = _ENCODER_HEAD + '''
    def forward(self, x):
        if self.norm_first:
            x = x + self.attn(self.norm1(x))
            return x + self.ff(self.norm2(x))
        x = x + self.norm1(self.attn(x))  # Bug: LayerNorm before the residual add
        return x + self.norm2(self.ff(x))
'''

ENCODER_IGNORES_NORM_FIRST = _ENCODER_HEAD + '''
    def forward(self, x):
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.ff(x))
'''

ENCODER_SCALES_BY_D_MODEL = _ENCODER_HEAD + '''
    def forward(self, x):
        d = x.shape[-1]
        if self.norm_first:
            x = x + self.attn(self.norm1(x), scale_width=d)
            return x + self.ff(self.norm2(x))
        x = self.norm1(x + self.attn(x, scale_width=d))
        return self.norm2(x + self.ff(x))
'''

ENCODER_PRE_NORM_REUSES_NORM1 = _ENCODER_HEAD + '''
    def forward(self, x):
        if self.norm_first:
            x = x + self.attn(self.norm1(x))
            return x + self.ff(self.norm1(x))  # Bug: norm1 again instead of norm2
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.ff(x))
'''

ENCODER_NO_RELU = _ENCODER_HEAD + '''
    def forward(self, x):
        linear_ff = lambda t: self.ff2(self.ff1(t))  # Bug: no activation between the two layers
        if self.norm_first:
            x = x + self.attn(self.norm1(x))
            return x + linear_ff(self.norm2(x))
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + linear_ff(x))
'''

# --- correct answers in other styles: full marks ----------------------------------------

STYLE_PE_WHERE_WITH_CHECK = '''
def sinusoidal_positional_encoding(n_positions, d_model):
    if d_model % 2 == 1:
        raise ValueError("sinusoidal encodings need an even d_model")
    column = np.arange(d_model)
    angle = np.arange(n_positions)[:, None] / 10000.0 ** (2 * (column // 2) / d_model)
    return np.where(column % 2 == 0, np.sin(angle), np.cos(angle))
'''

STYLE_PE_LOOPS = '''
import math

def sinusoidal_positional_encoding(n_positions, d_model):
    if d_model % 2:
        raise ValueError(f"odd d_model {d_model}")
    pe = np.empty((n_positions, d_model))
    for p in range(n_positions):
        for i in range(d_model // 2):
            angle = p / math.pow(10000, 2 * i / d_model)
            pe[p, 2 * i] = math.sin(angle)
            pe[p, 2 * i + 1] = math.cos(angle)
    return pe
'''

STYLE_PE_EXP_LOG = '''
def sinusoidal_positional_encoding(n_positions, d_model):
    if d_model % 2 != 0:
        raise ValueError("d_model must be even")
    div = np.exp(np.arange(0, d_model, 2) * (-np.log(10000.0) / d_model))
    pos = np.arange(n_positions).reshape(-1, 1)
    return np.dstack([np.sin(pos * div), np.cos(pos * div)]).reshape(n_positions, d_model)
'''

STYLE_MASK_COMPARISON = '''
def causal_mask(n):
    idx = np.arange(n)
    return idx[None, :] <= idx[:, None]
'''

STYLE_MASK_NOT_TRIU = '''
def causal_mask(n):
    return ~np.triu(np.ones((n, n), dtype=bool), k=1)
'''

STYLE_CROSS_EINSUM = '''
def cross_attention(x_dec, memory, w_q, w_k, w_v):
    q = np.einsum("nd,dk->nk", x_dec, w_q)
    k = np.einsum("md,dk->mk", memory, w_k)
    s = np.einsum("nk,mk->nm", q, k) / np.sqrt(w_q.shape[1])
    return np.einsum("nm,mv->nv", softmax(s), memory @ w_v)
'''

STYLE_STEP_CONCATENATE = '''
def decode_step(x_t, cache_k, cache_v, w_q, w_k, w_v):
    k_all = np.concatenate([cache_k, (x_t @ w_k).reshape(1, -1)], axis=0)
    v_all = np.concatenate([cache_v, (x_t @ w_v).reshape(1, -1)], axis=0)
    q = (x_t @ w_q).reshape(1, -1)
    a = softmax(q @ k_all.T / np.sqrt(q.shape[1]))
    return (a @ v_all)[0], k_all, v_all
'''

STYLE_DECODE_PREALLOCATED = '''
def decode_with_kv_cache(x, w_q, w_k, w_v):
    n = x.shape[0]
    out = np.empty((n, w_v.shape[1]))
    k_cache, v_cache = np.empty((0, w_k.shape[1])), np.empty((0, w_v.shape[1]))
    for t in range(n):
        out[t], k_cache, v_cache = decode_step(x[t], k_cache, v_cache, w_q, w_k, w_v)
    return out
'''

STYLE_ENTROPY_NANSUM = '''
def attention_entropy(weights):
    return -np.nansum(weights * np.log(weights), axis=-1)  # 0 * log 0 = nan, skipped (numpy warns)
'''

STYLE_ENTROPY_LOG_WHERE = '''
def attention_entropy(weights):
    logs = np.log(weights, out=np.zeros_like(weights), where=weights > 0)
    return -(weights * logs).sum(-1)
'''

STYLE_ENTROPY_TORCH_XLOGY = '''
def attention_entropy(weights):
    t = torch.as_tensor(weights)
    return -torch.special.xlogy(t, t).sum(dim=-1).numpy()
'''

STYLE_ADDITIVE_LOOP = '''
def additive_attention(q, k, v, w_q, w_k, w_score):
    qh, kh = q @ w_q, k @ w_k
    n_k = k.shape[-2]
    scores = np.stack([np.tanh(qh + kh[..., j:j + 1, :]) @ w_score for j in range(n_k)], axis=-1)
    weights = softmax(scores)
    return weights @ v, weights
'''

STYLE_ADDITIVE_EINSUM = '''
def additive_attention(q, k, v, w_q, w_k, w_score):
    hidden = np.tanh(np.einsum("...qd,dh->...qh", q, w_q)[..., :, None, :]
                     + np.einsum("...kd,dh->...kh", k, w_k)[..., None, :, :])
    scores = np.einsum("...qkh,h->...qk", hidden, w_score)
    weights = softmax(scores)
    return np.einsum("...qk,...kv->...qv", weights, v), weights
'''

STYLE_ENCODER_SDPA = _ENCODER_INIT + '''
    def _sa(self, x):
        b, n, d = x.shape
        q, k, v = (w(x).unflatten(-1, (self.num_heads, -1)).transpose(1, 2) for w in (self.w_q, self.w_k, self.w_v))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.w_o(out.transpose(1, 2).flatten(2))

    def forward(self, x):
        ff = lambda t: self.ff2(F.relu(self.ff1(t)))
        if not self.norm_first:
            h = self.norm1(x + self._sa(x))
            return self.norm2(h + ff(h))
        h = x + self._sa(self.norm1(x))
        return h + ff(self.norm2(h))
'''

CORRECT = {
    "pe_where_with_check": {"sinusoidal_positional_encoding": STYLE_PE_WHERE_WITH_CHECK},
    "pe_python_loops": {"sinusoidal_positional_encoding": STYLE_PE_LOOPS,
                        "causal_mask": STYLE_MASK_COMPARISON},
    "pe_exp_log_dstack": {"sinusoidal_positional_encoding": STYLE_PE_EXP_LOG,
                          "causal_mask": STYLE_MASK_NOT_TRIU},
    "cross_einsum_step_concatenate": {"cross_attention": STYLE_CROSS_EINSUM, "decode_step": STYLE_STEP_CONCATENATE,
                                      "decode_with_kv_cache": STYLE_DECODE_PREALLOCATED},
    "entropy_nansum_warns": {"attention_entropy": STYLE_ENTROPY_NANSUM},
    "entropy_log_where_additive_loop": {"attention_entropy": STYLE_ENTROPY_LOG_WHERE,
                                        "additive_attention": STYLE_ADDITIVE_LOOP},
    "entropy_torch_additive_einsum": {"attention_entropy": STYLE_ENTROPY_TORCH_XLOGY,
                                      "additive_attention": STYLE_ADDITIVE_EINSUM},
    "encoder_with_torch_sdpa": {"EncoderLayer": STYLE_ENCODER_SDPA},
}

PE_CELLS = {"test_sinusoidal_positional_encoding", "test_pe_hidden_values"}
MASK_CELLS = {"test_causal_mask", "test_causal_mask_hidden"}
CROSS_CELLS = {"test_cross_attention", "test_cross_attention_shapes", "test_cross_attention_extreme"}
STEP_CELLS = {"test_decode_step", "test_decode_step_hidden"}
DECODE_CELLS = {"test_decode_with_kv_cache", "test_decode_with_kv_cache_hidden"}
ENTROPY_CELLS = {"test_attention_entropy", "test_entropy_batched", "test_entropy_limits"}
ADDITIVE_CELLS = {"test_additive_attention", "test_additive_batched", "test_additive_extreme"}
ENCODER_CELLS = {"test_encoder_layer", "test_encoder_post_norm", "test_encoder_pre_norm"}

BUGGY = {
    "pe_sin_cos_swapped": ({"sinusoidal_positional_encoding": PE_SIN_COS_SWAPPED}, PE_CELLS),
    "pe_exponent_doubled": ({"sinusoidal_positional_encoding": PE_EXPONENT_DOUBLED}, PE_CELLS),
    "pe_exponent_halved": ({"sinusoidal_positional_encoding": PE_EXPONENT_HALVED}, PE_CELLS),
    "pe_float32": ({"sinusoidal_positional_encoding": PE_FLOAT32}, PE_CELLS),
    "pe_no_error_on_odd_width": ({"sinusoidal_positional_encoding": PE_WHERE_NO_CHECK}, {"test_pe_odd_width"}),
    "mask_strict_j_less_than_i": ({"causal_mask": MASK_STRICT}, MASK_CELLS),
    "mask_upper_triangle": ({"causal_mask": MASK_UPPER}, MASK_CELLS),
    "mask_floats": ({"causal_mask": MASK_FLOATS}, MASK_CELLS),
    "cross_keys_from_decoder": ({"cross_attention": CROSS_KEYS_FROM_DECODER}, CROSS_CELLS),
    # Huge scores give one-hot weights whatever the scale, so the extreme cell cannot tell.
    "cross_scales_by_d_v": ({"cross_attention": CROSS_SCALE_BY_D_V}, CROSS_CELLS - {"test_cross_attention_extreme"}),
    "cross_unstable_softmax": ({"cross_attention": CROSS_UNSTABLE}, {"test_cross_attention_extreme"}),
    # decode_with_kv_cache calls decode_step, so a broken step costs both.
    "step_query_misses_itself": ({"decode_step": STEP_QUERY_MISSES_ITSELF}, STEP_CELLS | DECODE_CELLS),
    # Attention ignores key order, so the outputs stay right; the cache does not.
    "step_prepends_to_cache": ({"decode_step": STEP_PREPENDS}, STEP_CELLS),
    "decode_wrong_positions": ({"decode_with_kv_cache": DECODE_WRONG_POSITIONS}, DECODE_CELLS),
    "decode_recomputes_without_cache": ({"decode_with_kv_cache": DECODE_RECOMPUTES},
                                        {"test_decode_with_kv_cache_hidden"}),
    "entropy_nan_on_zero_weights": ({"attention_entropy": ENTROPY_NAN_ON_ZERO},
                                    {"test_attention_entropy", "test_entropy_limits"}),
    "entropy_in_bits": ({"attention_entropy": ENTROPY_LOG2}, ENTROPY_CELLS),
    "entropy_first_axis": ({"attention_entropy": ENTROPY_FIRST_AXIS}, ENTROPY_CELLS),
    "entropy_keepdims": ({"attention_entropy": ENTROPY_KEEPDIMS}, ENTROPY_CELLS),
    "additive_tanh_outside": ({"additive_attention": ADDITIVE_TANH_OUTSIDE}, ADDITIVE_CELLS),
    "additive_softmax_over_queries": ({"additive_attention": ADDITIVE_OVER_QUERIES}, ADDITIVE_CELLS),
    "additive_2d_only": ({"additive_attention": ADDITIVE_2D_ONLY}, {"test_additive_batched"}),
    "additive_unstable_softmax": ({"additive_attention": ADDITIVE_UNSTABLE}, {"test_additive_extreme"}),
    "encoder_norm_before_residual": ({"EncoderLayer": ENCODER_NORM_BEFORE_RESIDUAL},
                                     {"test_encoder_layer", "test_encoder_post_norm"}),
    "encoder_ignores_norm_first": ({"EncoderLayer": ENCODER_IGNORES_NORM_FIRST}, {"test_encoder_pre_norm"}),
    "encoder_scales_by_d_model": ({"EncoderLayer": ENCODER_SCALES_BY_D_MODEL}, ENCODER_CELLS),
    "encoder_pre_norm_reuses_norm1": ({"EncoderLayer": ENCODER_PRE_NORM_REUSES_NORM1}, {"test_encoder_pre_norm"}),
    "encoder_no_relu": ({"EncoderLayer": ENCODER_NO_RELU}, ENCODER_CELLS),
}
