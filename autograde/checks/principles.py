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
from autograde import draws
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
        # x + c rounds each entry by up to 2^-53 |c| < 1e-12, which moves the softmax by about twice
        # that, relatively: 1e-5 is far above it and far below what a missing shift costs.
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


MASK_HINT = ("A masked key must get weight exactly 0 however large its score and however small the kept ones: "
             "exclude it (np.where(mask, scores, -np.inf)) rather than give it a finite penalty such as -1e4, "
             "which scores of this size outweigh.")


def _masked_extreme_cases(rng):
    """Masks on scores in the thousands to about a million: masked keys that score far
    above the kept ones, and rows whose kept keys all score far below -1e4."""
    cases = []
    for seed in range(6):  # random masks, every query keeping at least one key
        lead, n_q, n_k, d = [((), 4, 6, 4), ((2,), 3, 5, 8), ((2, 2), 5, 4, 3)][seed % 3]
        scale = (30.0, 300.0, 1000.0)[seed // 2]
        q, k = rng.normal(scale=scale, size=(*lead, n_q, d)), rng.normal(scale=scale, size=(*lead, n_k, d))
        mask = rng.random((*lead, n_q, n_k)) < 0.5
        mask[..., np.arange(n_q), rng.integers(0, n_k, size=n_q)] = True
        cases.append((f"a random mask of shape {mask.shape} and query/key entries of size about {scale:g}",
                      q, k, rng.normal(size=(*lead, n_k, 3)), mask))
    # Every query's kept keys score about -1e5 and its masked keys about +1e5 (d_k = 1).
    q = rng.uniform(200.0, 400.0, size=(2, 4, 1))
    k = rng.uniform(200.0, 400.0, size=(2, 5, 1)) * np.array([1, -1, 1, -1, -1])[:, None]
    keep = np.array([[False, True, False, True, True], [False, False, False, True, False],
                     [False, True, False, False, False], [True, True, True, True, True]])
    cases.append(("a mask whose kept keys score about -1e5 and whose masked keys score about +1e5",
                  q, k, rng.normal(size=(2, 5, 2)), keep))
    return cases


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
    for label, q, k, v, mask in _masked_extreme_cases(rng):
        what = f"scaled_dot_product_attention with {label}"
        result = call(scaled_dot_product_attention, q, k, v, mask=mask, what=what)
        expect_sequence(result, 2, what=what, names="(output, weights)")
        ref_out, ref_weights = ref.scaled_dot_product_attention(q, k, v, mask)
        expect_close(result[1], ref_weights, what=f"the weights from {what}", hint=MASK_HINT)
        expect_close(result[0], ref_out, what=f"the output from {what}", hint=MASK_HINT)
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


def _attention_with(score_scale=None, softmax_axis=-1, mask_after=False, unstable=False, inverted_mask=False,
                    fill=None, one_sequence=False):
    """Scaled dot-product attention with one deliberate mistake."""
    def attention(q, k, v, mask=None):
        d = q.shape[-1] if score_scale is None else score_scale(q, k, v)
        keys = k.T if one_sequence else np.swapaxes(k, -1, -2)
        scores = q @ keys / np.sqrt(d)
        if mask is not None and not mask_after:
            if inverted_mask:
                scores = np.where(mask, -np.inf, scores)
            else:
                scores = np.where(mask, scores, -np.inf if fill is None else fill)
        if unstable:
            e = np.exp(scores)
            weights = e / np.sum(e, axis=softmax_axis, keepdims=True)
        else:
            weights = _stable_softmax(scores, axis=softmax_axis)
        if mask is not None and mask_after:
            weights = np.where(mask, weights, 0.0)
        return weights @ v, weights
    return attention


def _boolean_attention(q, k, v, mask=None):
    """Correct, relying on the boolean contract (~mask); a row with no key, which the
    specification excludes, comes out as zeros rather than nan."""
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(np.broadcast_to(~mask, scores.shape), -np.inf, scores)
    top = np.max(scores, axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    weights = e / np.where(total > 0, total, 1.0)
    return np.matmul(weights, v), weights


def _indexing_attention(q, k, v, mask=None):
    """Correct, excluding the masked keys by boolean indexing (which needs a boolean mask)."""
    scores = np.einsum("...id,...jd->...ij", q, k) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.copy()
        scores[~np.broadcast_to(mask, scores.shape)] = -np.inf
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    return np.einsum("...ij,...jd->...id", weights, v), weights


CORRECT_ATTENTION = {
    "the reference implementation": ref.scaled_dot_product_attention,
    "a correct implementation that loops over the queries": _looped_attention,
    "a correct implementation that hides the masked keys with ~mask": _boolean_attention,
    "a correct implementation that excludes the masked keys by boolean indexing": _indexing_attention,
}

BUGGY_ATTENTION = {
    "no 1/sqrt(d_k) scaling": _attention_with(score_scale=lambda q, k, v: 1.0),
    "a softmax over the queries instead of the keys": _attention_with(softmax_axis=-2),
    "the mask applied after the softmax (rows no longer sum to 1)": _attention_with(mask_after=True),
    "scores scaled by 1/sqrt(d_v) instead of 1/sqrt(d_k)": _attention_with(score_scale=lambda q, k, v: v.shape[-1]),
    "scores scaled by 1/sqrt(n_k), the number of keys, instead of 1/sqrt(d_k)":
        _attention_with(score_scale=lambda q, k, v: k.shape[-2]),
    "a softmax that overflows on large scores": _attention_with(unstable=True),
    "a mask read the wrong way round (True hides the key)": _attention_with(inverted_mask=True),
    "masked scores set to -1e4 instead of excluded (wrong once the kept scores are far below -1e4)":
        _attention_with(fill=-1e4),
    "k.T instead of swapping the last two axes (it raises an error on batch axes)":
        _attention_with(one_sequence=True),
}

# The anchors: a checker must reject the plainest mistake to earn the point for
# accepting correct attention, and accept the reference to earn the points for
# catching mistakes; each is shown twice, so neither point can be had by
# answering by call number.
PLAIN_MISTAKE = "a softmax over the queries instead of the keys"
PLAIN_CORRECT = "the reference implementation"


class _Recorded:
    """An attention handed to the student's checks: it records what the checks
    asked of it, for the failure message."""

    def __init__(self, attention):
        self.attention, self.calls = attention, []

    def __call__(self, q, k, v, mask=None):
        call = {"mask": mask, "raised": None}
        self.calls.append(call)
        try:
            return self.attention(q, k, v, mask)
        except Exception as exc:
            call["raised"] = f"{type(exc).__name__}: {exc}"
            raise

    def diagnosis(self):
        """Why the student's checks may have rejected a correct attention."""
        if not self.calls:
            return "Your checks decided without calling the attention: run it on inputs and judge what it returns."
        for call in self.calls:
            mask = call["mask"]
            if mask is None:
                continue
            dtype = getattr(mask, "dtype", None)
            if dtype is None or dtype != bool:
                return (f"Your checks passed it a mask of {describe(mask)}, where the specification's mask is a "
                        "boolean array (True: may attend); a correct implementation may rely on that (with ~mask, "
                        "or by indexing with the mask). Pass boolean masks.")
            if mask.ndim and not np.all(np.any(mask, axis=-1)):
                return ("Your checks passed it a mask in which a query may attend to no key; Exercise 2 excludes "
                        "such masks (that row's weights are 0/0), so a correct implementation may return anything "
                        "there. Give every query at least one key.")
        raised = [c["raised"] for c in self.calls if c["raised"]]
        if raised:
            return (f"It raised {raised[0]} on the inputs your checks gave it; use only inputs that Exercise 2's "
                    "specification allows.")
        return ("Compare with a tolerance (np.allclose), not with ==: two correct implementations may add the same "
                "numbers in a different order.")


def _presented():
    """(label, attention, correct) for every implementation, the anchors twice, in
    an order drawn per submission (autograde.draws)."""
    cases = [(label, fn, True) for label, fn in CORRECT_ATTENTION.items()]
    cases += [(label, fn, False) for label, fn in BUGGY_ATTENTION.items()]
    cases += [(PLAIN_CORRECT, CORRECT_ATTENTION[PLAIN_CORRECT], True),
              (PLAIN_MISTAKE, BUGGY_ATTENTION[PLAIN_MISTAKE], False)]
    order = draws.rng("passes_attention_checks").permutation(len(cases))
    return [cases[i] for i in order]


def _verdicts(passes_attention_checks):
    """(label, correct, verdict, recorded attention) for each presented implementation;
    verdict is None when the student's function raised."""
    found = []
    for label, attention, correct in _presented():
        recorded = _Recorded(attention)
        what = f"passes_attention_checks(attention) for {label}"
        try:
            with np.errstate(all="ignore"):
                verdict = call(passes_attention_checks, recorded, what=what)
        except GradingFailure as failure:
            verdict = failure
        else:
            if not isinstance(verdict, (bool, np.bool_)):
                raise GradingFailure(f"{what} should return True or False, but returned {describe(verdict)}.")
            verdict = bool(verdict)
        found.append((label, correct, verdict, recorded))
    return found


def _escaped(label, failure, recorded):
    """The failure for a checker that raised while checking `label`."""
    raised = [c["raised"] for c in recorded.calls if c["raised"]]
    if raised:
        return GradingFailure(
            f"passes_attention_checks(attention) for {label} raised the attention's own error ({raised[0]}) "
            "instead of returning False: a call that raises is a failed check, so catch the exception "
            "(try/except) and return False.")
    return failure


def check_attention_checks_accept_correct(passes_attention_checks):
    """Correct implementations, written several ways, must pass the student's checks,
    and the plainest mistake must not."""
    for label, correct, verdict, recorded in _verdicts(passes_attention_checks):
        if isinstance(verdict, GradingFailure) and (correct or label == PLAIN_MISTAKE):
            raise _escaped(label, verdict, recorded) if not correct else GradingFailure(
                f"{verdict} This implementation meets the specification of Exercise 2. {recorded.diagnosis()}")
        if correct and verdict is False:
            raise GradingFailure(
                f"passes_attention_checks returned False for {label}, which meets the specification of "
                f"Exercise 2. {recorded.diagnosis()}")
        if label == PLAIN_MISTAKE and verdict is True:
            raise GradingFailure(
                f"passes_attention_checks returned True for an implementation with {label}, whose rows of weights "
                "do not sum to 1: checks that accept it cannot tell a correct attention from a wrong one.")


def check_attention_checks_catch_bugs(passes_attention_checks):
    """Each planted mistake must make the student's checks return False, while the
    reference still passes them."""
    missed = []
    for label, correct, verdict, recorded in _verdicts(passes_attention_checks):
        if isinstance(verdict, GradingFailure):
            raise _escaped(label, verdict, recorded)
        if label == PLAIN_CORRECT and verdict is False:
            raise GradingFailure(
                f"passes_attention_checks returned False for {label}, which is correct: checks that reject it "
                f"catch nothing. {recorded.diagnosis()}")
        if not correct and verdict and label not in missed:
            missed.append(label)
    if missed:
        raise GradingFailure(
            "passes_attention_checks returned True for an implementation with "
            + "; for one with ".join(missed)
            + ". Choose inputs that expose each mistake: batch axes, d_k different from d_v, n_q different from "
              "n_k, a mask, scores large enough to overflow np.exp, and a mask on scores far from 0 (kept keys "
              "scoring far below -1e4, masked ones far above the kept ones).")


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
