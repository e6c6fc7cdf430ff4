"""Chapter 1's one-query lookup: folding the factor into W_Q with W_Q's learning
rate divided by sqrt(d_k) is the scaled run under Adam with eps = 0, and not at
the same learning rate; without a factor the rows start saturated."""
from bookutils.lookup import train_lookup


def test_folding_with_a_slower_w_q_is_the_scaled_run_under_adam():
    kept, _, _ = train_lookup("sqrt", 64, steps=40, eps=0.0)
    folded, _, _ = train_lookup("fold", 64, steps=40, eps=0.0, q_lr_factor=64 ** -0.5)
    same_rate, _, _ = train_lookup("fold", 64, steps=40, eps=0.0)
    assert max(abs(a - b) for a, b in zip(kept, folded)) < 1e-12
    assert max(abs(a - b) for a, b in zip(kept, same_rate)) > 1e-3


def test_unscaled_rows_start_saturated_and_scaled_ones_do_not():
    _, top_none, _ = train_lookup("none", 128, steps=1)
    _, top_sqrt, _ = train_lookup("sqrt", 128, steps=1)
    assert top_none[0] > 0.9 > 0.5 > top_sqrt[0]


def test_the_lookup_can_be_learned():
    losses, _, right = train_lookup("sqrt", 32, steps=150)
    assert losses[-1] < 0.3 * losses[0] and right[-1] > 0.8
