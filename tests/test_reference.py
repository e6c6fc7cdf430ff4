"""The instructor's NumPy references agree with PyTorch, which was written
independently of them: the hidden tests are only as right as these."""
import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from autograde.reference import principles as ref

rng = np.random.default_rng(0)


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 6), (2, 1, 3, 2)])
def test_softmax_matches_torch_on_every_axis(shape):
    x = rng.normal(scale=5, size=shape)
    for axis in range(-len(shape), len(shape)):
        np.testing.assert_allclose(ref.softmax(x, axis), torch.softmax(torch.from_numpy(x), axis).numpy(), rtol=1e-12)


def test_softmax_is_stable_and_handles_minus_infinity():
    x = np.array([[1e4, 0.0, -1e4], [-np.inf, 3.0, 3.0]])
    np.testing.assert_allclose(ref.softmax(x), torch.softmax(torch.from_numpy(x), -1).numpy())
    np.testing.assert_array_equal(ref.softmax(x)[1], [0.0, 0.5, 0.5])


@pytest.mark.parametrize("lead, n_q, n_k, d_k, d_v", [((), 3, 5, 4, 2), ((2,), 4, 4, 8, 8), ((2, 3), 1, 6, 2, 5)])
def test_sdpa_matches_torch_with_and_without_masks(lead, n_q, n_k, d_k, d_v):
    q, k, v = (rng.normal(size=(*lead, n, d)) for n, d in ((n_q, d_k), (n_k, d_k), (n_k, d_v)))
    mask = rng.random((n_q, n_k)) < 0.5
    mask[:, 0] = True
    for m in (None, mask):
        out, weights = ref.scaled_dot_product_attention(q, k, v, m)
        tm = None if m is None else torch.from_numpy(m)
        expected = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), attn_mask=tm)
        np.testing.assert_allclose(out, expected.numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(weights.sum(-1), 1.0)
        if m is not None:
            assert np.all(weights[..., ~m] == 0)


@pytest.mark.parametrize("batch, n, d_model, heads", [(None, 5, 8, 2), (3, 4, 12, 3), (2, 1, 6, 6), (1, 7, 8, 1)])
def test_multi_head_attention_matches_torch_module(batch, n, d_model, heads):
    x = rng.normal(size=(n, d_model) if batch is None else (batch, n, d_model))
    w_q, w_k, w_v, w_o = (rng.normal(scale=d_model ** -0.5, size=(d_model, d_model)) for _ in range(4))
    mha = torch.nn.MultiheadAttention(d_model, heads, bias=False, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.from_numpy(np.concatenate([w_q.T, w_k.T, w_v.T])))
        mha.out_proj.weight.copy_(torch.from_numpy(w_o.T))
        xt = torch.from_numpy(x)
        expected = mha(xt, xt, xt, need_weights=False)[0].numpy()
    np.testing.assert_allclose(ref.multi_head_attention(x, w_q, w_k, w_v, w_o, heads), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("lead, n, d_model, heads, d_k, d_v, d_out",
                         [((), 5, 8, 2, 3, 5, 7), ((2, 3), 4, 6, 3, 4, 2, 6), ((2,), 1, 5, 1, 2, 9, 3)])
def test_multi_head_attention_with_other_head_widths_matches_torch_per_head(lead, n, d_model, heads, d_k, d_v,
                                                                            d_out):
    x = rng.normal(size=(*lead, n, d_model))
    w_q, w_k = (rng.normal(size=(d_model, heads * d_k)) for _ in range(2))
    w_v, w_o = rng.normal(size=(d_model, heads * d_v)), rng.normal(size=(heads * d_v, d_out))
    xt = torch.from_numpy(x)
    outs = []
    for h in range(heads):
        q, k = (xt @ torch.from_numpy(w[:, h * d_k:(h + 1) * d_k]) for w in (w_q, w_k))
        outs.append(F.scaled_dot_product_attention(q, k, xt @ torch.from_numpy(w_v[:, h * d_v:(h + 1) * d_v])))
    expected = (torch.cat(outs, -1) @ torch.from_numpy(w_o)).numpy()
    np.testing.assert_allclose(ref.multi_head_attention(x, w_q, w_k, w_v, w_o, heads), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shape, axis", [((5,), -1), ((3, 4), 0), ((2, 3, 6), 1), ((2, 1, 3, 2), -1)])
def test_softmax_jvp_matches_torch_forward_mode(shape, axis):
    x, u = rng.normal(scale=3, size=shape), rng.normal(size=shape)
    _, expected = torch.func.jvp(lambda t: torch.softmax(t, axis), (torch.from_numpy(x),), (torch.from_numpy(u),))
    np.testing.assert_allclose(ref.softmax_jvp(x, u, axis), expected.numpy(), rtol=1e-10, atol=1e-13)


def test_softmax_jvp_is_finite_for_huge_and_masked_scores():
    x = np.array([[1e4, 1e4 - 1.0, -1e4], [-np.inf, 0.5, 2.0]])
    u = np.array([[1.0, -2.0, 3.0], [5.0, 1.0, -1.0]])
    found = ref.softmax_jvp(x, u)
    _, expected = torch.func.jvp(lambda t: torch.softmax(t, -1), (torch.from_numpy(x),), (torch.from_numpy(u),))
    np.testing.assert_allclose(found, expected.numpy(), rtol=1e-10, atol=1e-13)
    assert found[1, 0] == 0.0


def _group(n, keep):
    return {p for p in itertools.permutations(range(n)) if keep(p)}


# The permutations each hidden function must commute with, written down from the
# symmetry of its definition (x[p] puts old token p[i] at place i).
SYMMETRY_GROUPS = {
    "self-attention with d_v = 3": _group(4, lambda p: True),
    "self-attention times 1e12": _group(4, lambda p: True),
    "an elementwise map (np.tanh)": _group(4, lambda p: True),
    "a running sum over tokens times 1e-12": {(0, 1, 2, 3)},
    "causal self-attention": {(0, 1, 2, 3, 4)},
    "self-attention with a vector added to the first token": _group(5, lambda p: p[0] == 0),
    "self-attention masked to a ring (each token sees itself and its two neighbours)":  # the dihedral group
        {tuple((s + sign * i) % 6 for i in range(6)) for s in range(6) for sign in (1, -1)},
    "self-attention with a score bias that depends on (i - j) mod n":  # the rotations
        {tuple((s + i) % 5 for i in range(5)) for s in range(5)},
    "x plus x with its tokens reversed":  # the permutations that commute with reversal
        _group(5, lambda p: all(p[4 - i] == 4 - p[i] for i in range(5))),
    "self-attention on a single token": {(0,)},
    "the tokens shifted by one place, cyclically (np.roll)":  # the rotations
        {tuple((s + i) % 5 for i in range(5)) for s in range(5)},
    "x plus the sum of all tokens": _group(4, lambda p: True),
}


def test_commuting_permutations_are_the_symmetry_groups():
    from autograde.checks.principles import _symmetry_cases

    cases = _symmetry_cases()
    assert set(cases) == set(SYMMETRY_GROUPS)
    for label, (f, n, d) in cases.items():
        assert set(ref.commuting_permutations(f, n, d)) == SYMMETRY_GROUPS[label], label


def test_wrong_reorderings_stay_far_from_commuting():
    """On any standard-normal input, a permutation outside the group changes f(x[p]) - f(x)[p]
    by far more than rounding, so a correct answer cannot fail by the luck of its inputs."""
    from autograde.checks.principles import _symmetry_cases

    rng = np.random.default_rng(11)
    for label, (f, n, d) in _symmetry_cases().items():
        outside = [list(p) for p in itertools.permutations(range(n)) if p not in SYMMETRY_GROUPS[label]]
        closest = np.inf
        for _ in range(60):
            x = rng.standard_normal((n, d))
            y = f(x)
            for p in outside:
                closest = min(closest, np.max(np.abs(f(x[p]) - y[p])) / np.max(np.abs(y)))
        assert closest > 1e-4, f"{label}: a wrong permutation came within {closest:.1e} of commuting"


def test_commuting_permutations_by_hand():
    # cumsum([3, 1, 2]) = [3, 4, 6] but cumsum([1, 2, 3])[[2, 0, 1]] = [6, 1, 3]: only the identity commutes.
    assert ref.commuting_permutations(lambda t: np.cumsum(t, 0), 3, 1) == [(0, 1, 2)]
    assert ref.commuting_permutations(lambda t: t[::-1] + t, 3, 2) == [(0, 1, 2), (2, 1, 0)]


# ---------------------------------------------------------------- Chapter 2

from autograde.reference import variants  # noqa: E402


def test_rotary_half_split_matches_the_rotate_half_formula():
    """The layout of most libraries: x * cos + rotate_half(x) * sin, with
    rotate_half(x) = [-x2, x1] and the angles repeated over both halves."""
    x, positions = rng.normal(size=(2, 3, 5, 8)), np.array([4, 0, 9, 2, 2])
    angle = np.outer(positions, 1.0 / 10000 ** (np.arange(0, 8, 2) / 8))
    cos, sin = np.tile(np.cos(angle), 2), np.tile(np.sin(angle), 2)
    rotate_half = np.concatenate([-x[..., 4:], x[..., :4]], axis=-1)
    np.testing.assert_allclose(variants.rotary_half_split(x, positions), x * cos + rotate_half * sin, rtol=1e-12)
    with pytest.raises(ValueError):
        variants.rotary_half_split(np.ones((2, 5)), np.arange(2))


def test_left_padded_attention_matches_torch_on_each_sequence_alone():
    q, k, v = rng.normal(size=(3, 6, 4)), rng.normal(size=(3, 6, 4)), rng.normal(size=(3, 6, 2))
    lengths = [6, 2, 0]
    out = variants.left_padded_causal_attention(q, k, v, lengths)
    for b, length in enumerate(lengths):
        real = slice(6 - length, 6)
        if length:
            alone = F.scaled_dot_product_attention(*(torch.from_numpy(a[b, real]) for a in (q, k, v)), is_causal=True)
            np.testing.assert_allclose(out[b, real], alone.numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(out[b, :6 - length], 0.0)


def test_grouped_query_decoding_matches_torch_gqa():
    n, d_model, n_heads, n_kv, d_head = 7, 5, 6, 2, 3
    x = rng.normal(size=(n, d_model))
    w_q, w_k, w_v = (rng.normal(size=(d_model, h * d_head)) for h in (n_heads, n_kv, n_kv))
    heads = lambda t, h: torch.from_numpy(t.reshape(n, h, d_head).transpose(1, 0, 2))
    expected = F.scaled_dot_product_attention(heads(x @ w_q, n_heads), heads(x @ w_k, n_kv), heads(x @ w_v, n_kv),
                                              is_causal=True, enable_gqa=True).numpy().transpose(1, 0, 2).reshape(n, -1)
    np.testing.assert_allclose(variants.causal_gqa_attention(x, w_q, w_k, w_v, n_heads), expected, rtol=1e-10)
    cache_k = cache_v = np.zeros((n_kv, 0, d_head))
    outputs = []
    for x_t in x:
        out, cache_k, cache_v = variants.decode_step(x_t, cache_k, cache_v, w_q, w_k, w_v, n_heads)
        outputs.append(out)
    np.testing.assert_allclose(np.array(outputs), expected, rtol=1e-10)
    np.testing.assert_allclose(cache_k, (x @ w_k).reshape(n, n_kv, d_head).transpose(1, 0, 2))


@pytest.mark.parametrize("tau", [0.3, 1.0, 4.0])
def test_entropy_slope_equals_autograd(tau):
    scores = rng.normal(scale=2.0, size=(4, 6))
    scores[0, 2] = scores[3, :5] = -np.inf
    t = torch.tensor(tau, dtype=torch.float64, requires_grad=True)
    expected = []
    for row in scores:
        z = torch.from_numpy(row[np.isfinite(row)]) / t
        h = -(torch.softmax(z, 0) * torch.log_softmax(z, 0)).sum()
        expected.append(torch.autograd.grad(h, t)[0].item())
    np.testing.assert_allclose(variants.entropy_temperature_slope(scores, tau), expected, rtol=1e-9, atol=1e-14)


@pytest.mark.parametrize("offset", [None, -1e5])
def test_additive_attention_grads_match_autograd_one_sequence_at_a_time(offset):
    q, k, v, d_out = rng.normal(size=(3, 4, 5)), rng.normal(size=(3, 6, 2)), rng.normal(size=(3, 6, 3)), \
        rng.normal(size=(3, 4, 3))
    u_q, u_k, w_score = rng.normal(size=(5, 7)), rng.normal(size=(2, 7)), rng.normal(size=7)
    if offset is not None:  # hidden unit 0 saturated for every pair: every score moves by the offset
        q[..., 0], u_q[0], u_q[:, 0], u_k[:, 0] = 40.0, 0.0, 0.0, 0.0
        u_q[0, 0], w_score[0] = 1.0, offset
    key_mask = np.array([[True, False, True, True, False, True], [False] * 6, [True] * 6])
    d_q, d_w = variants.additive_attention_grads(q, k, v, u_q, u_k, w_score, d_out, key_mask)
    expected_w = np.zeros(7)
    for b in range(3):
        real = key_mask[b]
        if not real.any():  # no key: output 0 whatever q and w_score are
            np.testing.assert_array_equal(d_q[b], 0.0)
            continue
        tq, tw = torch.tensor(q[b], requires_grad=True), torch.tensor(w_score, requires_grad=True)
        hidden = torch.tanh((tq @ torch.from_numpy(u_q))[:, None, :] + torch.from_numpy(k[b, real] @ u_k)[None])
        out = torch.softmax(hidden @ tw, dim=-1) @ torch.from_numpy(v[b, real])
        (out * torch.from_numpy(d_out[b])).sum().backward()
        np.testing.assert_allclose(d_q[b], tq.grad.numpy(), rtol=1e-9, atol=1e-12)
        expected_w += tw.grad.numpy()
    np.testing.assert_allclose(d_w, expected_w, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------- Chapter 3

from coursekit.memory import traced_peak  # noqa: E402
from autograde.reference import complexity  # noqa: E402


@pytest.mark.parametrize("n, d_model, heads, d_head", [(1, 1, 1, 1), (6, 5, 3, 4), (9, 16, 4, 4), (5, 8, 1, 3)])
def test_training_flops_match_pytorchs_flop_counter(n, d_model, heads, d_head):
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.randn(n, d_model, requires_grad=True)
    w_q, w_k, w_v = (torch.randn(d_model, heads * d_head, requires_grad=True) for _ in range(3))
    w_o = torch.randn(heads * d_head, d_model, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        q, k, v = ((x @ w).reshape(n, heads, d_head).transpose(0, 1) for w in (w_q, w_k, w_v))
        out = (torch.softmax(q @ k.transpose(1, 2), dim=-1) @ v).transpose(0, 1).reshape(n, -1) @ w_o
        out.sum().backward()
    assert complexity.training_flops(n, d_model, heads, d_head) == counter.get_total_flops()


def test_chunk_bytes_match_array_sizes():
    c, heads, groups, d_head = 9, 6, 2, 5
    activations = [np.zeros((heads, c, d_head), np.float16) for _ in range(2)]
    activations += [np.zeros((groups, c, d_head), np.float16) for _ in range(2)]
    scores = np.zeros((heads, c, c), np.float32)
    expected = sum(a.nbytes for a in activations) + scores.nbytes
    assert complexity.chunk_bytes(c, heads, groups, d_head, 2, 4) == expected


SMALL_MODELS = [
    lambda n: n * n,
    lambda n: complexity.chunk_bytes(n, 12, 4, 64, 2, 4),
    lambda n: 10 * ((n + 3) // 4),                      # pages of 4 tokens
    lambda n: 16 * n * math.ceil(math.log2(n)),         # 0 at n = 1
    lambda n: (6144 * n + 2**16 - 1) // 2**16,          # long flat runs
    lambda n: 1 if n == 1 else 1000 * n,                # only n = 1 fits below 2000
]


@pytest.mark.parametrize("model", range(len(SMALL_MODELS)))
def test_longest_fitting_matches_a_scan_from_one(model):
    cost = SMALL_MODELS[model]
    for budget in range(0, 5000, 7):
        n = 0
        while cost(n + 1) <= budget:
            n += 1
        if n == 0:
            with pytest.raises(ValueError, match=str(budget)):
                complexity.longest_fitting(cost, budget)
        else:
            assert complexity.longest_fitting(cost, budget) == n


@pytest.mark.parametrize("budget", [10**18 + 1, 10**40 + 12345, 10**60, 10**60 - 1, 10**75 + 3])
def test_longest_fitting_matches_the_quadratic_formula_for_huge_budgets(budget):
    """a n^2 + b n <= B exactly when n <= (-b + sqrt(b^2 + 4 a B)) / (2a), floored
    with integer square roots (flooring the root first changes nothing)."""
    for a, b in [(1, 0), (24, 6144), (128, 40960), (3, 1)]:
        expected = (math.isqrt(b * b + 4 * a * budget) - b) // (2 * a)
        assert complexity.longest_fitting(lambda n: a * n * n + b * n, budget) == expected


def test_longest_fitting_on_flat_runs_of_huge_models():
    """ceil(n / w) <= B exactly when n <= B w, however large B w is."""
    for width, budget in [(3, 10**40), (2**30 // 6144, 5 * 10**24 + 3), (10**20, 7)]:
        assert complexity.longest_fitting(lambda n: -(-n // width), budget) == budget * width


def test_longest_fitting_stays_within_its_call_bound():
    """The grader holds students to call_bound; the reference must meet it."""
    for answer in list(range(1, 300)) + [2**k + d for k in range(9, 110) for d in (-1, 0, 1)]:
        calls = []

        def cost(n):
            calls.append(n)
            return 0 if n <= answer else 1

        assert complexity.longest_fitting(cost, 0) == answer
        assert len(calls) <= complexity.call_bound(answer)
        assert all(type(n) is int and n >= 1 for n in calls)


def test_receptive_field_matches_a_convolution_stack():
    for widths, dilations in [([], []), ([2], [1]), ([3, 3, 3], [1, 1, 1]), ([2, 2, 2], [1, 2, 4]), ([4, 1, 3], [3, 9, 2])]:
        x = torch.ones(1, 1, 1)
        for width, step in zip(widths, dilations):
            x = F.conv1d(x, torch.ones(1, 1, width), padding=(width - 1) * step, dilation=step)
        reached = torch.nonzero(x[0, 0]).flatten()
        assert complexity.receptive_field(widths, dilations) == int(reached.max() - reached.min()) + 1


def test_dilated_local_attention_matches_torch_with_a_dilated_band():
    n = 13
    q, k, v = rng.normal(size=(n, 4)), rng.normal(size=(n, 4)), rng.normal(size=(n, 3))
    offset = np.arange(n)[None, :] - np.arange(n)[:, None]
    for radius, dilation in [(0, 1), (1, 1), (3, 1), (2, 3), (4, 2), (20, 5), (1, 30)]:
        keep = (np.abs(offset) <= radius * dilation) & (offset % dilation == 0)
        expected = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)),
                                                  attn_mask=torch.from_numpy(keep))
        np.testing.assert_allclose(complexity.dilated_local_attention(q, k, v, radius, dilation), expected.numpy(),
                                   rtol=1e-10)


@pytest.mark.parametrize("batch", [(), (3,), (2, 2)])
def test_causal_linear_attention_equals_its_masked_quadratic_form(batch):
    q, k, v = rng.normal(size=batch + (9, 4)), rng.normal(size=batch + (9, 4)), rng.normal(size=batch + (9, 2))
    phi_q, phi_k = (F.elu(torch.from_numpy(a)) + 1 for a in (q, k))
    kernel = torch.tril(phi_q @ phi_k.transpose(-1, -2)).numpy()
    expected = kernel @ v / kernel.sum(-1, keepdims=True)
    for chunk in (1, 2, 4, 9, 50):
        np.testing.assert_allclose(complexity.causal_linear_attention(q, k, v, chunk), expected, rtol=1e-12)


def test_traced_peak_sees_numpy_temporaries():
    def makes_a_temporary(n):
        return float(np.ones((n, n)).sum())

    _, small = traced_peak(makes_a_temporary, 100)
    _, large = traced_peak(makes_a_temporary, 1000)
    assert 8 * 1000 * 1000 <= large < 2 * 8 * 1000 * 1000
    assert small < 8 * 1000 * 1000 / 50


def test_traced_peak_sees_pytorch_tensors_too():
    def torch_temporary(n):
        return float((torch.ones(n, n, dtype=torch.float64) * 2).sum())

    _, peak = traced_peak(torch_temporary, 1000)
    assert 8 * 1000 * 1000 <= peak <= 3 * 8 * 1000 * 1000
