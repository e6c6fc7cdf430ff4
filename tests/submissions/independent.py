"""Answers written from the student release alone, by solvers who never saw the instructor's
solutions, the hidden checks or the other planted submissions: one complete set per assignment
(the autograded cells; the written answers are left out). Each scored full marks when it was
written, and is kept verbatim as a correct style of its chapter: a hidden test made stricter
than its prompt fails here first.

Their designs differ from the instructor's where the prompts leave room: for instance Chapter 4's
backward runs in one pass with dQ added atomically (the preprocessing kernel clears the float32
buffer, and the bwd_dq_kernel cell holds a cast kernel instead), its decoding runs one program per
(chunk, sequence, key/value head) for the whole group with a merge that folds 16 states at a time,
and its generate keeps all layers' caches in one tensor after a right-padded prefill."""

CELLS = {}

CELLS['ch1_principles'] = {}

CELLS['ch1_principles']['softmax'] = r'''
def softmax(x, axis=-1):
    """Softmax of the array `x` along `axis`; slices along `axis` sum to 1."""
    x = np.asarray(x)
    if np.issubdtype(x.dtype, np.floating):
        out_dtype = x.dtype
        work = np.promote_types(x.dtype, np.float32)   # never sum in float16
    else:
        out_dtype = work = np.float64                  # ints / bools
    # Bring the softmax axis to the end (moveaxis returns a view and checks the axis).
    s = np.moveaxis(x, axis, -1).astype(work)          # astype copies: x is never written to
    # Shift by the max of each slice: softmax(s - c) == softmax(s), and now every
    # exponent is <= 0, so nothing overflows and the largest term is exactly 1.
    # (-inf entries give exp(-inf) = 0 as long as the slice's max is finite.)
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return np.moveaxis(s, -1, axis).astype(out_dtype, copy=False)

'''

CELLS['ch1_principles']['scaled_dot_product_attention'] = r'''
def scaled_dot_product_attention(q, k, v, mask=None):
    """Returns (output, weights) of scaled dot-product attention over the last two axes."""
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        raise ValueError("q, k and v need at least two axes: (..., tokens, width)")
    d_k = q.shape[-1]
    if k.shape[-1] != d_k:
        raise ValueError(f"queries have width {d_k} but keys have width {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"{k.shape[-2]} keys but {v.shape[-2]} values")

    # scores[..., i, j] = q_i . k_j / sqrt(d_k)
    scores = np.einsum("...id,...jd->...ij", q, k) / np.sqrt(d_k)

    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise TypeError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
        # -inf, not a big negative constant: exp(-inf) is exactly 0 however far
        # below the masked scores the kept ones are. np.where broadcasts the mask.
        scores = np.where(mask, scores, -np.inf)

    weights = softmax(scores, axis=-1)
    output = np.matmul(weights, v)
    return output, weights

'''

CELLS['ch1_principles']['multi_head_attention'] = r'''
def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):
    """Multi-head self-attention of x (..., n, d_model) with per-head widths d_k, d_v; returns (..., n, d_out)."""
    x = np.asarray(x)
    w_q, w_k, w_v, w_o = (np.asarray(w) for w in (w_q, w_k, w_v, w_o))
    H = int(num_heads)
    if H < 1:
        raise ValueError("num_heads must be at least 1")
    if w_q.shape != w_k.shape:
        raise ValueError(f"w_q {w_q.shape} and w_k {w_k.shape} must have the same shape")
    if w_q.shape[1] % H or w_v.shape[1] % H:
        raise ValueError(f"{H} heads do not split {w_q.shape[1]} query/key columns "
                         f"and {w_v.shape[1]} value columns evenly")
    d_k, d_v = w_q.shape[1] // H, w_v.shape[1] // H
    if w_o.shape[0] != H * d_v:
        raise ValueError(f"w_o needs {H * d_v} rows, has {w_o.shape[0]}")

    def split(t, width):
        # (..., n, H*width) -> (..., n, H, width) -> (..., H, n, width):
        # head h gets the contiguous columns h*width:(h+1)*width.
        return np.moveaxis(t.reshape(t.shape[:-1] + (H, width)), -2, -3)

    q = split(x @ w_q, d_k)
    k = split(x @ w_k, d_k)
    v = split(x @ w_v, d_v)
    heads, _ = scaled_dot_product_attention(q, k, v)       # (..., H, n, d_v), scaled by 1/sqrt(d_k)
    heads = np.moveaxis(heads, -3, -2)                       # (..., n, H, d_v)
    concat = heads.reshape(heads.shape[:-2] + (H * d_v,))    # heads side by side, in head order
    return concat @ w_o

'''

CELLS['ch1_principles']['commuting_permutations'] = r'''
def commuting_permutations(f, n, d):
    """Every permutation pi of range(n) with f(x[pi]) == f(x)[pi], up to rounding, on random inputs."""
    rng = np.random.default_rng(20240611)
    trials = []
    for _ in range(3):
        x = rng.standard_normal((n, d))
        fx = np.asarray(f(x.copy()))              # copy: f gets its own array to play with
        trials.append((x, fx, np.max(np.abs(fx)) if fx.size else 0.0))

    keep = []
    for pi in itertools.permutations(range(n)):
        idx = list(pi)
        ok = True
        for x, fx, size in trials:
            gap = np.abs(np.asarray(f(x[idx])) - fx[idx])
            # relative to the size of f(x); `not (gap <= ...)` also rejects nan gaps
            if gap.size and not (np.max(gap) <= 1e-8 * size):
                ok = False
                break
        if ok:
            keep.append(tuple(int(i) for i in pi))
    return keep

'''

CELLS['ch1_principles']['softmax_jvp'] = r'''
def softmax_jvp(x, u, axis=-1):
    """The softmax Jacobian of each slice of x along axis, times the matching slice of u."""
    # (J u)_j = sum_l (p_j delta_jl - p_j p_l) u_l = p_j * (u_j - <p, u>):
    # one elementwise product, one sum per slice, no n x n matrix.
    x, u = np.asarray(x), np.asarray(u)
    if x.shape != u.shape:
        raise ValueError(f"x and u must have the same shape, got {x.shape} and {u.shape}")
    p = softmax(x, axis=axis)                              # 0 exactly at -inf entries
    mean_u = np.sum(p * u, axis=axis, keepdims=True)       # <p, u> for every slice
    return p * (u - mean_u)

'''

CELLS['ch1_principles']['passes_attention_checks'] = r'''
import math
import warnings


def _slow_attention(q, k, v, mask=None):
    """Straight from the definition, one query at a time, in plain Python floats."""
    batch, (n_q, d_k), n_k, d_v = q.shape[:-2], q.shape[-2:], k.shape[-2], v.shape[-1]
    keep = np.ones(batch + (n_q, n_k), bool) if mask is None else np.broadcast_to(mask, batch + (n_q, n_k))
    out, w = np.zeros(batch + (n_q, d_v)), np.zeros(batch + (n_q, n_k))
    for b in np.ndindex(*batch):
        for i in range(n_q):
            js = [j for j in range(n_k) if keep[b + (i, j)]]
            s = {j: sum(float(q[b + (i, r)]) * float(k[b + (j, r)]) for r in range(d_k)) / math.sqrt(d_k)
                 for j in js}
            top = max(s.values())
            e = {j: math.exp(s[j] - top) for j in js}
            total = sum(e.values())
            for j in js:
                w[b + (i, j)] = e[j] / total
                out[b + (i,)] += w[b + (i, j)] * v[b + (j,)]
    return out, w, keep


def _probes():
    """(q, k, v, mask) inputs; the sizes n_q, n_k, d_k, d_v and the batch sizes all differ
    so that a swapped axis, a wrong width in the scale or a transposed matrix shows."""
    rng = np.random.default_rng(7)
    probes = []

    # 1. Hand-checkable: d_k = 3, scores ln 3 and 0 -> weights 3/4, 1/4.
    q = np.array([[np.sqrt(3.0) * np.log(3.0), 0.0, 0.0]])
    k = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    v = np.array([[4.0, 0.0], [0.0, 4.0]])
    probes.append((q, k, v, None, np.array([[0.75, 0.25]])))

    def r(*shape, scale=1.0):
        return scale * rng.standard_normal(shape)

    # 2. No batch axes, no mask, n_q=2 != n_k=5, d_k=3 != d_v=4; scores big enough that
    #    forgetting (or squaring) the 1/sqrt(d_k) changes the weights a lot.
    probes.append((r(2, 3, scale=2.0), r(5, 3, scale=2.0), r(5, 4), None, None))
    # 3. Square scores (n_q = n_k = 4), so the wrong softmax axis still has the right shape.
    probes.append((r(4, 3, scale=2.0), r(4, 3, scale=2.0), r(4, 2), None, None))
    # 4. Two batch axes with a full-shape random mask (every row keeps its key 0 at least).
    m = rng.random((2, 3, 4, 6)) < 0.5
    m[..., rng.integers(6)] = True
    probes.append((r(2, 3, 4, 5, scale=1.5), r(2, 3, 6, 5, scale=1.5), r(2, 3, 6, 7), m, None))
    # 5. A causal (n, n) mask shared by a batch of 3 sequences (not symmetric: mask.T differs).
    causal = np.tril(np.ones((4, 4), bool))
    probes.append((r(3, 4, 2, scale=2.0), r(3, 4, 2, scale=2.0), r(3, 4, 5), causal, None))
    # 6. A padding mask with length 1 in place of n_q, batch of 2, n_q=3 != n_k=5.
    pad = np.array([[True, True, True, False, False], [True, False, True, True, False]])[:, None, :]
    probes.append((r(2, 3, 4, scale=2.0), r(2, 5, 4, scale=2.0), r(2, 5, 6), pad, None))
    # 7. Batch (2, 3) with a padding mask of shape (2, 1, 1, 5): one per sequence, every head.
    pad4 = np.ones((2, 1, 1, 5), bool)
    pad4[0, ..., 3:] = False
    pad4[1, ..., :2] = False
    probes.append((r(2, 3, 4, 2, scale=2.0), r(2, 3, 5, 2, scale=2.0), r(2, 3, 5, 3), pad4, None))
    # 8. Three batch axes, a mask with fewer leading axes than q: (3, 1, 4, 6) vs batch (2, 3, 1).
    m3 = rng.random((3, 1, 4, 6)) < 0.6
    m3[..., 5] = True
    probes.append((r(2, 3, 1, 4, 3), r(2, 3, 1, 6, 3), r(2, 3, 1, 6, 2), m3, None))
    # 9. A single query and a single key, with and without a mask.
    probes.append((r(1, 3), r(1, 3), r(1, 2), None, None))
    probes.append((r(2, 1, 3), r(2, 1, 3), r(2, 1, 2), np.array([[True]]), None))
    # 10. Huge scores, no mask: one row near +1e5, the other near -1e5 (a naive exp or a max
    #     taken over the wrong axis gives inf/nan), with near-ties so the exact weights matter.
    q = np.array([[300.0, 200.0], [-300.0, -200.0]])
    k = np.array([[300.0, 200.0], [300.0, 200.0 + 0.003], [299.997, 200.0]])
    probes.append((q, k, r(3, 4), None, None))
    # 11. Masked keys scoring far ABOVE the kept ones, kept ones near 0: the max must be over
    #     the kept keys only.
    q = np.array([[1000.0, 0.0], [0.0, 1.0]])
    k = np.array([[1000.0, 0.0], [0.0, 0.5], [0.1, -0.3]])
    m = np.array([[False, True, True], [True, False, True]])
    probes.append((q, k, r(3, 5), m, None))
    # 12. Kept keys scoring far BELOW zero (about -1e6) and the masked one far above: any
    #     finite fill value (-1e4, -1e9, ...) would win over the kept keys.
    q = np.array([[1000.0], [-1000.0]])
    k = np.array([[-1000.0], [1000.0], [-1000.5]])
    m = np.array([[True, False, True], [False, True, True]])
    probes.append((q, k, np.array([[1.0, 0.0], [2.0, 5.0], [3.0, -1.0]]), m, None))
    probes.append((q * 1e3, k * 1e3, np.array([[1.0], [2.0], [3.0]]), np.array([[True, False, False]] * 2), None))
    return probes


def passes_attention_checks(attention):
    """True when attention(q, k, v, mask) behaves as scaled dot-product attention on every probe."""
    try:
        for q, k, v, mask, known_weights in _probes():
            originals = [a.copy() for a in (q, k, v)] + ([] if mask is None else [mask.copy()])
            expected_out, expected_w, keep = _slow_attention(q, k, v, mask)
            if known_weights is not None and not np.allclose(expected_w, known_weights):
                raise AssertionError("my own reference is wrong")   # guards the reference itself
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")                 # a correct one may warn; judge values
                result = attention(q, k, v, mask=mask)
            output, weights = result
            output, weights = np.asarray(output), np.asarray(weights)
            if output.shape != expected_out.shape or weights.shape != expected_w.shape:
                return False
            if not (np.all(np.isfinite(output)) and np.all(np.isfinite(weights))):
                return False
            if not np.all(weights[~keep] == 0):                 # the spec says exactly 0
                return False
            if not np.allclose(weights.sum(axis=-1), 1.0, rtol=0, atol=1e-9):
                return False
            if not (np.allclose(weights, expected_w, rtol=1e-6, atol=1e-9)
                    and np.allclose(output, expected_out, rtol=1e-6, atol=1e-9)):
                return False
            now = (q, k, v) + (() if mask is None else (mask,))
            if any(not np.array_equal(a, b) for a, b in zip(now, originals)):
                return False                                    # it wrote into its inputs
    except Exception:
        return False
    return True

'''

CELLS['ch2_variants'] = {}

CELLS['ch2_variants']['rotary_half_split'] = r'''
def rotary_half_split(x, lengths, rotary_dim=None):
    """Rotate pairs (l, l + r/2) of the first r coordinates of every real row by its position."""
    # float64 copy: the input is never touched, and the result has the asked dtype
    out = np.array(x, dtype=np.float64, copy=True)
    if out.ndim != 4:
        raise ValueError(f"x must have shape (batch, heads, n, d), found shape {out.shape}")
    n_batch, _, n, d = out.shape
    r = d if rotary_dim is None else int(rotary_dim)
    if r < 0 or r % 2 != 0:
        raise ValueError(f"rotary_dim must be a non-negative even number, found {rotary_dim}")
    if r > d:
        raise ValueError(f"rotary_dim={r} is larger than the row width d={d}")
    lengths = np.asarray(lengths).reshape(-1)
    if lengths.shape[0] != n_batch:
        raise ValueError(f"expected {n_batch} lengths, found {lengths.shape[0]}")
    if np.any(lengths < 0) or np.any(lengths > n):
        raise ValueError(f"lengths must lie between 0 and n={n}, found {lengths}")
    half = r // 2
    if half == 0 or n == 0:
        return out

    # position of every row: the first real token of sequence b (row n - lengths[b]) is at 0
    pos = np.arange(n)[None, :] - (n - lengths.astype(np.int64))[:, None]   # (batch, n)
    real = pos >= 0
    pos = np.where(real, pos, 0).astype(np.float64)
    omega = 10000.0 ** (-2.0 * np.arange(half) / r)                      # (r/2,)
    angle = pos[:, :, None] * omega[None, None, :]                        # (batch, n, r/2)
    cos = np.cos(angle)[:, None]                                           # (batch, 1, n, r/2): same for every head
    sin = np.sin(angle)[:, None]

    a = out[..., :half].copy()
    b = out[..., half:r].copy()
    keep = real[:, None, :, None]                                          # padding rows stay as they are
    out[..., :half] = np.where(keep, a * cos - b * sin, a)
    out[..., half:r] = np.where(keep, a * sin + b * cos, b)
    return out
'''

CELLS['ch2_variants']['left_padded_causal_attention'] = r'''
def left_padded_causal_attention(q, k, v, lengths):
    """Causal attention over left-padded sequences; rows with no key are zeros."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    n_batch, n, d_k = q.shape
    d_v = v.shape[-1]
    lengths = np.asarray(lengths).reshape(-1)
    if lengths.shape[0] != n_batch:
        raise ValueError(f"expected {n_batch} lengths, found {lengths.shape[0]}")
    if np.any(lengths < 0) or np.any(lengths > n):
        raise ValueError(f"lengths must lie between 0 and n={n}, found {lengths}")
    if n == 0:
        return np.zeros((n_batch, 0, d_v))

    # real[b, j]: token j of sequence b is real (the last lengths[b] positions)
    real = np.arange(n)[None, :] >= (n - lengths)[:, None]                # (batch, n)
    # blank out the padding first, so that junk (however large) never enters any product
    q0 = np.where(real[:, :, None], q, 0.0)
    k0 = np.where(real[:, :, None], k, 0.0)
    v0 = np.where(real[:, :, None], v, 0.0)

    scores = np.einsum("bik,bjk->bij", q0, k0) / np.sqrt(d_k)
    allowed = np.tril(np.ones((n, n), dtype=bool))[None] & real[:, None, :]   # causal AND real key
    has_key = allowed.any(axis=-1, keepdims=True)                            # (batch, n, 1)
    # a row with no key gets dummy finite scores, then its weights are zeroed
    scores = np.where(allowed, scores, -np.inf)
    scores = np.where(has_key, scores, 0.0)
    weights = np.where(has_key, softmax(scores, axis=-1), 0.0)
    return np.einsum("bij,bjc->bic", weights, v0)
'''

CELLS['ch2_variants']['decode_step'] = r'''
def decode_step(x_t, cache_k, cache_v, w_q, w_k, w_v, n_heads):
    """Grouped-query decoding step. Returns (output_t, cache_k, cache_v)."""
    x_t = np.asarray(x_t, dtype=np.float64)
    d_head = w_q.shape[1] // n_heads
    g = w_k.shape[1] // d_head
    if d_head * n_heads != w_q.shape[1] or g * d_head != w_k.shape[1] or w_v.shape[1] != w_k.shape[1]:
        raise ValueError("the projection widths do not split into heads of d_head entries")
    if g == 0 or n_heads % g != 0:
        raise ValueError(f"{g} key-value heads do not divide {n_heads} query heads")
    group = n_heads // g                                   # query heads per key-value head

    q_t = (x_t @ w_q).reshape(n_heads, d_head)
    k_t = (x_t @ w_k).reshape(g, 1, d_head)
    v_t = (x_t @ w_v).reshape(g, 1, d_head)
    # concatenate makes new arrays: the caches we were given stay as they are
    new_k = np.concatenate([np.asarray(cache_k, dtype=np.float64), k_t], axis=1)   # (g, t + 1, d_head)
    new_v = np.concatenate([np.asarray(cache_v, dtype=np.float64), v_t], axis=1)

    # query head h = kv * group + r reads key-value head kv = h // group
    q_grouped = q_t.reshape(g, group, d_head)
    scores = np.einsum("grd,gsd->grs", q_grouped, new_k) / np.sqrt(d_head)          # (g, group, t + 1)
    out = np.einsum("grs,gsd->grd", softmax(scores, axis=-1), new_v)
    return out.reshape(n_heads * d_head), new_k, new_v
'''

CELLS['ch2_variants']['decode_with_kv_cache'] = r'''
def decode_with_kv_cache(x, w_q, w_k, w_v, n_heads, prompt_length):
    """Prefill the first prompt_length tokens at once, then decode_step the rest; returns (n, n_heads * d_head)."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    p = int(prompt_length)
    if not 0 <= p <= n:
        raise ValueError(f"prompt_length must lie between 0 and n={n}, found {prompt_length}")
    d_head = w_q.shape[1] // n_heads
    g = w_k.shape[1] // d_head
    if g == 0 or n_heads % g != 0:
        raise ValueError(f"{g} key-value heads do not divide {n_heads} query heads")
    group = n_heads // g

    out = np.zeros((n, n_heads * d_head))
    # prefill: one causal pass over the prompt, in the cache layout (head, token, width)
    prompt = x[:p]
    cache_k = np.ascontiguousarray((prompt @ w_k).reshape(p, g, d_head).transpose(1, 0, 2))
    cache_v = np.ascontiguousarray((prompt @ w_v).reshape(p, g, d_head).transpose(1, 0, 2))
    if p > 0:
        q = (prompt @ w_q).reshape(p, g, group, d_head)                       # head h = kv * group + r
        scores = np.einsum("igrd,gjd->grij", q, cache_k) / np.sqrt(d_head)    # (g, group, p, p)
        scores = np.where(np.tri(p, dtype=bool), scores, -np.inf)
        o = np.einsum("grij,gjd->igrd", softmax(scores, axis=-1), cache_v)    # (p, g, group, d_head)
        out[:p] = o.reshape(p, n_heads * d_head)

    # decode: one step per remaining token, each with the caches the previous step returned
    for t in range(p, n):
        out[t], cache_k, cache_v = decode_step(x[t], cache_k, cache_v, w_q, w_k, w_v, n_heads)
    return out
'''

CELLS['ch2_variants']['entropy_temperature_slope'] = r'''
def entropy_temperature_slope(scores, tau):
    """dH/dtau of H(softmax(scores / tau)) along the last axis."""
    # Derivation, with z = s / tau and p = softmax(z):
    #   dH/dz_k = -sum_j (ln p_j + 1) p_j (delta_jk - p_k) = -p_k (ln p_k + H)
    #   ln p_k + H = z_k - LSE(z) + LSE(z) - sum_j p_j z_j = z_k - E_p[z]
    #   dz_k/dtau = -z_k / tau
    # so dH/dtau = (1/tau) sum_k p_k z_k (z_k - E_p[z]) = Var_p(z) / tau = Var_p(s) / tau^3.
    s = np.asarray(scores, dtype=np.float64)
    tau = float(tau)
    if not tau > 0:
        raise ValueError(f"tau must be positive, found {tau}")
    # shift every row by its largest score: exact for nearby scores, and the variance ignores shifts
    u = s - s.max(axis=-1, keepdims=True)
    finite = np.isfinite(u)
    z = np.divide(u, tau, out=np.full(u.shape, -np.inf), where=finite)   # masked keys stay -inf, even at tau = inf
    p = softmax(z, axis=-1)
    u = np.where(finite, u, 0.0)                          # masked keys: p = 0, keep them out of 0 * inf
    mean = np.sum(p * u, axis=-1, keepdims=True)
    var = np.sum(p * (u - mean) ** 2, axis=-1)            # two-pass variance: no cancellation
    return var / tau / tau / tau                          # three divisions: tau**3 cannot underflow
'''

CELLS['ch2_variants']['additive_attention_grads'] = r'''
def additive_attention_grads(q, k, v, u_q, u_k, w_score, d_out, key_mask=None):
    """dL/dq and dL/dw_score for L = sum(d_out * output) of additive attention; returns (dq, dw_score)."""
    q, k, v, u_q, u_k, w_score, d_out = (np.asarray(a, dtype=np.float64)
                                         for a in (q, k, v, u_q, u_k, w_score, d_out))
    n_k = k.shape[-2]
    if key_mask is None:
        key_mask = np.ones(k.shape[:-1], dtype=bool)
    keep = np.asarray(key_mask, dtype=bool)[..., None, :]                   # (..., 1, n_k)
    if n_k == 0:                                                            # no key anywhere: output 0
        return np.zeros(q.shape), np.zeros(w_score.shape)

    # forward
    hidden = np.tanh((q @ u_q)[..., :, None, :] + (k @ u_k)[..., None, :, :])   # (..., n_q, n_k, d_a)
    s = hidden @ w_score                                                         # (..., n_q, n_k)
    has_key = keep.any(axis=-1, keepdims=True)                                   # (..., 1, 1)
    s = np.where(keep, s, -np.inf)
    s = np.where(has_key, s, 0.0)                          # dummy finite row, zeroed just below
    p = np.where(has_key & keep, softmax(s, axis=-1), 0.0)

    # backward: L = sum G * (p v)
    dp = d_out @ np.swapaxes(v, -1, -2)                    # (..., n_q, n_k)
    dp = np.where(keep, dp, 0.0)                           # junk values under masked keys play no part
    ds = p * (dp - np.sum(p * dp, axis=-1, keepdims=True))  # softmax Jacobian times a vector
    dw_score = np.tensordot(ds, hidden, axes=ds.ndim)    # summed over batch axes, queries, keys
    dpre = ds[..., None] * w_score * (1.0 - hidden ** 2)   # through tanh: (..., n_q, n_k, d_a)
    dq = dpre.sum(axis=-2) @ u_q.T                          # sum over keys, then back through U_q
    return dq, dw_score
'''

CELLS['ch2_variants']['DecoderLayer'] = r'''
import math


class DecoderLayer(torch.nn.Module):
    """Causal self-attention, cross-attention to the memory and a feed-forward block."""

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

    def _attend(self, x, source, proj, causal):
        """Multi-head attention: queries from x, keys and values from source, projections proj."""
        to_q, to_k, to_v, to_o = proj
        batch, n_q, d_model = x.shape
        n_k = source.shape[1]
        h = self.num_heads
        d_head = d_model // h

        def heads(t, n):                                    # (batch, n, d_model) -> (batch, h, n, d_head)
            return t.reshape(batch, n, h, d_head).transpose(1, 2)

        q, k, v = heads(to_q(x), n_q), heads(to_k(source), n_k), heads(to_v(source), n_k)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)            # (batch, h, n_q, n_k)
        if causal:
            future = torch.ones(n_q, n_k, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v                          # (batch, h, n_q, d_head)
        return to_o(out.transpose(1, 2).reshape(batch, n_q, h * d_head))

    def forward(self, x, memory):
        self_proj = (self.self_q, self.self_k, self.self_v, self.self_o)
        cross_proj = (self.cross_q, self.cross_k, self.cross_v, self.cross_o)
        ff = lambda z: self.ff2(F.relu(self.ff1(z)))
        if self.norm_first:
            z = self.norm1(x)
            x = x + self._attend(z, z, self_proj, causal=True)
            x = x + self._attend(self.norm2(x), memory, cross_proj, causal=False)
            x = x + ff(self.norm3(x))
        else:
            x = self.norm1(x + self._attend(x, x, self_proj, causal=True))
            x = self.norm2(x + self._attend(x, memory, cross_proj, causal=False))
            x = self.norm3(x + ff(x))
        return x
'''

CELLS['ch3_complexity'] = {}

CELLS['ch3_complexity']['training_flops'] = r'''
def training_flops(n, d_model, heads, d_head):
    """FLOPs of the matrix products of one forward and backward pass of a multi-head layer."""
    n, d_model, heads, d_head = (int(a) for a in (n, d_model, heads, d_head))
    inner = heads * d_head                 # width of the concatenated heads, need not be d_model
    # every matrix product of the forward pass, as (r1, r2, r3, how many times)
    products = [
        (n, d_model, inner, 3),            # X W_Q, X W_K, X W_V
        (n, d_head, n, heads),             # Q^(h) K^(h)T, one per head
        (n, n, d_head, heads),             # A^(h) V^(h), one per head
        (n, inner, d_model, 1),            # concat(heads) W_O
    ]
    forward = sum(2 * r1 * r2 * r3 * times for r1, r2, r3, times in products)
    # Backward: both operands of every product need a gradient (X and the weights are
    # trained, Q, K, V, A depend on them), so each product is repeated twice with the
    # same three sizes: dL/dleft = G right^T and dL/dright = left^T G.
    backward = 2 * forward
    return forward + backward
'''

CELLS['ch3_complexity']['longest_fitting'] = r'''
def longest_fitting(cost, budget):
    """Largest n >= 1 with cost(n) <= budget, for any non-decreasing cost, in O(log n) calls."""
    def fits(m):
        return cost(int(m)) <= budget

    if not fits(1):
        raise ValueError(f"nothing fits the budget {budget}: even a chunk of 1 token costs more")

    # Phase 1: find the bit length L of the answer N by trying 2, 4, 8, ...
    # After the loop 2**(top) <= N < 2**(top + 1), i.e. bit 'top' is N's highest bit.
    top = 0
    while fits(1 << (top + 1)):
        top += 1

    # Phase 2: the highest bit of N is known; decide every lower bit from the top down.
    # 'answer' always fits, and answer + 2**(bit+1) never fits, so each test settles one bit.
    answer = 1 << top
    for bit in range(top - 1, -1, -1):
        candidate = answer | (1 << bit)
        if fits(candidate):
            answer = candidate
    return answer
'''

CELLS['ch3_complexity']['receptive_field'] = r'''
def receptive_field(kernel_widths, dilations, strides):
    """Input positions seen by one output of a stack of strided, dilated convolutions."""
    widths, dils, steps = list(kernel_widths), list(dilations), list(strides)
    if not len(widths) == len(dils) == len(steps):
        raise ValueError("kernel_widths, dilations and strides must have the same length")
    # Walk down from the top layer. 'extent' is (span - 1) measured in positions of the
    # sequence the current layer outputs; one output of the top layer has extent 0.
    # Layer i's output u reads inputs u*s, u*s - rho, ..., u*s - (w-1)*rho, so an
    # extent e among its outputs becomes e*s + (w-1)*rho among its inputs.
    extent = 0
    for w, rho, s in zip(reversed(widths), reversed(dils), reversed(steps)):
        extent = extent * int(s) + (int(w) - 1) * int(rho)
    return extent + 1
'''

CELLS['ch3_complexity']['dilated_local_attention'] = r'''
def dilated_local_attention(q, k, v, radius, dilation, n_global=0):
    """Query i attends to keys i + m * dilation, |m| <= radius, and to the first n_global keys."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    n, d_k = q.shape
    d_v = v.shape[1]
    if k.shape != (n, d_k) or v.shape[0] != n:
        raise ValueError(f"shapes do not match: q {q.shape}, k {k.shape}, v {v.shape}")
    if radius < 0 or dilation < 1 or n_global < 0:
        raise ValueError("need radius >= 0, dilation >= 1 and n_global >= 0")
    if n == 0:
        return np.zeros((0, d_v))

    # Clip huge arguments: a step of n or more, or more than n steps, reaches nothing more.
    rho = int(min(dilation, n))
    r = int(min(radius, n))
    g = int(min(n_global, n))

    # The attention is stored as a ragged list of (query, key) pairs, grouped by query:
    # only keys that exist are listed, so there is no padding and no n x n array.
    i = np.arange(n)
    lo = np.maximum(-r, -(i // rho))                  # smallest step a with i + a*rho >= 0
    hi = np.minimum(r, (n - 1 - i) // rho)            # largest step a with i + a*rho <= n - 1
    count = hi - lo + 1
    count[:g] = 0                                     # global queries get all keys below
    rows_w = np.repeat(i, count)
    first = np.cumsum(count) - count                  # where each query's run of pairs starts
    cols_w = rows_w + (lo[rows_w] + np.arange(rows_w.size) - first[rows_w]) * rho
    del first

    # Global queries: every key.
    rows_gq = np.repeat(np.arange(g), n)
    cols_gq = np.tile(i, g)
    # Other queries: the global keys that their window does not already hold.
    rows_gk = np.repeat(np.arange(g, n), g)
    cols_gk = np.tile(np.arange(g), n - g)
    gap = rows_gk - cols_gk                           # > 0 here, since key < g <= query
    in_window = (gap % rho == 0) & (gap <= r * rho)
    rows_gk, cols_gk = rows_gk[~in_window], cols_gk[~in_window]
    del gap, in_window

    rows = np.concatenate([rows_gq, rows_w, rows_gk])
    cols = np.concatenate([cols_gq, cols_w, cols_gk])
    del rows_gq, cols_gq, rows_w, cols_w, rows_gk, cols_gk
    order = np.argsort(rows, kind="stable")
    rows, cols = rows[order], cols[order]
    del order
    starts = np.searchsorted(rows, i)                 # every query sees at least itself

    # Scores one feature at a time, so no (pairs, d) array is gathered.
    scores = np.zeros(rows.size)
    for c in range(d_k):
        scores += q[rows, c] * k[cols, c]
    scores /= np.sqrt(d_k)
    scores -= np.maximum.reduceat(scores, starts)[rows]   # stable: the row maximum becomes 0
    weights = np.exp(scores)
    del scores
    weights /= np.add.reduceat(weights, starts)[rows]

    out = np.empty((n, d_v))
    for c in range(d_v):
        out[:, c] = np.add.reduceat(weights * v[cols, c], starts)
    return out
'''

CELLS['ch3_complexity']['causal_linear_attention'] = r'''
def causal_linear_attention(q, k, v, chunk):
    """Causal kernelised attention with phi = elu + 1, a causal block per chunk plus a carried state."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    if q.ndim < 2 or q.shape != k.shape or v.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"expected q, k of shape (..., n, d_k) and v of shape (..., n, d_v): "
                         f"got {q.shape}, {k.shape}, {v.shape}")
    if int(chunk) != chunk or chunk < 1:
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
    chunk = int(chunk)
    *lead, n, d_k = q.shape
    d_v = v.shape[-1]

    def phi(x):                                       # elu(x) + 1, no overflow for large x
        return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))

    size = min(chunk, n)
    keep = np.tril(np.ones((size, size), dtype=bool))  # causal mask inside a chunk
    gamma = np.zeros((*lead, d_k, d_v))                # sum of phi(k_j)^T v_j over earlier chunks
    z = np.zeros((*lead, d_k))                         # sum of phi(k_j) over earlier chunks
    out = np.empty((*lead, n, d_v))

    for start in range(0, n, size):
        stop = min(start + size, n)
        m = stop - start
        fq = phi(q[..., start:stop, :])
        fk = phi(k[..., start:stop, :])
        vc = v[..., start:stop, :]
        block = fq @ np.swapaxes(fk, -1, -2)           # (..., m, m) kernel inside the chunk
        block *= keep[:m, :m]
        numer = fq @ gamma + block @ vc                # earlier chunks through the state, plus this one
        denom = (fq @ z[..., :, None])[..., 0] + block.sum(axis=-1)
        del block
        out[..., start:stop, :] = numer / denom[..., None]
        gamma += np.swapaxes(fk, -1, -2) @ vc          # carry this chunk into the state
        z += fk.sum(axis=-2)
    return out
'''

CELLS['ch4_flash'] = {}

CELLS['ch4_flash']['merge_softmax_states'] = r'''
def merge_softmax_states(m, l, o):
    """Merge the softmax states of C key chunks (axis 0) into the state of the whole row."""
    m, l, o = (np.asarray(a, dtype=np.float64) for a in (m, l, o))
    m_row = m.max(axis=0)                                   # -inf only where every chunk is empty
    anchor = np.where(np.isfinite(m_row), m_row, 0.0)       # a finite reference for the exponent
    with np.errstate(invalid="ignore", over="ignore"):
        # each chunk's sum measured against the row's maximum: l_c e^(m_c - m), 0 for an empty chunk
        weight = np.where(np.isfinite(m), l * np.exp(np.where(np.isfinite(m), m - anchor, 0.0)), 0.0)
    l_row = weight.sum(axis=0)
    mixed = (weight[..., None] * o).sum(axis=0)
    safe = np.where(l_row > 0, l_row, 1.0)
    o_row = np.where((l_row > 0)[..., None], mixed / safe[..., None], 0.0)
    return m_row, l_row, o_row
'''

CELLS['ch4_flash']['tiled_attention_backward'] = r'''
def tiled_attention_backward(q, k, v, o, do, lse, block_m, block_n, causal=False):
    """(dq, dk, dv) of exact attention, recomputing one block_m x block_n tile of P at a time from lse."""
    q, k, v, o, do, lse = (np.asarray(a, dtype=np.float64) for a in (q, k, v, o, do, lse))
    n_q, d = q.shape[-2:]
    n_k, d_v = v.shape[-2:]
    lead = q.shape[:-2]
    scale = 1.0 / math.sqrt(d)
    # flatten the batch axes (a view for contiguous inputs; at worst a copy of the inputs' size)
    Q, K, V = q.reshape(-1, n_q, d), k.reshape(-1, n_k, d), v.reshape(-1, n_k, d_v)
    O, dO, LSE = o.reshape(-1, n_q, d_v), do.reshape(-1, n_q, d_v), lse.reshape(-1, n_q)
    dq, dk, dv = np.zeros(Q.shape), np.zeros(K.shape), np.zeros(V.shape)
    delta = np.einsum("bie,bie->bi", dO, O)                 # D_i = dO_i . O_i, N numbers per head
    for b in range(Q.shape[0]):
        for j0 in range(0, n_k, block_n):                   # one key block at a time: dK_j, dV_j stay "on chip"
            j1 = min(j0 + block_n, n_k)
            kj, vj = K[b, j0:j1], V[b, j0:j1]
            dk_j, dv_j = np.zeros(kj.shape), np.zeros(vj.shape)
            first = (j0 // block_m) * block_m if causal else 0   # query blocks wholly above the diagonal skipped
            for i0 in range(first, n_q, block_m):
                i1 = min(i0 + block_m, n_q)
                qi, doi = Q[b, i0:i1], dO[b, i0:i1]
                s = qi @ kj.T * scale
                p = np.exp(s - LSE[b, i0:i1, None])        # <= 1: LSE is at least every visible score
                if causal and j1 - 1 > i0:                  # a tile that straddles the diagonal
                    p = np.where(np.arange(i0, i1)[:, None] >= np.arange(j0, j1)[None, :], p, 0.0)
                dv_j += p.T @ doi
                ds = p * (doi @ vj.T - delta[b, i0:i1, None])
                dq[b, i0:i1] += ds @ kj * scale
                dk_j += ds.T @ qi * scale
            dk[b, j0:j1], dv[b, j0:j1] = dk_j, dv_j
    return dq.reshape(lead + (n_q, d)), dk.reshape(lead + (n_k, d)), dv.reshape(lead + (n_k, d_v))
'''

CELLS['ch4_flash']['hbm_traffic_backward'] = r'''
def hbm_traffic_backward(n, d, block_m, block_n):
    """Elements moved by the two-pass tiled backward of one head."""
    n, d = int(n), int(d)
    key_blocks, query_blocks = -(-n // int(block_n)), -(-n // int(block_m))
    preprocess = 2 * n * d + n                                    # O, dO read; D written
    dkdv = 4 * n * d + key_blocks * (2 * n * d + 2 * n)           # K, V in and dK, dV out once; Q, dO, lse, D per key block
    dq = (2 * n * d + 2 * n) + n * d + query_blocks * 2 * n * d   # Q, dO, lse, D in and dQ out once; K, V per query block
    return preprocess + dkdv + dq
'''

CELLS['ch4_flash']['bwd_preprocess_kernel'] = r'''
@triton.jit
def bwd_preprocess_kernel(O, DO, Delta, DQacc, seq_len, head_dim, num_heads,
                          stride_ob, stride_oh, stride_on, stride_dob, stride_doh, stride_don,
                          BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, CLEAR_DQ: tl.constexpr):
    """Delta[b, h, i] = sum_d O[b, h, i, d] * dO[b, h, i, d] for one block of rows of one (batch, head).

    My design accumulates dQ with atomic adds (see bwd_dkdv_kernel), so its float32 accumulator
    must start at zero: with CLEAR_DQ this kernel also clears the same rows of DQacc (contiguous,
    ((b * H + h) * N + i) * d + c), which saves a separate memset launch."""
    row_block = tl.program_id(0).to(tl.int64)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // num_heads, bh % num_heads
    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    inside = (rows[:, None] < seq_len) & (dims[None, :] < head_dim)
    o = tl.load(O + b * stride_ob + h * stride_oh + rows[:, None] * stride_on + dims[None, :], mask=inside, other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + rows[:, None] * stride_don + dims[None, :], mask=inside, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(Delta + bh * seq_len + rows, delta, mask=rows < seq_len)
    if CLEAR_DQ:
        tl.store(DQacc + (bh * seq_len + rows[:, None]) * head_dim + dims[None, :],
                 tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32), mask=inside)
'''

CELLS['ch4_flash']['bwd_dkdv_kernel'] = r'''
@triton.jit
def bwd_dkdv_kernel(Q, K, V, DO, Lse, Delta, DK, DV, DQacc, seq_len, head_dim, num_kv_heads, sm_scale,
                    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                    stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
                    stride_lb, stride_lh, stride_ln,
                    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    IS_CAUSAL: tl.constexpr):
    """One program: dK and dV for BLOCK_N keys of one (batch, key/value head), summed over
    the GROUP query heads that share it; and, in the same pass (one-kernel design, as in
    FlashAttention-2), this key block's share dS K * scale of dQ, added atomically into the
    float32 buffer DQacc (contiguous, ((b * H + h) * N + i) * d + c).

    The tile is kept transposed, keys along the rows (S^T = K Q^T): dK and dV then accumulate
    without a transpose, and only dQ's product needs one."""
    col_block = tl.program_id(0).to(tl.int64)
    bkv = tl.program_id(1).to(tl.int64)
    b, kv = bkv // num_kv_heads, bkv % num_kv_heads
    keys = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    key_ok = keys < seq_len
    kv_mask = key_ok[:, None] & (dims[None, :] < head_dim)
    k = tl.load(K + b * stride_kb + kv * stride_kh + keys[:, None] * stride_kn + dims[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + b * stride_vb + kv * stride_vh + keys[:, None] * stride_vn + dims[None, :], mask=kv_mask, other=0.0)
    dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    offs_m = tl.arange(0, BLOCK_M)
    # Causal: query blocks that end before this key block's first key see none of it.
    first = (col_block * BLOCK_N // BLOCK_M) * BLOCK_M if IS_CAUSAL else 0
    for r in range(GROUP):                       # the query heads j * GROUP + r that read this head
        h = kv * GROUP + r
        bh = bkv * GROUP + r                     # = b * H + h, the row of lse, Delta and dQ
        q_base = Q + b * stride_qb + h * stride_qh
        do_base = DO + b * stride_dob + h * stride_doh
        lse_base = Lse + b * stride_lb + h * stride_lh
        for start_m in range(first, seq_len, BLOCK_M):
            rows = start_m + offs_m
            row_ok = rows < seq_len
            q_mask = row_ok[:, None] & (dims[None, :] < head_dim)
            q = tl.load(q_base + rows[:, None] * stride_qn + dims[None, :], mask=q_mask, other=0.0)
            do = tl.load(do_base + rows[:, None] * stride_don + dims[None, :], mask=q_mask, other=0.0)
            lse = tl.load(lse_base + rows * stride_ln, mask=row_ok, other=float("inf"))
            delta = tl.load(Delta + bh * seq_len + rows, mask=row_ok, other=0.0)
            s_t = tl.dot(k, tl.trans(q)) * sm_scale                 # (BLOCK_N, BLOCK_M) scores, transposed
            keep = key_ok[:, None] & row_ok[None, :]
            if IS_CAUSAL:
                keep = keep & (keys[:, None] <= rows[None, :])
            # P = e^(S - LSE) <= 1: never overflows; padded or hidden entries get exponent -inf, so 0 exactly
            p_t = tl.exp(tl.where(keep, s_t - lse[None, :], -float("inf")))
            dv += tl.dot(p_t.to(do.dtype), do)
            dp_t = tl.dot(v, tl.trans(do))                          # dP^T = V dO^T
            ds_t = p_t * (dp_t - delta[None, :])                    # dS = P o (dP - D)
            dk += tl.dot(ds_t.to(q.dtype), q)
            dq_part = tl.dot(tl.trans(ds_t).to(k.dtype), k) * sm_scale
            tl.atomic_add(DQacc + (bh * seq_len + rows[:, None]) * head_dim + dims[None, :], dq_part,
                          mask=q_mask, sem="relaxed")
    out = (bkv * seq_len + keys[:, None]) * head_dim + dims[None, :]
    tl.store(DK + out, (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=kv_mask)
'''

CELLS['ch4_flash']['bwd_dq_kernel'] = r'''
# My design has no separate dQ pass: bwd_dkdv_kernel adds each tile's share of dQ atomically into
# a float32 buffer. This cell keeps the only other kernel it needs: for 16-bit inputs, the cast of
# that buffer to the input's type (float32 inputs accumulate straight into dq and skip it).
@triton.jit
def bwd_dq_cast_kernel(DQacc, DQ, numel, BLOCK: tl.constexpr):
    """DQ[i] = DQacc[i] cast to DQ's type, for one block of the flattened gradient."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(DQ + offs, tl.load(DQacc + offs, mask=offs < numel, other=0.0).to(DQ.dtype.element_ty), mask=offs < numel)
'''

CELLS['ch4_flash']['flash_attention_backward'] = r'''
def _backward_blocks(q):
    """(BLOCK_M, BLOCK_N, num_warps) of the backward. Each program keeps a key block's K, V, dK and
    dV (BLOCK_N x d each) on chip while query blocks of BLOCK_M rows stream past, so BLOCK_N is the
    larger side: 64 keys against 32 queries. The compile report (A100, H100) shows no spills for
    16-bit inputs at every d with these, and 8 warps at d = 128; float32 inputs at d = 128 spill on an
    H100 with 64 keys, so they keep 32. The same sizes run in the interpreter."""
    d = q.shape[-1]
    block_n = 32 if (q.element_size() == 4 and d >= 128) else 64
    return 32, block_n, (8 if d >= 128 else 4)


def flash_attention_backward(q, k, v, o, lse, do, causal=False, sm_scale=None):
    """(dq, dk, dv) for (B, H, N, D) q, o, do and (B, H_kv, N, D) k, v.

    One pass (FlashAttention-2's design): a preprocessing kernel computes D = rowsum(dO o O) (and
    clears the dQ accumulator); one kernel, one program per key block of each (batch, key/value
    head), keeps dK and dV on chip over every query block of every query head of its group and
    adds each tile's dS K / tau to dQ with atomic adds in float32. 5 block products per tile
    instead of the two-pass design's 7; the price is that dQ's float32 sums are added in whatever
    order the GPU runs the programs, so dQ is not bitwise reproducible from run to run."""
    batch, heads, n, d = q.shape
    kv_heads = k.shape[1]
    assert k.shape == v.shape == (batch, kv_heads, n, d) and heads % kv_heads == 0
    assert o.shape == do.shape == q.shape and lse.shape == (batch, heads, n)
    group = heads // kv_heads
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    # Every input is read in place through its strides; only a head dimension without unit stride is copied.
    q, k, v, o, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, o, do))
    block_m, block_n, warps = _backward_blocks(q)
    block_d = max(16, triton.next_power_of_2(d))

    delta = torch.empty((batch, heads, n), device=q.device, dtype=torch.float32)
    dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    dk = torch.empty(k.shape, device=k.device, dtype=k.dtype)
    dv = torch.empty(v.shape, device=v.device, dtype=v.dtype)
    # float32 inputs add straight into dq; 16-bit ones into a float32 buffer, cast at the end
    dq_acc = dq if q.dtype == torch.float32 else torch.empty(q.shape, device=q.device, dtype=torch.float32)

    bwd_preprocess_kernel[(triton.cdiv(n, block_m), batch * heads)](
        o, do, delta, dq_acc, n, d, heads, *o.stride()[:3], *do.stride()[:3],
        BLOCK_M=block_m, BLOCK_D=block_d, CLEAR_DQ=True)
    bwd_dkdv_kernel[(triton.cdiv(n, block_n), batch * kv_heads)](
        q, k, v, do, lse, delta, dk, dv, dq_acc, n, d, kv_heads, scale,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *lse.stride(),
        GROUP=group, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, IS_CAUSAL=bool(causal),
        num_warps=warps)
    if dq_acc is not dq:
        cast_block = 1024
        bwd_dq_cast_kernel[(triton.cdiv(dq.numel(), cast_block),)](dq_acc, dq, dq.numel(), BLOCK=cast_block)
    return dq, dk, dv
'''

CELLS['ch4_flash']['decode_split_kernel'] = r'''
@triton.jit
def decode_split_kernel(Q, K, V, Lens, M_part, L_part, O_part, num_kv_heads, head_dim, num_chunks, sm_scale,
                        stride_qb, stride_qh, stride_qd, stride_kb, stride_kh, stride_kn,
                        stride_vb, stride_vh, stride_vn,
                        GROUP: tl.constexpr, ROWS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    """One program: the GROUP query heads that share one cache head, of one sequence, against one
    CHUNK of that head's cache, read in place; stores each query head's max m, sum l and
    normalised output o for the chunk.

    My variant of the suggested grid: a program owns a (chunk, sequence, key/value head), not a
    (chunk, sequence, query head), so each tile of K and V it loads serves the whole group. The
    group's queries form a block of ROWS >= 16 rows (padded with zero queries; the rows past GROUP
    are never stored), which lets the scores and the output be tl.dot products on tensor cores."""
    chunk = tl.program_id(0).to(tl.int64)
    bkv = tl.program_id(1).to(tl.int64)
    b, kv = bkv // num_kv_heads, bkv % num_kv_heads
    length = tl.load(Lens + b).to(tl.int64)
    r = tl.arange(0, ROWS)
    dims = tl.arange(0, BLOCK_D)
    heads = kv * GROUP + r                                   # the query heads of this group
    row_ok = r < GROUP
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
                mask=row_ok[:, None] & (dims[None, :] < head_dim), other=0.0)
    m = tl.full((ROWS,), -float("inf"), dtype=tl.float32)
    l = tl.zeros((ROWS,), dtype=tl.float32)
    acc = tl.zeros((ROWS, BLOCK_D), dtype=tl.float32)
    start = chunk * CHUNK
    end = tl.minimum(start + CHUNK, length)                  # a chunk past the sequence's end: no iteration
    offs_n = tl.arange(0, BLOCK_N)
    k_base = K + b * stride_kb + kv * stride_kh
    v_base = V + b * stride_vb + kv * stride_vh
    for col in range(start, end, BLOCK_N):
        cols = col + offs_n
        col_ok = cols < end
        kv_mask = col_ok[:, None] & (dims[None, :] < head_dim)
        k = tl.load(k_base + cols[:, None] * stride_kn + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vn + dims[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale                # (ROWS, BLOCK_N)
        s = tl.where(col_ok[None, :], s, -float("inf"))      # every block has a valid key: m stays finite
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    # The empty state of a chunk with no key is (m, l, o) = (-inf, 0, 0).
    o = tl.where(l[:, None] > 0, acc / tl.where(l > 0, l, 1.0)[:, None], 0.0)
    part = (b * num_kv_heads * GROUP + heads) * num_chunks + chunk    # row (b * H + h), column chunk
    tl.store(M_part + part, m, mask=row_ok)
    tl.store(L_part + part, l, mask=row_ok)
    tl.store(O_part + part[:, None] * BLOCK_D + dims[None, :], o, mask=row_ok[:, None])
'''

CELLS['ch4_flash']['decode_merge_kernel'] = r'''
@triton.jit
def decode_merge_kernel(M_part, L_part, O_part, Lens, Out, num_heads, head_dim, num_chunks, stride_ob, stride_oh,
                        CHUNK: tl.constexpr, CHUNKS: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program: merge the partial states of one (sequence, query head).

    Instead of loading all num_chunks states at once (a CHUNKS x d tile that grows with the
    cache), the program folds them in CHUNKS at a time into a running state (m, l, acc), the
    online softmax one level up, so its registers do not depend on the cache length; and it
    reads only the chunks that hold keys of this sequence, ceil(length / CHUNK), never those
    past its end."""
    bh = tl.program_id(0).to(tl.int64)
    b, h = bh // num_heads, bh % num_heads
    length = tl.load(Lens + b).to(tl.int64)
    used = tl.minimum((length + CHUNK - 1) // CHUNK, num_chunks)
    dims = tl.arange(0, BLOCK_D)
    offs_c = tl.arange(0, CHUNKS)
    m = tl.full((1,), -float("inf"), dtype=tl.float32)
    l = tl.zeros((1,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for c0 in range(0, used, CHUNKS):
        cs = c0 + offs_c
        ok = cs < used
        m_c = tl.load(M_part + bh * num_chunks + cs, mask=ok, other=-float("inf"))
        l_c = tl.load(L_part + bh * num_chunks + cs, mask=ok, other=0.0)
        o_c = tl.load(O_part + (bh * num_chunks + cs[:, None]) * BLOCK_D + dims[None, :], mask=ok[:, None], other=0.0)
        m_new = tl.maximum(m, tl.max(m_c, axis=0))           # finite: chunk 0 of every sequence holds a key
        alpha = tl.where(m > -float("inf"), tl.exp(m - m_new), 0.0)
        w = tl.where(m_c > -float("inf"), l_c * tl.exp(m_c - m_new), 0.0)    # l_c e^(m_c - m): 0 when empty
        l = l * alpha + tl.sum(w, axis=0)
        acc = acc * alpha + tl.sum(w[:, None] * o_c, axis=0)
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)
    tl.store(Out + b * stride_ob + h * stride_oh + dims, out.to(Out.dtype.element_ty), mask=dims < head_dim)
'''

CELLS['ch4_flash']['decode_attention'] = r'''
DECODE_CHUNK = 128        # positions per split-K chunk: fixed, so a long cache always gets many programs
DECODE_BLOCK_N = 64       # keys per step inside a chunk
DECODE_MERGE_CHUNKS = 16  # chunk states folded per step of the merge


def decode_attention(q, k_cache, v_cache, cache_lens, sm_scale=None):
    """One new token per sequence: q (B, H_q, D) against caches (B, H_kv, L_max, D), split-K.

    Launches (1) decode_split_kernel on a grid of (chunks, B * H_kv): one program per chunk of one
    key/value head of one sequence, serving all the query heads of its group; each writes a float32
    state (m, l, o) per query head; and (2) decode_merge_kernel, one program per (sequence, query
    head), which folds the states together. The caches are read where they lie, through their
    strides; q through its strides too (any layout, even its last axis)."""
    batch, heads, d = q.shape
    _, kv_heads, l_max, _ = k_cache.shape
    assert k_cache.shape == v_cache.shape == (batch, kv_heads, l_max, d) and heads % kv_heads == 0
    group = heads // kv_heads
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    # A cache's head dimension has unit stride by the prompt; should one not, a copy is the fallback.
    k_cache, v_cache = (t if t.stride(-1) == 1 else t.contiguous() for t in (k_cache, v_cache))
    lens = cache_lens if cache_lens.device == q.device else cache_lens.to(q.device)
    block_d = max(16, triton.next_power_of_2(d))
    rows = max(16, triton.next_power_of_2(group))            # tl.dot needs at least 16 rows on a GPU
    chunks = triton.cdiv(l_max, DECODE_CHUNK)                # enough for any length <= L_max, no host sync
    m_part = torch.empty((batch, heads, chunks), device=q.device, dtype=torch.float32)
    l_part = torch.empty((batch, heads, chunks), device=q.device, dtype=torch.float32)
    o_part = torch.empty((batch, heads, chunks, block_d), device=q.device, dtype=torch.float32)
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    decode_split_kernel[(chunks, batch * kv_heads)](
        q, k_cache, v_cache, lens, m_part, l_part, o_part, kv_heads, d, chunks, scale,
        *q.stride(), *k_cache.stride()[:3], *v_cache.stride()[:3],
        GROUP=group, ROWS=rows, CHUNK=DECODE_CHUNK, BLOCK_N=DECODE_BLOCK_N, BLOCK_D=block_d,
        num_warps=4, num_stages=2)    # 2 stages: a chunk is 2 blocks; half the shared memory of 3, twice the occupancy
    decode_merge_kernel[(batch * heads,)](
        m_part, l_part, o_part, lens, out, heads, d, chunks, *out.stride()[:2],
        CHUNK=DECODE_CHUNK, CHUNKS=DECODE_MERGE_CHUNKS, BLOCK_D=block_d, num_warps=4)
    return out
'''

CELLS['ch4_flash']['kernel_attention'] = r'''
def kernel_attention(q, k, v):
    """Causal attention through FlashAttention.apply: q (n_batch, n, H_q, d), k and v (n_batch, n, H_kv, d),
    the projections' layout, to (n_batch, n, H_q, d)."""
    # The kernels want (batch, heads, positions, d) and read every tensor through its strides, so swapping
    # the two middle axes is only a change of strides (the head dimension keeps unit stride): no copy.
    # FlashAttention.apply takes its arguments positionally: (q, k, v, causal, sm_scale).
    out = FlashAttention.apply(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), True, None)
    return out.transpose(1, 2)   # back to the projections' layout, again a view
'''

CELLS['ch4_flash']['generate'] = r'''
def _kv_cache(model, n_batch, capacity, like):
    """One tensor for the whole model's cache, allocated once: axes (layer, key or value, sequence, position,
    key/value head, width). Positions lie outside the heads, as the projections produce them, so a step
    writes one (H_kv, d) slab per sequence; a layer's keys seen as (n_batch, H_kv, capacity, d) are a view."""
    shape = (len(model.blocks), 2, n_batch, capacity, model.kv_heads, model.head_dim)
    return torch.zeros(shape, dtype=like.dtype, device=like.device)


def _cache_views(cache, layer, window):
    """Keys and values of one layer as (n_batch, H_kv, window, d) windows of the buffer: views, no copy."""
    return tuple(cache[layer, i, :, :window].transpose(1, 2) for i in (0, 1))


def generate(model, prompts, n_new):
    """Greedy continuation of each prompt (1-D token tensors, lengths may differ) by n_new tokens,
    through a KV cache read by decode_attention: a (len(prompts), n_new) tensor of tokens."""
    device = model.out.weight.device
    n_batch = len(prompts)
    lengths = [int(p.numel()) for p in prompts]            # keys in the cache of each sequence, on the host
    longest = max(lengths)
    new = torch.zeros((n_batch, n_new), dtype=torch.long, device=device)
    if n_new <= 0:
        return new
    rows = torch.arange(n_batch, device=device)
    with torch.no_grad():
        cache = _kv_cache(model, n_batch, longest + n_new, model.out.weight)

        # Prefill: every prompt at once, padded on the right to the longest. Causal attention never lets a
        # real position see a later one, so the padding changes nothing at the real positions; the keys
        # and values written at padded positions lie past cache_lens and get overwritten by the new tokens.
        tokens = torch.zeros((n_batch, longest), dtype=torch.long, device=device)
        for b, p in enumerate(prompts):
            tokens[b, :lengths[b]] = p.to(device)
        x = model.embed(tokens)
        positions = torch.arange(longest, device=device)
        for layer, block in enumerate(model.blocks):
            q, k, v = block.project(x, positions)
            cache[layer, 0, :, :longest] = k
            cache[layer, 1, :, :longest] = v
            x = block.finish(x, kernel_attention(q, k, v))
        last = torch.tensor([n - 1 for n in lengths], device=device)
        new[:, 0] = model.logits(x[rows, last]).argmax(-1)

        # Decoding: one token per sequence per step, each at its own position (= keys already cached).
        pos = torch.tensor(lengths, device=device)          # where the fed token goes, per sequence
        for step in range(1, n_new):
            x = model.embed(new[:, step - 1])[:, None]      # (n_batch, 1, d_model)
            cache_lens = pos + 1                            # the new key counts
            window = longest + step                         # the longest sequence's keys after this write
            for layer, block in enumerate(model.blocks):
                q, k, v = block.project(x, pos[:, None])    # positions (n_batch, 1): one per sequence
                cache[layer, 0, rows, pos] = k[:, 0]        # in place, one (H_kv, d) slab per sequence
                cache[layer, 1, rows, pos] = v[:, 0]
                k_cache, v_cache = _cache_views(cache, layer, window)
                attended = decode_attention(q[:, 0], k_cache, v_cache, cache_lens)
                x = block.finish(x, attended[:, None])
            new[:, step] = model.logits(x[:, 0]).argmax(-1)
            pos = cache_lens
    return new
'''
