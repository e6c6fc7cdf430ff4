"""The instructor's NumPy references agree with PyTorch, which was written
independently of them: the hidden tests are only as right as these."""
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


def test_equivariance_gap_is_zero_for_attention_and_not_for_positions():
    w = rng.normal(size=(3, 4, 4))

    def attend(x):
        return ref.scaled_dot_product_attention(x @ w[0], x @ w[1], x @ w[2])[0]

    x, perm = rng.normal(size=(6, 4)), rng.permutation(6)
    assert ref.equivariance_gap(attend, x, perm) < 1e-12
    positions = rng.normal(size=(6, 4))
    assert ref.equivariance_gap(lambda t: attend(t + positions), x, perm) > 1e-3
    # By hand: cumsum of [1, 2, 3] under perm [2, 0, 1] gives a gap of 3.
    assert ref.equivariance_gap(lambda t: np.cumsum(t, 0), np.array([[1.0], [2.0], [3.0]]), [2, 0, 1]) == 3.0
