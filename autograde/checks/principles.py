"""Hidden checks for Chapter 1 (Principles)."""
import numpy as np

from autograde.compare import (
    GradingFailure,
    call,
    call_unchanged,
    expect_close,
    expect_scalar,
    expect_sequence,
    expect_unchanged,
)
from autograde.reference import principles as ref

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


# ------------------------------------------------------- multi-head attention

def check_mha(multi_head_attention):
    rng = _rng(5)
    configs = [((), 5, 8, 2), ((), 1, 6, 3), ((3,), 4, 12, 4), ((2,), 7, 8, 1), ((2,), 3, 8, 8), ((1,), 6, 20, 5)]
    for lead, n, d_model, h in configs:
        x = rng.normal(size=(*lead, n, d_model))
        ws = [rng.normal(scale=d_model ** -0.5, size=(d_model, d_model)) for _ in range(4)]
        what = f"multi_head_attention for x of shape {x.shape} with num_heads={h}"
        found = call_unchanged(multi_head_attention, x, *ws, h, what=what)
        expect_close(found, ref.multi_head_attention(x, *ws, h), what=what,
                     hint="Project with x @ w, split the last axis into num_heads contiguous slices, "
                          "attend per head with d_k = d_model // num_heads, concatenate, then apply w_o.")


# ------------------------------------------------------ variance experiment

def check_dot_product_variance(dot_product_variance):
    n_pairs = 20_000
    for d_k in (1, 2, 8, 32, 128, 512):
        what = f"dot_product_variance(d_k={d_k}, n_pairs={n_pairs}, rng)"
        result = call(dot_product_variance, d_k, n_pairs, np.random.default_rng(d_k), what=what)
        expect_sequence(result, 2, what=what, names="(raw_variance, scaled_variance)")
        raw = expect_scalar(result[0], what=f"the raw variance from {what}")
        scaled = expect_scalar(result[1], what=f"the scaled variance from {what}")
        # 10% is more than five standard errors of the sample variance here.
        if not 0.9 * d_k <= raw <= 1.1 * d_k:
            raise GradingFailure(f"{what}: the variance of q·k should be close to d_k = {d_k}, found {raw:.4g}. "
                                 "Draw q and k with independent standard normal entries.")
        if not 0.9 <= scaled <= 1.1:
            raise GradingFailure(f"{what}: the variance of q·k/sqrt(d_k) should be close to 1, found {scaled:.4g}.")
    what = "dot_product_variance(16, 2000, rng)"
    first = call(dot_product_variance, 16, 2000, np.random.default_rng(7), what=what)
    again = call(dot_product_variance, 16, 2000, np.random.default_rng(7), what=what)
    other = call(dot_product_variance, 16, 2000, np.random.default_rng(8), what=what)
    if not np.allclose(np.asarray(first, float), np.asarray(again, float)):
        raise GradingFailure(f"{what} gave different results for two generators with the same seed; "
                             "draw all random numbers from the rng argument.")
    if np.allclose(np.asarray(first, float), np.asarray(other, float)):
        raise GradingFailure(f"{what} gave the same result for different seeds; "
                             "the variances must be estimated from samples drawn with rng.")


# ----------------------------------------------------------- equivariance

def _self_attention(w_q, w_k, w_v):
    def f(x):
        return ref.scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v)[0]
    return f


def check_equivariance_gap(equivariance_gap):
    rng = _rng(6)
    n, d = 6, 4
    ws = [rng.normal(size=(d, d)) for _ in range(3)]
    positions = rng.normal(size=(n, d))
    functions = {
        "self-attention (equivariant)": _self_attention(*ws),
        "an elementwise map (equivariant)": np.tanh,
        "self-attention after adding position vectors": lambda x: _self_attention(*ws)(x + positions),
        "a running sum over tokens": lambda x: np.cumsum(x, axis=0),
        "a map that reverses the tokens": lambda x: x[::-1] * 2.0,
    }
    perms = [rng.permutation(n) for _ in range(3)] + [np.roll(np.arange(n), 1)]
    for label, f in functions.items():
        for perm in perms:
            x = rng.normal(size=(n, d))
            before = x.copy()
            what = f"equivariance_gap for {label} with perm={perm.tolist()}"
            found = expect_scalar(call(equivariance_gap, f, x, perm, what=what), what=what)
            expect_unchanged(before, x, what=what)
            expected = ref.equivariance_gap(f, x, perm)
            if not np.isclose(found, expected, rtol=1e-6, atol=1e-9):
                raise GradingFailure(
                    f"{what}: expected {expected:.6g}, found {found:.6g}. The gap is the largest absolute "
                    "entry of f(x[perm]) - f(x)[perm]: permute the input rows, and permute the rows of "
                    "the original output the same way.")
