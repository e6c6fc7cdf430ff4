"""Hidden checks for Chapter 2 (Variants)."""
import numpy as np

from autograde.compare import (
    GradingFailure,
    call,
    call_unchanged,
    expect_array,
    describe,
    expect_close,
    expect_within,
    expect_sequence,
    expect_unchanged,
    expect_value_error,
    numpy_only,
)
from autograde.reference import variants as ref
from autograde.recorded_calls import counted_decode_steps
from autograde.sandbox import forfeit, is_instance, note_sighting, reported_during
from student_runtime.layers import REPORT as LAYER_REPORT

# The functions these checks grade as NumPy code: their hidden tests call them in the student's
# process without PyTorch (autograde.execute).
NUMPY_GRADED = ('rotary_half_split', 'left_padded_causal_attention', 'decode_step', 'decode_with_kv_cache',
                'entropy_temperature_slope', 'additive_attention_grads')

RNG_SEED = 20261


def _rng(offset=0):
    return np.random.default_rng(RNG_SEED + offset)


# ----------------------------------------------------------- rotary embedding

ROPE_HINT = ("Sequence b's real tokens are its last lengths[b] rows, at positions 0, 1, 2, ... (padding rows are "
             "returned as they are); of the first r = rotary_dim coordinates, i pairs with i + r/2 and turns by "
             "position * 10000^(-2i/r); coordinates r and beyond are not rotated; every head turns alike.")


def _check_rope(rotary_half_split, x, lengths, rotary_dim, label):
    what = f"rotary_half_split for {label}"
    expected = ref.rotary_left_padded(x, lengths, rotary_dim)
    found = call_unchanged(rotary_half_split, x, np.asarray(lengths), rotary_dim, what=what)
    # float64: an angle m theta of up to ~1e3 radians rounds by 2^-53 * 1e3 ~ 1e-13, as do cos and sin
    expect_close(found, expected, what=what, atol=1e-9, hint=ROPE_HINT)


def _rope_numpy_only(rotary_half_split, rng):
    x, lengths = rng.normal(size=(2, 3, 4, 8)), np.array([4, 2])
    what = "rotary_half_split for x of shape (2, 3, 4, 8), lengths [4, 2], rotary_dim=4"
    numpy_only(rotary_half_split, x, lengths, 4, what=what)  # the values are graded by the other calls


def check_rope_values(rotary_half_split):
    """Batches of 1 to 4 left-padded sequences, 1 to 3 heads, widths from 2 to 64,
    rotary_dim from 2 to the whole width (None)."""
    rng = _rng(1)
    for shape, lengths, rotary_dim in [((1, 1, 1, 2), [1], None), ((1, 2, 5, 8), [5], None), ((3, 2, 7, 16), [7, 3, 0], None),
                                       ((2, 1, 6, 64), [6, 1], None), ((2, 3, 5, 12), [2, 5], 4), ((4, 2, 4, 10), [4, 0, 1, 3], 2),
                                       ((1, 1, 300, 8), [300], 6), ((2, 2, 9, 6), [9, 4], 6)]:
        x = rng.normal(size=shape)
        _check_rope(rotary_half_split, x, lengths, rotary_dim,
                    f"x of shape {shape}, lengths {list(lengths)}, rotary_dim={rotary_dim}")
    _rope_numpy_only(rotary_half_split, rng)


def _rope_call(rotary_half_split, x, lengths, rotary_dim, what):
    args = (x, lengths) if rotary_dim is None else (x, lengths, rotary_dim)   # the default, as a student calls it
    return call(rotary_half_split, *args, what=what)


def check_rope_rotation(rotary_half_split):
    """Lengths kept, scores of real tokens independent of how much padding precedes
    them, coordinates past rotary_dim untouched (rotary_dim=0: every one, as the prompt says),
    and an odd or too large rotary_dim refused."""
    rng = _rng(2)
    for width in (5, 9):  # called as a student calls it, rotary_dim left to its default
        expect_value_error(rotary_half_split, np.ones((1, 1, 2, width)), np.array([2]),
                           what=f"rotary_half_split for rows of width {width}",
                           reason="an odd width cannot be split into pairs")
    heads, d = 3, 12
    tokens = rng.normal(size=(2, heads, 5, d))      # five real tokens of a query and of a key array
    for rotary_dim in (None, 8, 0):
        for padding in (0, 1, 4):
            x = np.concatenate([rng.normal(scale=50.0, size=(2, heads, padding, d)), tokens], axis=2)
            what = f"rotary_half_split with {padding} padding rows before the same 5 tokens, rotary_dim={rotary_dim}"
            turned = _rope_call(rotary_half_split, x.copy(), np.array([5, 5]), rotary_dim, what)
            expect_close(np.linalg.norm(turned, axis=-1), np.linalg.norm(x, axis=-1),
                         what=f"the lengths of the rows after {what}",
                         hint="A rotation keeps every row's length: (a cos - b sin, a sin + b cos).")
            real = turned[:, :, padding:]
            scores = real[0] @ np.swapaxes(real[1], -1, -2)
            if padding == 0:
                base_scores = scores
            # dot products of float64 rows of size ~1: rounding ~ d * 2^-53, far below 1e-8
            expect_close(scores, base_scores, what=f"the scores between the real tokens after {what}", atol=1e-8,
                         hint="Each sequence counts positions from its first real token, and the query and the key "
                              "of a pair turn with the same frequencies.")
            if rotary_dim is not None:
                expect_close(turned[..., rotary_dim:], x[..., rotary_dim:],
                             what=f"the coordinates from rotary_dim on after {what}",
                             hint="Only the first rotary_dim coordinates are rotated; the others pass through.")
    for width, rotary_dim in ((8, 3), (6, 8), (4, 5)):
        expect_value_error(rotary_half_split, np.ones((1, 1, 2, width)), np.array([2]), rotary_dim,
                           what=f"rotary_half_split for rows of width {width} with rotary_dim={rotary_dim}",
                           reason="the rotated width must be even and no larger than the row")
    _rope_numpy_only(rotary_half_split, rng)


# ------------------------------------------------- left padding and causality

def _padded_inputs(rng, batch, n, d_k, d_v):
    return rng.normal(size=(batch, n, d_k)), rng.normal(size=(batch, n, d_k)), rng.normal(size=(batch, n, d_v))


def _run_padded(left_padded_causal_attention, q, k, v, lengths):
    what = f"left_padded_causal_attention for q of shape {q.shape}, lengths {list(lengths)}"
    found = call_unchanged(left_padded_causal_attention, q, k, v, np.asarray(lengths), what=what)
    expect_array(found, shape=q.shape[:-1] + v.shape[-1:], what=what)
    return found, what


def _padded_numpy_only(left_padded_causal_attention, rng):
    q, k, v = _padded_inputs(rng, 2, 5, 3, 2)
    lengths = np.array([3, 5])
    what = f"left_padded_causal_attention for q of shape {q.shape}, lengths {list(lengths)}"
    numpy_only(left_padded_causal_attention, q, k, v, lengths, what=what)  # values graded by the other calls


PADDING_SCALES = (300.0, 1e6, 1e12, 1e100)  # what the padding holds: any finite numbers, huge ones included


def check_left_padded_values(left_padded_causal_attention):
    """The real rows of each sequence equal causal attention of that sequence alone,
    whatever the padding holds: junk from the hundreds to 1e100, in the queries, keys
    and values, so that no finite penalty (such as -1e9) keeps a padding key out."""
    rng = _rng(3)
    shapes = [(3, 6, 4, 3, [6, 4, 1]), (2, 9, 8, 8, [5, 9]), (1, 1, 2, 5, [1]), (4, 7, 3, 2, [2, 7, 3, 6])]
    for case, (batch, n, d_k, d_v, lengths) in enumerate(shapes + shapes):
        scale = PADDING_SCALES[case % len(PADDING_SCALES)]
        q, k, v = _padded_inputs(rng, batch, n, d_k, d_v)
        for b, length in enumerate(lengths):
            pad = n - length
            q[b, :pad], k[b, :pad], v[b, :pad] = (rng.normal(scale=scale, size=(pad, d)) for d in (d_k, d_k, d_v))
        expected = ref.left_padded_causal_attention(q, k, v, lengths)
        found, what = _run_padded(left_padded_causal_attention, q, k, v, lengths)
        what += f" and padding entries of size about {scale:g}"
        for b, length in enumerate(lengths):
            expect_close(found[b, n - length:], expected[b, n - length:],
                         what=f"the real rows of sequence {b} (length {length}, padded on the left) from {what}",
                         hint="Sequence b's tokens are its last lengths[b] positions; query i may attend to key j "
                              "when j <= i and j is a real token, itself included. Scale by 1/sqrt(d_k). Exclude "
                              "the padding keys (-np.inf, or leave them out) rather than penalise them by a finite "
                              "amount, which huge padding values outweigh, and take each row's maximum over the "
                              "keys it may see only.")
    _padded_numpy_only(left_padded_causal_attention, rng)


def check_left_padded_empty_rows(left_padded_causal_attention):
    """Padding queries have no key to attend to: their rows are zeros, never NaN,
    including a sequence of length 0."""
    rng = _rng(4)
    for batch, n, d_k, d_v, lengths in [(3, 5, 4, 2, [2, 5, 0]), (2, 8, 3, 3, [1, 6]), (1, 4, 2, 2, [0])]:
        q, k, v = _padded_inputs(rng, batch, n, d_k, d_v)
        found, what = _run_padded(left_padded_causal_attention, q, k, v, lengths)
        if not np.all(np.isfinite(found)):
            raise GradingFailure(f"{what} returned NaN or infinity. With left padding and a causal mask a padding "
                                 "query has no key it may see; return zeros for such a row instead of 0/0.")
        for b, length in enumerate(lengths):
            rows = found[b, :n - length]
            if np.any(rows != 0):
                raise GradingFailure(f"{what}: the {n - length} padding rows of sequence {b} (length {length}) "
                                     "should be exactly zero; a padding query sees only padding keys, all masked.")
    _padded_numpy_only(left_padded_causal_attention, rng)


# ------------------------------------------------- grouped-query KV cache

def _gqa_weights(rng, d_model, n_heads, n_kv, d_head):
    return (rng.normal(size=(d_model, n_heads * d_head)), rng.normal(size=(d_model, n_kv * d_head)),
            rng.normal(size=(d_model, n_kv * d_head)))


GQA_CONFIGS = [(4, 2, 1, 3), (6, 4, 2, 2), (5, 6, 3, 2), (8, 4, 4, 2), (3, 8, 2, 1)]  # d_model, heads, kv heads, d_head


def _check_step(decode_step, x_t, cache_k, cache_v, weights, n_heads, label):
    what = f"decode_step with {label}"
    expected = ref.decode_step(x_t, cache_k, cache_v, *weights, n_heads)
    result = call_unchanged(decode_step, x_t, cache_k, cache_v, *weights, n_heads, what=what)
    expect_sequence(result, 3, what=what, names="(output_t, cache_k, cache_v)")
    out, new_k, new_v = result
    ref_out, ref_k, ref_v = expected
    expect_close(new_k, ref_k, what=f"the key cache returned by {what}",
                 hint="The caches have shape (n_kv_heads, t, d_head): split x_t @ w_k into n_kv_heads "
                      "contiguous slices and append each as a new last row of its head; keep the old rows.")
    expect_close(new_v, ref_v, what=f"the value cache returned by {what}",
                 hint="Append x_t @ w_v, split into n_kv_heads slices, as one new last row per KV head.")
    expect_close(out, ref_out, what=f"the output of {what}",
                 hint="Query head h reads KV head h // (n_heads // n_kv_heads): consecutive query heads share "
                      "one KV head. Concatenate the heads' outputs in order into shape (n_heads * d_head,).")
    return new_k, new_v


def check_decode_step(decode_step):
    """From an empty cache, from caches of stored rows (attend to them as given),
    and chained steps, for one, several and as many KV heads as query heads."""
    rng = _rng(5)
    for d_model, n_heads, n_kv, d_head in GQA_CONFIGS:
        weights = _gqa_weights(rng, d_model, n_heads, n_kv, d_head)
        label = f"d_model={d_model}, n_heads={n_heads}, {n_kv} KV heads, d_head={d_head}"
        cache_k, cache_v = np.zeros((n_kv, 0, d_head)), np.zeros((n_kv, 0, d_head))
        for t in range(3):
            cache_k, cache_v = _check_step(decode_step, rng.normal(size=d_model), cache_k, cache_v, weights,
                                           n_heads, f"a cache of {t} rows built by earlier steps ({label})")
        stored = rng.normal(scale=2.0, size=(n_kv, 5, d_head)), rng.normal(size=(n_kv, 5, d_head))
        _check_step(decode_step, rng.normal(size=d_model), *stored, weights, n_heads,
                    f"a cache of 5 stored rows ({label})")
    d_model, n_heads, n_kv, d_head = GQA_CONFIGS[1]
    weights = _gqa_weights(rng, d_model, n_heads, n_kv, d_head)
    x_t, cache_k, cache_v = rng.normal(size=d_model), rng.normal(size=(n_kv, 3, d_head)), rng.normal(size=(n_kv, 3, d_head))
    what = f"decode_step with n_heads={n_heads}, {n_kv} KV heads and a cache of 3 rows"
    numpy_only(decode_step, x_t, cache_k, cache_v, *weights, n_heads, what=what)


def _same_rows(found, expected):
    """Each head's cache holds the expected rows, in any order (the order is
    decode_step's business, graded on its own)."""
    if found.shape != expected.shape:
        return False

    def ordered(cache):
        return np.stack([head[np.lexsort(head.T[::-1])] for head in cache]) if cache.size else cache

    return np.allclose(ordered(found), ordered(expected))


def check_decode_with_kv_cache(decode_with_kv_cache):
    """Equal to causal grouped-query attention computed at once; the prompt's rows
    come from no decode_step call, and every later token t from its own call, given
    token t and the keys and values of tokens 0..t-1, whose output is row t."""
    rng = _rng(6)
    cases = [(1, 0), (2, 2), (7, 3), (12, 0), (16, 5)]  # (n, prompt_length), one per head layout
    for (n, p), (d_model, n_heads, n_kv, d_head) in zip(cases + [(5, 4), (9, 1)], GQA_CONFIGS + GQA_CONFIGS[:2]):
        x = rng.normal(size=(n, d_model))
        weights = _gqa_weights(rng, d_model, n_heads, n_kv, d_head)
        what = (f"decode_with_kv_cache for x of shape {x.shape}, n_heads={n_heads}, {n_kv} KV heads, "
                f"prompt_length={p}")
        expected = ref.causal_gqa_attention(x, *weights, n_heads)
        keys, values = ((x @ w).reshape(n, n_kv, d_head).transpose(1, 0, 2) for w in weights[1:])
        before = [x.copy(), *(w.copy() for w in weights)]
        found, calls = counted_decode_steps(decode_with_kv_cache, x, *weights, n_heads, p, what=what)
        for b, a in zip(before, (x, *weights)):
            expect_unchanged(b, a, what=what)
        expect_close(found, expected, what=what,
                     hint="Token t's output attends to the keys of tokens 0..t, itself included, in the prompt "
                          "as in the decoded part.")
        shapes = [tuple(np.shape(a) for a in c[:3]) for c in calls]
        expected_shapes = [((d_model,), (n_kv, t, d_head), (n_kv, t, d_head)) for t in range(p, n)]
        if shapes != expected_shapes:
            raise GradingFailure(
                f"{what} should compute the {p} prompt rows without decode_step, then call decode_step once per "
                f"remaining token, in order, with one token of shape ({d_model},) and the caches so far, of shape "
                f"({n_kv}, t, {d_head}) for t = {p}, {p + 1}, ...; it made {len(calls)} calls"
                + (f", the first with shapes {shapes[0]}." if calls else "."))
        for t, (x_t, cache_k, cache_v, output_t, threaded) in enumerate(calls, start=p):
            # The result is right (checked above), so caches without the real keys mean
            # the rows were computed somewhere else than in these calls.
            if not (np.allclose(x_t, x[t]) and _same_rows(cache_k, keys[:, :t])
                    and _same_rows(cache_v, values[:, :t])):
                forfeit(decode_with_kv_cache, "decode_step given caches it did not build",
                              f"{what}: the decode_step call for token {t} was given other keys or values than "
                              "the caches hold")
                raise GradingFailure(
                    f"{what}: the decode_step call for token {t} was not given token {t} and the keys and values "
                    f"of tokens 0..{t - 1}, as the prefill and the earlier calls left them in the caches.")
            if t > p and not threaded:
                raise GradingFailure(
                    f"{what}: the decode_step call for token {t} was not given the caches that the call for token "
                    f"{t - 1} returned. Pass them on as they are: rebuilding the caches from x at every step "
                    "recomputes the keys and values that the cache is there to keep.")
            if output_t.shape != found[t].shape or not np.allclose(output_t, found[t]):
                raise GradingFailure(
                    f"{what}: row {t} of the result is not the output that decode_step returned for token {t}; "
                    "the rows after the prompt must be built from the decoding steps.")
    d_model, n_heads, n_kv, d_head = GQA_CONFIGS[2]
    x, weights = rng.normal(size=(5, d_model)), _gqa_weights(rng, d_model, n_heads, n_kv, d_head)
    what = f"decode_with_kv_cache for x of shape {x.shape}, n_heads={n_heads}, {n_kv} KV heads, prompt_length=2"
    numpy_only(decode_with_kv_cache, x, *weights, n_heads, 2, what=what)


# ------------------------------------------- entropy against temperature

def _check_slope(entropy_temperature_slope, scores, tau, label, hint):
    what = f"entropy_temperature_slope for {label}, tau={tau:g}"
    expected = ref.entropy_temperature_slope(scores, tau)
    found = call_unchanged(entropy_temperature_slope, scores, tau, what=what)
    # float64 moments of centred scores: rounding ~ n * 2^-53 relative to the slope's terms (the
    # centring is what keeps them small: raw moments near 1e6 lose the digits that this catches)
    expect_close(found, expected, what=what, rtol=1e-6, atol=1e-9, hint=hint)


def _slope_numpy_only(entropy_temperature_slope, rng):
    scores, tau = rng.normal(scale=2.0, size=(3, 5)), 0.8
    scores[1, 2] = -np.inf
    what = f"entropy_temperature_slope for scores of shape {scores.shape} with a masked key, tau={tau:g}"
    numpy_only(entropy_temperature_slope, scores, tau, what=what)


def check_slope_values(entropy_temperature_slope):
    """Any number of leading axes and temperatures from 0.25 to 5."""
    rng = _rng(7)
    hint = ("dH/dtau follows from the chain rule through p = softmax(s / tau); the result has the shape of "
            "scores without its last axis.")
    for shape, tau in [((5,), 1.0), ((3, 4), 0.25), ((2, 3, 6), 2.0), ((1, 1), 1.0), ((4, 8), 5.0)]:
        _check_slope(entropy_temperature_slope, rng.normal(scale=2.0, size=shape), tau, f"scores of shape {shape}", hint)
    _slope_numpy_only(entropy_temperature_slope, rng)


def check_slope_limits(entropy_temperature_slope):
    """Masked keys (-inf) take no part, rows that cannot change give 0, and large
    or shifted scores stay finite and exact."""
    rng = _rng(8)
    masked = rng.normal(size=(3, 6))
    masked[0, [1, 4]] = masked[1, 2:] = -np.inf
    masked[2, :5] = -np.inf                                   # one key left: the entropy is 0 at every tau
    hint = "A key with score -inf has weight 0 and must add nothing (0 * inf is nan: skip those keys)."
    _check_slope(entropy_temperature_slope, masked, 0.7, "rows with masked keys (-inf)", hint)
    _check_slope(entropy_temperature_slope, np.full((2, 5), 3.0), 1.5, "equal scores (always uniform)", hint)
    _check_slope(entropy_temperature_slope, rng.normal(scale=300.0, size=(2, 7)), 0.5, "scores in the hundreds",
                 "Use a numerically stable softmax (subtract the row maximum).")
    _check_slope(entropy_temperature_slope, rng.normal(size=(2, 7)) + 1e6, 1.0, "scores near a million",
                 "The slope does not change when a constant is added to a row: centre the scores on their mean "
                 "before squaring, instead of E[s^2] - E[s]^2.")
    for label, scores, tau in _offset_rows(rng):
        _check_slope(entropy_temperature_slope, scores, tau, label,
                     "Each row is a softmax of its own: subtract each row's own maximum (keepdims=True), not "
                     "one maximum of the whole array, which leaves the rows far below it with 0/0.")
    _slope_numpy_only(entropy_temperature_slope, rng)


def _offset_rows(rng):
    """Rows at very different offsets in one array (near 0, near -1e3, near 1e6), with and
    without masked keys, over several shapes and temperatures."""
    cases = []
    for shape, offsets, tau in [((3, 5), [0.0, 1e6, -1e3], 1.0), ((2, 2, 6), [[1e6, 0.0], [5e5, -2e5]], 0.3),
                                ((4, 4), [1e6, 1e6 - 50.0, 2.0, -1e6], 2.5), ((2, 8), [-7.0, 1e6], 0.05)]:
        scores = rng.normal(scale=2.0, size=shape) + np.asarray(offsets)[..., None]
        cases.append((f"rows at offsets {np.asarray(offsets).ravel().tolist()} in one array of shape {shape}",
                      scores, tau))
        masked = scores.copy()
        masked[..., 1] = -np.inf
        cases.append((f"rows at offsets {np.asarray(offsets).ravel().tolist()} with a masked key, shape {shape}",
                      masked, tau))
    return cases


# ------------------------------------------------- gradients of additive attention

def _grads_inputs(rng, lead, n_q, n_k, d_q, d_k, d_a, d_v, score_scale=1.0, offset=None, q_scale=1.0):
    """q, k, v, u_q, u_k, w_score, d_out. With an offset, hidden unit 0 is saturated (tanh = 1)
    for every pair and w_score[0] = offset: every score moves by the offset, the rows keep their
    spread of a few units, so the softmax is far from one-hot and its gradient far from zero."""
    q = rng.normal(scale=q_scale, size=(*lead, n_q, d_q))
    k, v = rng.normal(size=(*lead, n_k, d_k)), rng.normal(size=(*lead, n_k, d_v))
    u_q, u_k = rng.normal(size=(d_q, d_a)) / np.sqrt(d_q), rng.normal(size=(d_k, d_a)) / np.sqrt(d_k)
    w_score, d_out = rng.normal(scale=score_scale, size=d_a), rng.normal(size=(*lead, n_q, d_v))
    if offset is not None:
        q[..., 0] = 40.0                         # tanh(40) is 1.0 in float64
        u_q[0], u_q[:, 0], u_k[:, 0] = 0.0, 0.0, 0.0
        u_q[0, 0], w_score[0] = 1.0, offset
    return q, k, v, u_q, u_k, w_score, d_out


GRADS_HINT = ("With p = softmax of the scores over the real keys and dL/dp = d_out v^T, dL/dscore_ij = "
              "p_ij (dL/dp_ij - sum_l p_il dL/dp_il) (the softmax's Jacobian times a vector); the score is "
              "w_score . a_ij with the hidden vector a_ij = tanh(q_i U_q + k_j U_k), so dw_score sums dL/dscore_ij "
              "a_ij over every pair of every sequence, and dq_i sums dL/dscore_ij (w_score * (1 - a_ij^2)) over j, "
              "times U_q^T.")

UNIT = 2.0 ** -53        # float64's unit roundoff
TINY = 2.0 ** -1022      # float64's smallest normal number: exp below it loses digits, then flushes to 0


def _gamma(m):
    """A sum of m products in float64, in any order: off by at most (m + 1) units times the sum
    of the magnitudes of its terms (to first order)."""
    return (m + 1) * UNIT


def additive_grads_bound(q, k, v, u_q, u_k, w_score, d_out, key_mask=None):
    """Element-wise first-order bounds on |found - exact| for (dq, dw_score) of additive attention
    computed in float64 as the exercise describes it, in any order and with any stable softmax
    (max-subtracted or log-sum-exp): h = q_i U_q + k_j U_k, a = tanh(h), s = a . w_score,
    p = softmax(s) over the real keys, g = d_out v^T, gbar = sum_j p g, gs = p (g - gbar),
    dw_score = sum gs a, dq = (sum_j gs w_score (1 - a^2)) U_q^T. Each sum may be off by
    _gamma(its terms) times the sum of their magnitudes, tanh by two units, and each weight p_ij
    by a relative error of its exponent's error: those of s_ij and of the row's largest score,
    and two units of |s| for each (the subtraction of the maximum, or of the log-sum-exp, which
    rounds to a unit of |max|): about 1e-10 relative for scores near 1e6, whatever the code.
    That relative error reaches dq multiplied by w_score once more: with w_score in the
    thousands and scores near 1e4, the bound on dq reaches a few times 1e-6."""
    q, k, v, u_q, u_k, w_score, d_out = (np.asarray(x, dtype=np.float64) for x in (q, k, v, u_q, u_k, w_score, d_out))
    (d_q, d_a), d_k, n_k, d_v = u_q.shape, u_k.shape[0], k.shape[-2], v.shape[-1]
    h = (q @ u_q)[..., :, None, :] + (k @ u_k)[..., None, :, :]                 # (..., n_q, n_k, d_a)
    h_mag = (np.abs(q) @ np.abs(u_q))[..., :, None, :] + (np.abs(k) @ np.abs(u_k))[..., None, :, :]
    a = np.tanh(h)
    slope = 1.0 - a * a
    a_err = slope * (_gamma(max(d_q, d_k)) + UNIT) * h_mag + 2 * UNIT * np.abs(a)
    s = a @ w_score
    s_err = a_err @ np.abs(w_score) + _gamma(d_a) * (np.abs(a) @ np.abs(w_score))
    real = np.ones(s.shape, dtype=bool) if key_mask is None else \
        np.broadcast_to(np.asarray(key_mask, dtype=bool)[..., None, :], s.shape)
    p = ref.masked_softmax_or_zero(s, real)
    # the exponent s_ij - max (or - log-sum-exp): the errors of s_ij and of the row's top score,
    # the subtraction, the log-sum-exp's rounding (a unit of |max|) and its sum's (n_k units)
    x_err = np.where(real, s_err + 2 * UNIT * np.abs(s), 0.0)
    top = np.max(x_err, axis=-1, keepdims=True, initial=0.0)
    p_err = np.where(real, p * (x_err + 3 * top + (n_k + 4) * UNIT) + TINY, 0.0)
    g = d_out @ np.swapaxes(v, -1, -2)
    g_mag = np.abs(d_out) @ np.swapaxes(np.abs(v), -1, -2)
    g_err = _gamma(d_v) * g_mag
    gbar = np.sum(p * g, axis=-1, keepdims=True)
    gbar_mag = np.sum(p * g_mag, axis=-1, keepdims=True)
    gbar_err = np.sum(p_err * g_mag + p * g_err, axis=-1, keepdims=True) + _gamma(n_k) * gbar_mag
    gs, gs_mag = p * (g - gbar), p * (g_mag + gbar_mag)
    gs_err = p_err * np.abs(g - gbar) + p * (g_err + gbar_err) + _gamma(n_k) * gs_mag
    pairs = gs.size
    dw_err = (gs_err[..., None] * np.abs(a) + np.abs(gs)[..., None] * a_err
              + _gamma(pairs) * gs_mag[..., None] * np.abs(a)).reshape(-1, d_a).sum(axis=0)
    c_mag = np.abs(w_score) * slope
    c_err = np.abs(w_score) * (2 * np.abs(a) * a_err + 4 * UNIT)              # 1 - a^2 or sech^2, times w
    dh_err = np.sum(gs_err[..., None] * c_mag + np.abs(gs)[..., None] * c_err
                    + _gamma(n_k + d_a) * gs_mag[..., None] * c_mag, axis=-2)
    return dh_err @ np.abs(u_q).T, dw_err


def _check_grads(additive_attention_grads, inputs, key_mask, label, hint=GRADS_HINT):
    what = f"additive_attention_grads with {label}"
    ref_dq, ref_dw = ref.additive_attention_grads(*inputs, key_mask)
    # The reference rounds too: each result may differ from it by twice the bound.
    bound_dq, bound_dw = (2 * b for b in additive_grads_bound(*inputs, key_mask))
    extra = {} if key_mask is None else {"key_mask": key_mask}
    mask_before = None if key_mask is None else key_mask.copy()
    result = call_unchanged(additive_attention_grads, *inputs, what=what, **extra)
    if key_mask is not None:
        expect_unchanged(mask_before, key_mask, what=what)
    expect_sequence(result, 2, what=what, names="(dq, dw_score)")
    # Twice the bound is ~1e-13 for scores of a few units, ~1e-7 for scores near 1e6 and a few
    # times 1e-6 on dq with w_score in the thousands. Correct answers written otherwise (the
    # CORRECT styles of tests/submissions/variants.py) stay within 1/20 of it over 300 draws;
    # the planted mistakes miss it by 4e7 times or more.
    expect_within(result[1], ref_dw, bound_dw, what=f"dw_score from {what}", hint=hint)
    expect_within(result[0], ref_dq, bound_dq, what=f"dq from {what}", hint=hint)


def _grads_numpy_only(additive_attention_grads, rng):
    inputs = _grads_inputs(rng, (2,), 3, 4, 3, 2, 5, 2)
    what = "additive_attention_grads with batch axes (2,), n_q=3, n_k=4"
    numpy_only(additive_attention_grads, *inputs, what=what)


def _grads_label(lead, n_q, n_k, d_q, d_k, d_a, d_v):
    return f"batch axes {lead}, n_q={n_q}, n_k={n_k}, widths d_q={d_q}, d_k={d_k}, d_a={d_a}, d_v={d_v}"


def check_additive_grads_values(additive_attention_grads):
    """Zero to two batch axes, n_q != n_k, a single query, a single key (gradients zero),
    and different query, key, hidden and value widths."""
    rng = _rng(9)
    for shape in [((), 3, 5, 4, 6, 7, 2), ((), 1, 1, 2, 2, 3, 1), ((2,), 4, 4, 3, 3, 5, 3), ((2, 3), 2, 6, 5, 4, 8, 4),
                  ((1,), 7, 3, 6, 2, 4, 5), ((3,), 1, 6, 2, 5, 3, 2), ((2, 2), 5, 1, 3, 3, 2, 2)]:
        _check_grads(additive_attention_grads, _grads_inputs(rng, *shape), None, _grads_label(*shape))
    _grads_numpy_only(additive_attention_grads, rng)


def check_additive_grads_key_mask(additive_attention_grads):
    """Masked keys take no part; a sequence with no real key has output 0 and gradients 0
    (never NaN); a mask of all True changes nothing; every score of a row moved by +-1e5,
    where a finite mask value such as -1e4 outweighs or loses to the real keys."""
    rng = _rng(11)
    hint = ("A key whose key_mask entry is False takes no part, however large or small the scores (exclude it "
            "rather than give it a finite score such as -1e4); a sequence whose keys are all masked has output "
            "zero whatever q and w_score are, so its gradients are zero, not NaN. " + GRADS_HINT)
    for shape, offset in [(((3,), 4, 5, 3, 2, 6, 2), None), (((2, 2), 2, 6, 4, 4, 3, 3), None),
                          (((1,), 1, 1, 2, 3, 2, 1), None), (((4,), 3, 6, 2, 3, 5, 2), -1e5),
                          (((2, 3), 2, 4, 3, 3, 4, 2), 1e5), (((3,), 3, 5, 4, 2, 3, 2), -1e5)]:
        lead, n_k = shape[0], shape[2]
        inputs = _grads_inputs(rng, *shape, offset=offset)
        key_mask = rng.random((*lead, n_k)) < 0.6
        key_mask.reshape(-1, n_k)[0] = False                        # one sequence with no real key
        if key_mask.size > n_k:
            key_mask.reshape(-1, n_k)[-1] = True                    # and one with every key real
        moved = "" if offset is None else f", every score moved by {offset:g}"
        _check_grads(additive_attention_grads, inputs, key_mask,
                     f"{_grads_label(*shape)}{moved} and key_mask {key_mask.tolist()}", hint)
    _grads_numpy_only(additive_attention_grads, rng)


def check_additive_grads_extreme(additive_attention_grads):
    """Scores far from zero: every score of a row moved by +-1e5 or 1e6 (the rows keep a spread
    of a few units), w_score entries in the hundreds and thousands (nearly one-hot weights), and
    queries large enough to saturate most hidden units."""
    rng = _rng(10)
    hint = "Use a numerically stable softmax (subtract each row's maximum). " + GRADS_HINT
    shape = ((), 4, 6, 3, 4, 5, 2)
    for offset in (1e5, -1e5, 1e6):
        _check_grads(additive_attention_grads, _grads_inputs(rng, *shape, offset=offset), None,
                     f"{_grads_label(*shape)}, every score moved by {offset:g}", hint)
    for scale in (300.0, 3000.0):
        _check_grads(additive_attention_grads, _grads_inputs(rng, *shape, score_scale=scale), None,
                     f"{_grads_label(*shape)} and w_score entries of size about {scale:g}", hint)
    _check_grads(additive_attention_grads, _grads_inputs(rng, *shape, q_scale=30.0), None,
                 f"{_grads_label(*shape)} and query entries of size about 30 (saturated hidden units)", hint)
    _grads_numpy_only(additive_attention_grads, rng)


# ------------------------------------------------------------ decoder layer

def _attention_targets(attn, prefix):
    d = attn.embed_dim
    return {f"{prefix}_q": (attn.in_proj_weight[:d], attn.in_proj_bias[:d]),
            f"{prefix}_k": (attn.in_proj_weight[d:2 * d], attn.in_proj_bias[d:2 * d]),
            f"{prefix}_v": (attn.in_proj_weight[2 * d:], attn.in_proj_bias[2 * d:]),
            f"{prefix}_o": (attn.out_proj.weight, attn.out_proj.bias)}


def load_torch_weights(layer, torch_layer):
    """Copy a torch.nn.TransformerDecoderLayer's weights into the exercise's
    DecoderLayer (self_q..self_o, cross_q..cross_o, ff1, ff2, norm1..norm3)."""
    import torch

    targets = {**_attention_targets(torch_layer.self_attn, "self"),
               **_attention_targets(torch_layer.multihead_attn, "cross"),
               "ff1": (torch_layer.linear1.weight, torch_layer.linear1.bias),
               "ff2": (torch_layer.linear2.weight, torch_layer.linear2.bias),
               **{f"norm{i}": (getattr(torch_layer, f"norm{i}").weight, getattr(torch_layer, f"norm{i}").bias)
                  for i in (1, 2, 3)}}
    with torch.no_grad():
        for name, (weight, bias) in targets.items():
            module = getattr(layer, name, None)
            if module is None or getattr(module, "weight", None) is None or getattr(module, "bias", None) is None:
                raise GradingFailure(f"DecoderLayer has no attribute {name} with a weight and a bias; keep the "
                                     "attributes that the given __init__ creates.")
            if module.weight.shape != weight.shape or module.bias.shape != bias.shape:
                raise GradingFailure(f"DecoderLayer.{name} has weight shape {tuple(module.weight.shape)}, "
                                     f"expected {tuple(weight.shape)}.")
            module.weight.copy_(weight)
            module.bias.copy_(bias)


def _torch_layer(d_model, num_heads, d_ff, norm_first, seed):
    import torch

    torch.manual_seed(seed)
    layer = torch.nn.TransformerDecoderLayer(d_model, num_heads, d_ff, dropout=0.0, activation="relu",
                                             batch_first=True, norm_first=norm_first, dtype=torch.float64)
    with torch.no_grad():  # non-trivial LayerNorm parameters and biases, so each must be used
        for name, p in layer.named_parameters():
            if name.startswith("norm"):
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.3 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.5 / p.shape[-1] ** 0.5 if p.dim() == 2 else 0.3))
    return layer.eval()


def _check_decoder(DecoderLayer, norm_first):
    import torch

    kind = "pre-norm (norm_first=True)" if norm_first else "post-norm (norm_first=False)"
    # batch, target tokens, memory tokens, d_model, heads, d_ff
    configs = [(2, 5, 3, 8, 2, 16), (1, 1, 4, 4, 1, 8), (3, 7, 7, 12, 3, 5), (2, 4, 9, 8, 8, 32), (1, 9, 1, 6, 2, 24)]
    for seed, (batch, n, m, d_model, heads, d_ff) in enumerate(configs):
        what = f"DecoderLayer({d_model}, {heads}, {d_ff}, norm_first={norm_first})"
        layer = call(DecoderLayer, d_model, heads, d_ff, norm_first=norm_first, what=what)
        if not is_instance(layer, torch.nn.Module):
            raise GradingFailure(f"{what} should create a torch.nn.Module, but created {describe(layer)}.")
        reference = _torch_layer(d_model, heads, d_ff, norm_first, seed)
        layer = layer.double().eval()
        load_torch_weights(layer, reference)
        rng = _rng(20 + seed)
        x = torch.from_numpy(rng.normal(size=(batch, n, d_model)))
        memory = torch.from_numpy(rng.normal(size=(batch, m, d_model)))
        causal = torch.nn.Transformer.generate_square_subsequent_mask(n, dtype=torch.float64)
        expected = reference(x, memory, tgt_mask=causal, tgt_is_causal=True).detach().numpy()
        before = x.clone(), memory.clone()
        what = (f"the {kind} output of {what} for x of shape {tuple(x.shape)} and memory of shape "
                f"{tuple(memory.shape)}")
        found, used = reported_during(call, layer, x, memory, what=what, what_reported=LAYER_REPORT)
        if used:
            note_sighting(layer, "runs PyTorch's attention layers in DecoderLayer", f"{what}: {', '.join(used)}")
            raise GradingFailure(f"{what} ran PyTorch's own attention layers ({', '.join(used)}): write the "
                                 "attention blocks yourself from the given Linear layers, as the exercise asks.")
        if not isinstance(found, torch.Tensor):
            raise GradingFailure(f"{what} should be a torch.Tensor, but is {describe(found)}.")
        if not (torch.equal(before[0], x) and torch.equal(before[1], memory)):
            raise GradingFailure(f"{what}: forward modified its inputs in place.")
        # float64 layers of width <= 16 on values ~1: rounding ~1e-14
        expect_close(found.detach().numpy(), expected, what=what, atol=1e-8,
                     hint="Self-attention is causal (token i sees tokens 0..i) over x; cross-attention takes its "
                          "queries from x and its keys and values from memory. Post-norm: x = norm1(x + self(x)); "
                          "x = norm2(x + cross(x, memory)); x = norm3(x + ff(x)). Pre-norm: x = x + self(norm1(x)); "
                          "x = x + cross(norm2(x), memory); x = x + ff(norm3(x)).")


def check_decoder_post_norm(DecoderLayer):
    _check_decoder(DecoderLayer, norm_first=False)


def check_decoder_pre_norm(DecoderLayer):
    _check_decoder(DecoderLayer, norm_first=True)
