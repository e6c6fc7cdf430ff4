"""The tiny Transformer the book trains while it builds: its tasks produce the
targets they describe, training is deterministic, a trained model solves its
task where an untrained one does not, and the score-scale options and the
missing position table do what the book says."""
import torch

from bookutils.tiny_transformer import (BANK, IGNORE, MONEY, RIVER, SENSE_VOCAB, TinyTransformer, accuracy,
                                        mirror_and_previous, odd_one_out, train, word_sense)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def mirror_model(**kw):
    torch.manual_seed(0)
    return TinyTransformer(10, 10, n_targets=2, d_model=64, n_heads=2, max_len=10, **kw)


def test_mirror_targets_are_the_mirrored_and_previous_digits():
    x, y = mirror_and_previous(5, gen(), n=7)
    for b in range(5):
        for i in range(7):
            assert y[b, i, 0] == x[b, 6 - i]
            assert y[b, i, 1] == (IGNORE if i == 0 else x[b, i - 1])


def test_odd_one_out_has_exactly_one_token_from_another_group():
    x, y = odd_one_out(200, gen(), n=8, groups=4, per_group=4)
    group = x // 4
    assert (y[..., 0].sum(1) == 1).all()
    for b in range(200):
        odd = int(y[b, :, 0].argmax())
        rest = torch.cat([group[b, :odd], group[b, odd + 1:]])
        assert (rest == rest[0]).all() and group[b, odd] != rest[0]


def test_word_sense_labels_only_the_ambiguous_word_with_its_marker():
    x, y = word_sense(300, gen())
    for b in range(300):
        labelled = (y[b, :, 0] != IGNORE).nonzero().flatten().tolist()
        assert labelled == (x[b] == BANK).nonzero().flatten().tolist() and len(labelled) == 1
        markers = x[b][(x[b] == RIVER) | (x[b] == MONEY)]
        assert len(markers) == 1
        assert y[b, labelled[0], 0] == (1 if markers[0] == MONEY else 0)
    assert int(x.max()) < SENSE_VOCAB


def test_training_is_deterministic():
    runs = [train(mirror_model(), mirror_and_previous, 20, lr=3e-3) for _ in range(2)]
    assert runs[0] == runs[1]
    assert train(mirror_model(), mirror_and_previous, 20, lr=3e-3, seed=1) != runs[0]


def test_trained_model_solves_the_mirror_task_and_an_untrained_one_does_not():
    model = mirror_model()
    before = accuracy(model, mirror_and_previous)
    losses = train(model, mirror_and_previous, 300, lr=3e-3)
    after = accuracy(model, mirror_and_previous)
    assert (before < 0.3).all(), before
    assert (after > 0.95).all(), after
    assert losses[-1] < 0.1 * losses[0]


def test_folding_the_factor_into_w_q_gives_the_scaled_scores_at_initialisation():
    x, _ = mirror_and_previous(4, gen())
    outputs = {}
    for scale in ["sqrt", "fold", "none"]:
        model = mirror_model(d_head=128, scale=scale)
        outputs[scale] = (model(x), model.attention_weights()[0])
    torch.testing.assert_close(outputs["fold"][1], outputs["sqrt"][1])
    torch.testing.assert_close(outputs["fold"][0], outputs["sqrt"][0])
    # Unscaled scores at d_k = 128 are spread about sqrt(128) times wider: nearly one-hot rows.
    assert outputs["none"][1].amax(-1).mean() > 2 * outputs["sqrt"][1].amax(-1).mean()


def test_a_model_without_positions_is_permutation_equivariant_and_one_with_them_is_not():
    x, _ = odd_one_out(3, gen())
    perm = torch.randperm(x.shape[1], generator=gen(1))
    for max_len, equivariant in [(None, True), (8, False)]:
        torch.manual_seed(0)
        model = TinyTransformer(16, 2, max_len=max_len)
        with torch.no_grad():
            gap = (model(x[:, perm]) - model(x)[:, perm]).abs().max()
        assert (gap < 1e-5) == equivariant, gap


def test_a_causal_model_does_not_look_ahead():
    torch.manual_seed(0)
    model = TinyTransformer(16, 3, n_layers=2, max_len=12, causal=True)
    x = torch.randint(16, (2, 12), generator=gen())
    changed = x.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 16
    with torch.no_grad():
        a, b = model(x), model(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert (a[:, 7:] - b[:, 7:]).abs().max() > 1e-3
    assert model.attention_weights()[0][0, 0].triu(1).abs().max() == 0


def test_qk_norm_bounds_every_score_by_its_gain():
    torch.manual_seed(0)
    model = mirror_model(d_head=128, scale="qknorm")
    x, _ = mirror_and_previous(50, gen())
    with torch.no_grad():
        model(x)
        attn = model.blocks[0].attn
        first, gain = attn.scores.clone(), attn.gain.item()
        assert first.abs().max() <= gain + 1e-4
        attn.gain.fill_(3.0)
        model(x)
    torch.testing.assert_close(attn.scores, first * 3.0 / gain)      # cosines times the gain
    assert attn.scores.abs().max() <= 3.0 + 1e-5


def test_folding_with_a_slower_w_q_retraces_the_scaled_run():
    scaled = train(mirror_model(d_head=128, scale="sqrt"), mirror_and_previous, 30, lr=3e-3)
    folded_slow = train(mirror_model(d_head=128, scale="fold"), mirror_and_previous, 30, lr=3e-3,
                        q_lr_factor=128 ** -0.5)
    folded = train(mirror_model(d_head=128, scale="fold"), mirror_and_previous, 30, lr=3e-3)
    assert max(abs(a - b) for a, b in zip(scaled, folded_slow)) < 1e-4
    assert max(abs(a - b) for a, b in zip(scaled, folded)) > 1e-2


def test_after_step_sees_every_step():
    seen = []
    train(mirror_model(), mirror_and_previous, 5, after_step=lambda step, model: seen.append(step))
    assert seen == [0, 1, 2, 3, 4]


# ---- positions for length extrapolation: ALiBi, rotary angles and their rescalings

def test_alibi_slopes_follow_the_paper():
    from bookutils.tiny_transformer import alibi_slopes
    import pytest
    # Press et al.: 8 heads get 1/2, 1/4, ..., 1/256; 16 heads start at 1/sqrt(2) with ratio 1/sqrt(2)
    assert alibi_slopes(8).tolist() == [1 / 2 ** k for k in range(1, 9)]
    torch.testing.assert_close(alibi_slopes(16), torch.tensor([2 ** -(k / 2) for k in range(1, 17)],
                                                              dtype=torch.float64))
    assert alibi_slopes(4).tolist() == [0.25, 0.0625, 0.015625, 0.00390625]
    with pytest.raises(ValueError):
        alibi_slopes(6)


def test_alibi_subtracts_the_slope_times_the_distance_from_every_score():
    from bookutils.tiny_transformer import alibi_slopes
    torch.manual_seed(0)
    biased = TinyTransformer(12, 12, n_heads=4, causal=True, positions="alibi")
    plain = TinyTransformer(12, 12, n_heads=4, causal=True)
    plain.load_state_dict(biased.state_dict())
    x = torch.randint(12, (2, 9), generator=gen())
    biased(x), plain(x)
    i, j = torch.meshgrid(torch.arange(9), torch.arange(9), indexing="ij")
    kept = j <= i
    for h, slope in enumerate(alibi_slopes(4).tolist()):
        a, b = biased.blocks[0].attn.scores[:, h], plain.blocks[0].attn.scores[:, h]
        torch.testing.assert_close(a[:, kept], b[:, kept] - slope * (i - j)[kept].float())
        assert torch.isinf(a[:, ~kept]).all()


def test_alibi_needs_a_causal_model_and_scale_rope_a_rotary_one():
    import pytest
    # Press et al. define ALiBi's bias for causal attention only; a symmetric |i - j| is not theirs
    with pytest.raises(ValueError, match="causal"):
        TinyTransformer(12, 12, n_heads=4, positions="alibi")
    # rescaling rotary angles on a model that has none would silently change nothing
    for positions in (None, "sinusoidal", "alibi"):
        with pytest.raises(ValueError, match="rotary"):
            TinyTransformer(12, 12, n_heads=4, causal=True, positions=positions).scale_rope(stretch=4)
    TinyTransformer(12, 12, n_heads=4, causal=True, positions="rope").scale_rope(stretch=4)


def test_rotary_angles_and_their_rescalings():
    import numpy as np
    from bookutils.tiny_transformer import ntk_base, rope_angles
    d, n = 16, 40
    freqs = 1.0 / 10000.0 ** (np.arange(d // 2) * 2 / d)
    np.testing.assert_allclose(rope_angles(n, d).numpy(), np.outer(np.arange(n), freqs))
    # position interpolation: position t turns as position t / stretch did
    np.testing.assert_allclose(rope_angles(n, d, stretch=4).numpy(), np.outer(np.arange(n) / 4, freqs))
    # NTK-aware base: the fastest pair unchanged, the slowest divided by exactly the factor, the others by less
    scaled = rope_angles(n, d, base=ntk_base(4, d)).numpy()[1] / freqs
    assert abs(scaled[0] - 1) < 1e-12 and abs(scaled[-1] - 0.25) < 1e-12
    assert np.all(np.diff(scaled) < 0) and np.all((scaled[1:-1] > 0.25) & (scaled[1:-1] < 1))


def test_rotate_pairs_is_a_complex_multiplication_and_rope_scores_see_only_offsets():
    from bookutils.tiny_transformer import rope_angles, rotate_pairs
    x = torch.randn(3, 5, 8, generator=gen(), dtype=torch.float64)
    angles = rope_angles(5, 8)
    z = torch.complex(x[..., ::2], x[..., 1::2]) * torch.polar(torch.ones_like(angles), angles)
    rotated = rotate_pairs(x, angles)
    torch.testing.assert_close(torch.complex(rotated[..., ::2], rotated[..., 1::2]), z)
    # one token repeated: every score depends on i - j only, with and without interpolation
    torch.manual_seed(0)
    model = TinyTransformer(5, 5, n_heads=2, positions="rope")
    for stretch in (1.0, 4.0):
        model.scale_rope(stretch=stretch)
        model(torch.full((1, 12), 3))
        scores = model.blocks[0].attn.scores[0]
        for offset in range(-11, 12):
            diagonal = torch.diagonal(scores, offset=offset, dim1=-2, dim2=-1)
            assert (diagonal.amax(-1) - diagonal.amin(-1)).max() < 1e-4


def test_sinusoidal_positions_add_the_table_to_the_embeddings():
    from bookutils.positions import sinusoidal_table
    torch.manual_seed(0)
    model = TinyTransformer(7, 7, d_model=16, positions="sinusoidal")
    seen = []
    model.blocks[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    x = torch.randint(7, (2, 50), generator=gen())                   # any length: no table to run out of
    model(x)
    torch.testing.assert_close(seen[0], model.embed(x) + torch.from_numpy(sinusoidal_table(50, 16)).float())
