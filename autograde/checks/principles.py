"""Hidden checks for Chapter 1 (Principles)."""
import numpy as np

from autograde.compare import (
    GradingFailure,
    call,
    call_unchanged,
    describe,
    expect_close,
    expect_sequence,
    numpy_only,
)
from autograde.memory import traced_peak
from autograde.reference import principles as ref

# The functions these checks grade as NumPy code: their hidden tests call them in the student's
# process without PyTorch (autograde.execute).
NUMPY_GRADED = ('softmax', 'scaled_dot_product_attention', 'softmax_jvp')

RNG_SEED = 20260


def _rng(offset=0):
    return np.random.default_rng(RNG_SEED + offset)


# ---------------------------------------------------------------- softmax

def check_softmax_any_axis(softmax):
    """Any ndim and any axis, negative or positive; the input is left alone."""
    rng = _rng(1)
    shapes = [(7,), (1,), (3, 5), (5, 1), (2, 3, 4), (2, 1, 3, 6)]
    for shape in shapes:
        x = rng.normal(scale=3.0, size=shape)
        for axis in range(-len(shape), len(shape)):
            what = f"softmax(x, axis={axis}) for x of shape {shape}"
            found = call_unchanged(softmax, x, axis=axis, what=what)
            expect_close(found, ref.softmax(x, axis=axis), what=what,
                         hint="Normalise along the requested axis only.")
    x = rng.normal(size=(4, 6))
    expected = ref.softmax(x, axis=-1)
    found = call(softmax, x, what="softmax(x) with the default axis")
    expect_close(found, expected, what="softmax(x) with the default axis",
                 hint="The default must be the last axis (axis=-1).")
    x = rng.normal(size=(2, 3, 4))
    expected, what = ref.softmax(x, axis=1), "softmax(x, axis=1) for x of shape (2, 3, 4)"
    expect_close(numpy_only(softmax, x, 1, what=what), expected, what=what)


def check_softmax_stable(softmax):
    """|x| up to 1e4, constant shifts, and -inf entries for masked positions."""
    rng = _rng(2)
    cases = {
        "large positive values": rng.uniform(9e3, 1e4, size=(3, 5)),
        "large negative values": -rng.uniform(9e3, 1e4, size=(3, 5)),
        "values from -1e4 to 1e4": rng.uniform(-1e4, 1e4, size=(4, 6)),
        "a row with one entry far above the rest": np.array([[1e4, 0.0, -1e4, 5.0]]),
        "rows at very different scales": np.array([[1e4, 1e4 - 1, 1e4 - 3], [-1e4, -1e4 + 2, -1e4 + 1]]),
        "entries of -inf (masked) beside finite ones": np.array([[-np.inf, 1.0, 2.0], [0.0, -np.inf, -np.inf]]),
    }
    for label, x in cases.items():
        for axis in (-1, 0):
            if axis == 0 and np.isneginf(x).any():
                continue  # a column could be entirely -inf
            what = f"softmax(x, axis={axis}) with {label}"
            expected = ref.softmax(x, axis=axis)
            found = call(softmax, x.copy(), axis=axis, what=what)
            expect_close(found, expected, what=what,
                         hint="Subtract the maximum along the axis before exponentiating.")
    x = np.array([[1e4, 0.0, -np.inf], [-1e4, -1e4 + 1, 5.0]])
    expected, what = ref.softmax(x), "softmax(x) with entries of 1e4 and -inf"
    expect_close(numpy_only(softmax, x, -1, what=what), expected, what=what)
    # Shift invariance: softmax(x + c) == softmax(x) even for huge c.
    x = rng.normal(size=(2, 5))
    for c in (1e3, -1e3, 5e3):
        what = f"softmax(x + {c:g}) compared with softmax(x)"
        found = call(softmax, x + c, what=what)
        expect_close(found, ref.softmax(x), what=what, rtol=1e-5,
                     hint="Softmax is unchanged by adding a constant to every entry.")


# ------------------------------------------------- scaled dot-product attention

def _sdpa_cases(rng):
    """(label, q, k, v, mask) with batch axes, n_q != n_k, d_v != d_k, broadcast masks."""
    def qkv(lead, n_q, n_k, d_k, d_v):
        return (rng.normal(size=(*lead, n_q, d_k)), rng.normal(size=(*lead, n_k, d_k)),
                rng.normal(size=(*lead, n_k, d_v)))

    cases = []
    for lead, n_q, n_k, d_k, d_v in [((), 1, 1, 1, 1), ((), 4, 6, 3, 5), ((2,), 5, 5, 8, 8),
                                     ((2, 3), 3, 7, 4, 2), ((1, 2, 2), 6, 4, 16, 3)]:
        cases.append((f"batch axes {lead}, n_q={n_q}, n_k={n_k}, d_k={d_k}, d_v={d_v}, no mask",
                      *qkv(lead, n_q, n_k, d_k, d_v), None))
    # Masks: full shape, broadcast over batch, broadcast over queries (padding).
    q, k, v = qkv((2, 3), 5, 5, 4, 6)
    causal = np.tril(np.ones((5, 5), dtype=bool))
    cases.append(("a causal (n_q, n_k) mask broadcast over batch axes (2, 3)", q, k, v, causal))
    random_mask = rng.random((2, 3, 5, 5)) < 0.6
    random_mask[..., 0] = True  # every query keeps at least one key
    cases.append(("a random mask of the full shape (2, 3, 5, 5)", q, k, v, random_mask))
    q, k, v = qkv((3,), 4, 6, 5, 2)
    padding = np.ones((3, 1, 6), dtype=bool)
    padding[0, :, 4:] = False
    padding[1, :, 2:] = False
    cases.append(("a padding mask of shape (3, 1, 6) broadcast over queries", q, k, v, padding))
    return cases


def check_sdpa_batched_and_masked(scaled_dot_product_attention):
    rng = _rng(3)
    for label, q, k, v, mask in _sdpa_cases(rng):
        what = f"scaled_dot_product_attention with {label}"
        result = call_unchanged(scaled_dot_product_attention, q, k, v, mask=mask, what=what)
        expect_sequence(result, 2, what=what, names="(output, weights)")
        out, weights = result
        ref_out, ref_weights = ref.scaled_dot_product_attention(q, k, v, mask)
        expect_close(weights, ref_weights, what=f"the weights from {what}",
                     hint="Scale scores by 1/sqrt(d_k), give masked positions zero weight, "
                          "and normalise over the keys (last axis).")
        expect_close(out, ref_out, what=f"the output from {what}")
    q, k, v = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 2))
    expected = ref.scaled_dot_product_attention(q, k, v)[0]
    what = "scaled_dot_product_attention for a batch of 2 sequences"
    result = numpy_only(scaled_dot_product_attention, q, k, v, None, what=what)
    expect_sequence(result, 2, what=what, names="(output, weights)")
    expect_close(result[0], expected, what=f"the output from {what}")


def check_sdpa_extreme_scores(scaled_dot_product_attention):
    """Large scores must not overflow; near-one-hot weights must be exact."""
    rng = _rng(4)
    for scale in (30.0, 300.0):
        q = rng.normal(scale=scale, size=(2, 4, 8))
        k = rng.normal(scale=scale, size=(2, 6, 8))
        v = rng.normal(size=(2, 6, 3))
        what = f"scaled_dot_product_attention with query/key entries of size about {scale:g}"
        result = call(scaled_dot_product_attention, q, k, v, what=what)
        expect_sequence(result, 2, what=what, names="(output, weights)")
        ref_out, ref_weights = ref.scaled_dot_product_attention(q, k, v)
        expect_close(result[1], ref_weights, what=f"the weights from {what}",
                     hint="Use a numerically stable softmax (subtract the row maximum).")
        expect_close(result[0], ref_out, what=f"the output from {what}")
    q, k, v = rng.normal(scale=300.0, size=(3, 8)), rng.normal(scale=300.0, size=(5, 8)), rng.normal(size=(5, 2))
    expected = ref.scaled_dot_product_attention(q, k, v)[0]
    what = "scaled_dot_product_attention with query/key entries of size about 300, one sequence"
    result = numpy_only(scaled_dot_product_attention, q, k, v, None, what=what)
    expect_sequence(result, 2, what=what, names="(output, weights)")
    expect_close(result[0], expected, what=f"the output from {what}")


# ------------------------------------------------------- multi-head attention

def check_mha(multi_head_attention):
    """Head widths d_k != d_v, an output width of its own, zero to two batch axes."""
    rng = _rng(5)
    # (batch axes, n, d_model, num_heads, d_k, d_v, d_out)
    configs = [((), 5, 8, 2, 4, 4, 8), ((), 1, 6, 3, 2, 5, 4), ((3,), 4, 12, 4, 3, 6, 12), ((2,), 7, 8, 1, 5, 3, 2),
               ((2,), 3, 8, 8, 1, 2, 8), ((2, 2), 6, 10, 5, 6, 2, 7), ((1,), 5, 4, 2, 8, 1, 9)]
    for lead, n, d_model, h, d_k, d_v, d_out in configs:
        x = rng.normal(size=(*lead, n, d_model))
        ws = [rng.normal(scale=d_model ** -0.5, size=(d_model, h * d_k)),
              rng.normal(scale=d_model ** -0.5, size=(d_model, h * d_k)),
              rng.normal(scale=d_model ** -0.5, size=(d_model, h * d_v)),
              rng.normal(scale=(h * d_v) ** -0.5, size=(h * d_v, d_out))]
        expected = ref.multi_head_attention(x, *ws, h)
        what = (f"multi_head_attention for x of shape {x.shape} with num_heads={h}, d_k={d_k}, d_v={d_v} "
                f"and w_o of shape {ws[3].shape}")
        found = call_unchanged(multi_head_attention, x, *ws, h, what=what)
        expect_close(found, expected, what=what,
                     hint="Take d_k = w_q.shape[1] // num_heads and d_v = w_v.shape[1] // num_heads, give head h "
                          "the contiguous columns of its own width, scale by 1/sqrt(d_k), concatenate the heads' "
                          "outputs in head order, then apply w_o.")


# ----------------------------------------------------- softmax Jacobian

def check_softmax_jvp(softmax_jvp):
    """Any ndim and axis, huge and -inf scores, tangents of any size; inputs left alone."""
    rng = _rng(7)
    cases = [((6,), -1, 1.0), ((1,), 0, 1.0), ((3, 5), -1, 3.0), ((3, 5), 0, 3.0), ((2, 3, 4), 1, 2.0),
             ((2, 1, 3, 6), -4, 1.0), ((2, 3, 4), -2, 1e4)]
    for shape, axis, scale in cases:
        x = rng.normal(scale=scale, size=shape)
        u = rng.normal(scale=10.0, size=shape)
        expected = ref.softmax_jvp(x, u, axis=axis)
        what = f"softmax_jvp(x, u, axis={axis}) for x of shape {shape} with entries of size about {scale:g}"
        found = call_unchanged(softmax_jvp, x, u, axis=axis, what=what)
        expect_close(found, expected, what=what,
                     hint="Multiply by diag(p) - p p^T with p = softmax(x) along the axis, and compute p "
                          "stably (subtract the maximum).")
    masked = np.array([[-np.inf, 1.0, 2.0, -np.inf], [0.0, -np.inf, 5.0, 1e4]])
    u = rng.normal(size=masked.shape)
    expected = ref.softmax_jvp(masked, u)
    what = "softmax_jvp(x, u) with -inf (masked) entries in x"
    found = call_unchanged(softmax_jvp, masked, u, what=what)
    expect_close(found, expected, what=what,
                 hint="Masked entries have p = 0, so their entries of the product are 0.")
    x = rng.normal(size=(3, 4))
    u = rng.normal(size=(3, 4))
    what = "softmax_jvp(x, u) with the default axis"
    expect_close(call_unchanged(softmax_jvp, x, u, what=what), ref.softmax_jvp(x, u, axis=-1), what=what,
                 hint="The default must be the last axis (axis=-1).")
    x, u = rng.normal(size=(2, 6)), rng.normal(size=(2, 6))
    expected, what = ref.softmax_jvp(x, u), "softmax_jvp(x, u) for x of shape (2, 6)"
    expect_close(numpy_only(softmax_jvp, x, u, what=what), expected, what=what)
    # Ju needs O(n) memory per slice; J itself is n x n: 32 MiB for one slice of 2048.
    n = 2048
    x, u = rng.normal(size=(4, n)), rng.normal(size=(4, n))
    expected, what = ref.softmax_jvp(x, u), f"softmax_jvp(x, u) for x of shape {x.shape}"
    found, peak = traced_peak(call, softmax_jvp, x, u, what=what)
    expect_close(found, expected, what=what)
    if peak >= n * n * 8 // 4:
        raise GradingFailure(
            f"{what}: the peak memory was {peak / 2**20:.1f} MiB, while one {n} x {n} Jacobian takes "
            f"{n * n * 8 / 2**20:.0f} MiB and the product needs only a few arrays of the input's size "
            f"({x.nbytes / 2**20:.2f} MiB). Work Ju out on paper so that J is never formed.")


# -------------------------------------------- a property check that finds bugs

def _stable_softmax(s, axis=-1):
    s = s - np.max(s, axis=axis, keepdims=True)
    e = np.exp(s)
    return e / np.sum(e, axis=axis, keepdims=True)


def _masked(scores, mask):
    return scores if mask is None else np.where(mask, scores, -np.inf)


def _looped_attention(q, k, v, mask=None):
    """Correct, written differently from the reference: one query at a time."""
    scores = np.einsum("...qd,...kd->...qk", q, k) / np.sqrt(q.shape[-1])
    scores = _masked(scores, mask)
    weights = np.stack([_stable_softmax(scores[..., i, :]) for i in range(scores.shape[-2])], axis=-2)
    return np.einsum("...qk,...kd->...qd", weights, v), weights


def _attention_with(score_scale=None, softmax_axis=-1, mask_after=False, unstable=False, inverted_mask=False):
    """Scaled dot-product attention with one deliberate mistake."""
    def attention(q, k, v, mask=None):
        d = q.shape[-1] if score_scale is None else score_scale(q, k, v)
        scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(d)
        if mask is not None and not mask_after:
            scores = np.where(mask, -np.inf, scores) if inverted_mask else _masked(scores, mask)
        if unstable:
            e = np.exp(scores)
            weights = e / np.sum(e, axis=softmax_axis, keepdims=True)
        else:
            weights = _stable_softmax(scores, axis=softmax_axis)
        if mask is not None and mask_after:
            weights = np.where(mask, weights, 0.0)
        return weights @ v, weights
    return attention


CORRECT_ATTENTION = {
    "the reference implementation": ref.scaled_dot_product_attention,
    "a correct implementation that loops over the queries": _looped_attention,
}

BUGGY_ATTENTION = {
    "no 1/sqrt(d_k) scaling": _attention_with(score_scale=lambda q, k, v: 1.0),
    "a softmax over the queries instead of the keys": _attention_with(softmax_axis=-2),
    "the mask applied after the softmax (rows no longer sum to 1)": _attention_with(mask_after=True),
    "scores scaled by 1/sqrt(d_v) instead of 1/sqrt(d_k)": _attention_with(score_scale=lambda q, k, v: v.shape[-1]),
    "a softmax that overflows on large scores": _attention_with(unstable=True),
    "a mask read the wrong way round (True hides the key)": _attention_with(inverted_mask=True),
}


def _verdict(passes_attention_checks, attention, label):
    what = f"passes_attention_checks(attention) for {label}"
    with np.errstate(all="ignore"):
        found = call(passes_attention_checks, attention, what=what)
    if not isinstance(found, (bool, np.bool_)):
        raise GradingFailure(f"{what} should return True or False, but returned {describe(found)}.")
    return bool(found)


def check_attention_checks_accept_correct(passes_attention_checks):
    """Correct implementations, written two ways, must pass the student's checks."""
    for label, attention in CORRECT_ATTENTION.items():
        if not _verdict(passes_attention_checks, attention, label):
            raise GradingFailure(
                f"passes_attention_checks returned False for {label}, which meets the specification of "
                "Exercise 2. Compare with a tolerance (np.allclose), not with ==: two correct implementations "
                "may add the same numbers in a different order.")


def check_attention_checks_catch_bugs(passes_attention_checks):
    """Each planted mistake must make the student's checks return False."""
    missed = [label for label, attention in BUGGY_ATTENTION.items()
              if _verdict(passes_attention_checks, attention, label)]
    if missed:
        raise GradingFailure(
            "passes_attention_checks returned True for an implementation with "
            + "; for one with ".join(missed)
            + ". Choose inputs that expose each mistake: d_k different from d_v, n_q different from n_k, "
              "a mask, and scores large enough to overflow np.exp.")


# ----------------------------------------------------------- symmetries

def _attention(w_q, w_k, w_v, keep=None, bias=None):
    """Self-attention with an optional mask of kept (query, key) pairs and an additive score bias."""
    def f(x):
        q, k, v = x @ w_q, x @ w_k, x @ w_v
        scores = q @ k.T / np.sqrt(q.shape[-1]) + (0.0 if bias is None else bias)
        if keep is not None:
            scores = np.where(keep, scores, -np.inf)
        return ref.softmax(scores, axis=-1) @ v
    return f


def _symmetry_cases():
    """label -> (f, n, d): sequence functions whose commuting permutations are known
    (tests/test_reference.py checks each set against the group it should be)."""
    rng = _rng(6)
    d = 4
    # Weights of scale 1/sqrt(d) keep the softmax away from saturation, where a reordering
    # that does not commute could agree to many digits on some inputs.
    ws = [rng.normal(size=(d, d)) / np.sqrt(d) for _ in range(2)] + [rng.normal(size=(d, 3))]
    offsets = np.subtract.outer(np.arange(6), np.arange(6))
    ring = (np.abs(offsets) <= 1) | (np.abs(offsets) == 5)  # itself and its two neighbours on a cycle of 6
    circulant = rng.normal(size=5)[np.subtract.outer(np.arange(5), np.arange(5)) % 5]  # bias by (i - j) mod 5
    token0 = np.zeros((5, d))
    token0[0] = 3.0 * rng.normal(size=d)  # a vector added to the first token only
    attend = _attention(*ws)
    return {
        "self-attention with d_v = 3": (attend, 4, d),
        "self-attention times 1e12": (lambda x: 1e12 * attend(x), 4, d),
        "an elementwise map (np.tanh)": (np.tanh, 4, d),
        "a running sum over tokens times 1e-12": (lambda x: 1e-12 * np.cumsum(x, axis=0), 4, d),
        "causal self-attention": (_attention(*ws, keep=np.tril(np.ones((5, 5), bool))), 5, d),
        "self-attention with a vector added to the first token": (lambda x: attend(x + token0), 5, d),
        "self-attention masked to a ring (each token sees itself and its two neighbours)":
            (_attention(*ws, keep=ring), 6, d),
        "self-attention with a score bias that depends on (i - j) mod n": (_attention(*ws, bias=circulant), 5, d),
        "x plus x with its tokens reversed": (lambda x: x + x[::-1], 5, 2),
        "the tokens shifted by one place, cyclically (np.roll)": (lambda x: np.roll(x, 1, axis=0), 5, 3),
        "x plus the sum of all tokens": (lambda x: x + x.sum(axis=0), 4, 3),
        "self-attention on a single token": (attend, 1, d),
    }


def _shape_guard(f, n, d):
    def guarded(x):
        shape = np.shape(x)
        if shape != (n, d):
            raise ValueError(f"f takes one array of shape ({n}, {d}), as the exercise says; it was called with "
                             f"shape {shape}")
        return f(np.asarray(x, dtype=np.float64))
    return guarded


def _as_permutations(found, n, what):
    """The student's answer as a set of tuples, or a GradingFailure saying what is wrong with it."""
    try:
        perms = [tuple(int(i) for i in p) for p in found]
    except TypeError:
        raise GradingFailure(f"{what} should return a list of permutations (tuples of ints), "
                             f"but returned {describe(found)}.") from None
    for perm in perms:
        if sorted(perm) != list(range(n)):
            raise GradingFailure(f"{what} returned {perm}, which is not a permutation of range({n}).")
    if len(set(perms)) != len(perms):
        raise GradingFailure(f"{what} returned some permutations more than once.")
    return set(perms)


def _listed(perms, limit=3):
    shown = sorted(perms)[:limit]
    more = f" and {len(perms) - limit} more" if len(perms) > limit else ""
    return ", ".join(map(str, shown)) + more


SCALE_CASES = ("self-attention times 1e12", "a running sum over tokens times 1e-12")


def check_commuting_permutations(commuting_permutations):
    for label, (f, n, d) in _symmetry_cases().items():
        what = f"commuting_permutations(f, n={n}, d={d}) for f = {label}"
        found = _as_permutations(call(commuting_permutations, _shape_guard(f, n, d), n, d, what=what), n, what)
        expected = set(ref.commuting_permutations(f, n, d))
        missing, extra = expected - found, found - expected
        if missing or extra:
            problems = []
            if missing:
                problems.append(f"missed {len(missing)} that commute ({_listed(missing)})")
            if extra:
                problems.append(f"returned {len(extra)} that do not ({_listed(extra)})")
            if label in SCALE_CASES:
                advice = ("The outputs here are of size about 1e12 or 1e-12: judge the difference relative to "
                          "the size of f(x), not with a fixed absolute tolerance such as "
                          "np.allclose's default atol=1e-8.")
            elif extra:
                advice = ("A permutation commutes only if f(x[p]) equals f(x)[p] row for row (the same rows in "
                          "another order is not enough); try several random inputs and a tight tolerance, since "
                          "on a single input a wrong reordering can come close.")
            else:
                advice = ("A permutation p commutes when f(x[p]) equals f(x)[p]: the output of the reordered "
                          "input against the original output reordered the same way (not by the inverse "
                          "permutation), within rounding.")
            raise GradingFailure(f"{what}: expected {len(expected)} permutations, found {len(found)}; it "
                                 + " and ".join(problems) + ". " + advice)
