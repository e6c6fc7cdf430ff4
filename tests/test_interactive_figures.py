"""The builders of the book's interactive figures (bookutils.stepper and the
interactive_* modules), without a browser: the frames hold the states the
pages' code computes, checked against independent formulas, the markup needs
nothing from outside the page, and a figure fed inconsistent code refuses to
build instead of drawing something wrong. release/tests/test_figures.py
operates the same figures on the built site."""
import math
import re

import numpy as np
import pytest

from bookutils import blockwise_attention, causal_keep, masked_attention_2d
from bookutils import interactive_flash, interactive_variants, stepper
from bookutils.online import absorb_block
from bookutils.stepper import Frame, Steps, Toggle, stepper_html


def _frames(html):
    """(key, attributes) of every frame in a figure's markup."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r'<div class="cf-frame" data-key="([^"]*)"([^>]*)>', html)]


def _data(attributes, name):
    import html as h
    import json
    return json.loads(h.unescape(re.search(rf'data-{name}="([^"]*)"', attributes).group(1)))


def test_stepper_refuses_inconsistent_frames():
    one = Frame((0,), "<svg></svg>", "a")
    with pytest.raises(ValueError, match="share a key"):
        stepper_html("f", "F", [Steps("step", ["a", "b"])], [one, one], "c")
    with pytest.raises(ValueError, match="one value per control"):
        stepper_html("f", "F", [Steps("step", ["a"]), Toggle("t", "T")], [one], "c")
    with pytest.raises(ValueError, match="starting position"):
        stepper_html("f", "F", [Steps("step", ["a", "b"])], [Frame((1,), "<svg></svg>", "b")], "c")


def test_markup_needs_nothing_from_outside_and_repeats_no_id():
    rng = np.random.default_rng(0)
    html = interactive_flash.online_softmax_figure(rng.normal(size=8), rng.normal(size=(8, 2)), 4, "c").data
    assert not re.search(r"""(src|href)\s*=""", html)
    assert set(re.findall(r"https?://[^\s\"']+", html)) == {"http://www.w3.org/2000/svg"}   # a namespace, not a request
    assert not re.search(r"\sid=", html)
    script = (stepper.HERE / "stepper.js").read_text()
    assert not re.search(r"fetch|XMLHttpRequest|import\b|src\s*=", script)
    assert html.count('class="cf-frame"') == 1 + 2 * 2 and html.count(" hidden>") == 2 * 2


def test_online_softmax_frames_end_at_the_softmax_and_not_before():
    rng = np.random.default_rng(1)
    x, v = rng.normal(size=13) * 3, rng.normal(size=(13, 3))
    html = interactive_flash.online_softmax_figure(x, v, 4, "c").data
    frames = _frames(html)
    assert len(frames) == 1 + 2 * math.ceil(13 / 4)
    exact = np.exp(x - x.max()) / np.exp(x - x.max()).sum() @ v
    outputs = [np.array(_data(a, "output")) for _, a in frames]
    assert np.allclose(outputs[-1], exact, rtol=0, atol=1e-12)
    assert all(not np.allclose(o, exact, atol=1e-6) for o in outputs[:-1])
    assert [_data(a, "complete") for _, a in frames] == [0] * (len(frames) - 1) + [1]
    assert _data(frames[-1][1], "equal") == 1


def test_online_softmax_figure_shows_a_wrong_update(monkeypatch):
    """A planted mistake: an update that forgets to rescale the old sum when the
    maximum grows. The last frame then disagrees with the softmax."""
    def no_rescale(m, l, block):
        m_new, l_new, alpha, e = absorb_block(m, l, block)
        return m_new, l + e.sum(), 1.0, e
    monkeypatch.setattr(interactive_flash, "absorb_block", no_rescale)
    x, v = np.array([0.0, 1.0, 5.0, 2.0]), np.eye(4)[:, :2]
    frames = _frames(interactive_flash.online_softmax_figure(x, v, 2, "c").data)
    assert _data(frames[-1][1], "complete") == 1 and _data(frames[-1][1], "equal") == 0


@pytest.mark.parametrize("n, d, block_q, block_k", [(40, 16, 8, 8), (37, 4, 8, 5), (10, 3, 16, 4)])
def test_tile_walk_totals_match_the_io_model(n, d, block_q, block_k):
    html = interactive_flash.tile_walk_figure(blockwise_attention, n, d, block_q, block_k, "c").data
    frames = dict(_frames(html))
    steps = math.ceil(n / block_q) * math.ceil(n / block_k)
    unmasked, causal = frames[f"0|{steps}"], frames[f"1|{steps}"]
    assert _data(unmasked, "total") == 2 * n * d + 2 * n * d * math.ceil(n / block_q)
    assert _data(unmasked, "skipped") == 0
    if n > block_q:                     # more than one query block: the causal loop skips tiles
        assert _data(causal, "total") < _data(unmasked, "total")
    if block_q == block_k and n % block_q == 0:
        t = n // block_q
        assert _data(causal, "computed") == t * (t + 1) // 2


def test_tile_walk_refuses_a_loop_that_visits_a_tile_twice():
    def twice(q, k, v, block_q, block_k, causal=False, visit=None):
        blockwise_attention(q, k, v, block_q, block_k, causal=causal, visit=visit)
        visit(0, 0)
    with pytest.raises(AssertionError):
        interactive_flash.tile_walk_figure(twice, 16, 4, 8, 8, "c")


def test_masks_figure_marks_fully_masked_rows():
    rng = np.random.default_rng(2)
    n = 5
    q, k, v = (rng.normal(size=(n, 3)) for _ in range(3))
    left = np.arange(n)[None, :] >= 2
    html = interactive_variants.masks_figure(q, k, v, masked_attention_2d,
                                             {"causal": ("causal", causal_keep(n)), "left": ("left", left)}, "c").data
    frames = dict(_frames(html))
    assert _data(frames["1|1"], "empty-rows") == [0, 1]
    assert _data(frames["0|1"], "empty-rows") == [] and _data(frames["1|0"], "empty-rows") == []
    weights = _data(frames["1|1"], "weights")
    assert weights[0] == [None] * n and math.isclose(sum(weights[4]), 1.0, abs_tol=1e-5)


def test_kv_cache_figure_refuses_caches_that_do_not_match_the_layers():
    rng = np.random.default_rng(3)
    d, n = 4, 5
    layers = [[rng.normal(size=(d, d)) for _ in range(3)] for _ in range(2)]
    X = rng.normal(size=(n, d))
    caches, out = [([], []) for _ in layers], []
    for t in range(n):
        h = X[t]
        for (Wq, Wk, Wv), (K_rows, V_rows) in zip(layers, caches):
            K_rows.append(h @ Wk)
            V_rows.append(h @ Wv)
            s = np.array(K_rows) @ (h @ Wq) / np.sqrt(d)
            w = np.exp(s - s.max())
            h = h + w / w.sum() @ np.array(V_rows)
        out.append(h)
    html = interactive_variants.kv_cache_figure(X, layers, caches, np.array(out), "c").data
    sizes = [_data(a, "bytes") for _, a in _frames(html)]
    assert sizes == [2 * 2 * (t + 1) * d * 8 for t in range(n)]      # layers x (K, V) x rows x d x float64
    caches[1][0][2] = caches[1][0][2] + 1.0                          # a planted mistake: one cached key changed
    with pytest.raises(AssertionError):
        interactive_variants.kv_cache_figure(X, layers, caches, np.array(out), "c")


# ---------------------------------------------------------------- legibility

def _split_k_state(scores, values):          # independent of the decoding page's cell
    m = float(scores.max())
    e = np.exp(scores - m)
    return m, float(e.sum()), e @ values / e.sum()


def _split_k_merge(a, b):
    m = max(a[0], b[0])
    wa, wb = a[1] * np.exp(a[0] - m), b[1] * np.exp(b[0] - m)
    return m, wa + wb, (wa * a[2] + wb * b[2]) / (wa + wb)


def _all_figures():
    """The markup of every Chapter 4 and variants figure that has no page dependency."""
    rng = np.random.default_rng(4)
    figures = {"online": interactive_flash.online_softmax_figure(rng.normal(size=10) * 2, rng.normal(size=(10, 3)),
                                                                 4, "c").data,
               "tiles": interactive_flash.tile_walk_figure(blockwise_attention, 24, 4, 8, 8, "c").data,
               "split-k": interactive_flash.split_k_figure(rng.normal(size=4), rng.normal(size=(16, 4)),
                                                           rng.normal(size=(16, 3)), 4, _split_k_state,
                                                           _split_k_merge, "c").data}
    n = 5
    q, k, v = (rng.normal(size=(n, 3)) for _ in range(3))
    figures["masks"] = interactive_variants.masks_figure(q, k, v, masked_attention_2d,
                                                         {"causal": ("causal", causal_keep(n))}, "c").data
    return figures


def _texts(svg):
    """(x, anchor, size, colour, words) of every <text> of an SVG, with the <svg> element's defaults."""
    import html as h
    for m in re.finditer(r"<text ([^>]*)>([^<]*)</text>", svg):
        attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', m.group(1)))
        yield (float(attrs["x"]), attrs.get("text-anchor", "middle"), float(attrs.get("font-size", 12)),
               attrs.get("fill", svg_module.INK), h.unescape(m.group(2)))


import bookutils.svg as svg_module  # noqa: E402


def test_contrast_follows_wcag():
    """Reference values of WCAG 2: black on white 21:1, #777777 on white 4.48:1
    (just under the 4.5:1 that normal text needs), and a colour with itself 1:1."""
    assert math.isclose(svg_module.contrast("#000000", "#ffffff"), 21.0)
    assert math.isclose(svg_module.contrast("#777777", "#ffffff"), 4.48, abs_tol=0.01)
    assert svg_module.contrast("#d95f02", "#d95f02") == 1.0


def test_ink_on_any_fill_reaches_wcag_text_contrast():
    """Text on a coloured cell: the ink ink_on picks has at least 4.5:1 on every
    fill the figures use, orange included (white on it is only 3.8:1)."""
    fills = [svg_module.ORANGE, svg_module.BLUE, svg_module.GREEN, svg_module.RED, svg_module.GREY]
    fills += [svg_module.blues(v) for v in np.linspace(0, 1, 41)]
    fills += [svg_module.diverging(v) for v in np.linspace(-1, 1, 41)]
    for fill in fills:
        assert svg_module.contrast(svg_module.ink_on(fill), fill) >= 4.5, fill
    assert svg_module.ink_on(svg_module.ORANGE) == "#000000"


def test_figure_text_is_legible_on_white_and_inside_the_drawing():
    """Every coloured text of the figures (not black or white ink on a cell) has
    4.5:1 against the white page, and no text runs past the drawing's edge
    (widths estimated at 0.55 em a character, generous for the sans-serif font)."""
    for name, html in _all_figures().items():
        for svg in re.findall(r"<svg .*?</svg>", html, flags=re.S):
            width = float(re.search(r'viewBox="0 0 ([\d.]+)', svg).group(1))
            for x, anchor, size, colour, words in _texts(svg):
                if colour not in ("#000000", "#ffffff"):
                    assert svg_module.contrast(colour, "#ffffff") >= 4.5, (name, words, colour)
                extent = 0.55 * size * len(words)
                left = {"start": x, "middle": x - extent / 2, "end": x - extent}[anchor]
                assert left >= 0 and left + extent <= width, (name, words)


def test_split_k_names_a_single_chunk_as_one():
    html = interactive_flash.split_k_figure(np.ones(2), np.eye(12, 2), np.eye(12, 2), 4, _split_k_state,
                                            _split_k_merge, "c").data
    assert "chunks 0–0" not in html and "merge chunk 1 into chunk 0" in html


def test_online_softmax_says_the_output_is_undefined_before_anything_is_summed():
    html = interactive_flash.online_softmax_figure(np.array([0.0, 1.0]), np.eye(2), 1, "c").data
    assert "acc/l = undefined" in html and "acc/l = [0.000" not in html


def test_drawings_stop_shrinking_and_scroll_on_narrow_screens():
    """On a narrow screen an SVG keeps at least MIN_SCALE of its width (its
    12-unit text at least 8.4 px) and its frame scrolls sideways."""
    html = interactive_flash.online_softmax_figure(np.array([0.0, 1.0]), np.eye(2), 1, "c").data
    svgs = re.findall(r'<div style="overflow-x:auto"><svg [^>]*viewBox="0 0 (\d+) \d+"[^>]*min-width:(\d+)px', html)
    assert svgs and len(svgs) == html.count("<svg ")
    assert all(int(least) >= 0.7 * int(width) for width, least in svgs)
    assert 12 * svg_module.MIN_SCALE >= 8
