"""The interactive figures of the built site, in a real browser: each control
is operated (by keyboard, and the step buttons by mouse), the figure must show
the state the page computed for that position, screen readers are told of the
change, nothing is fetched, axe-core finds no serious or critical violation,
and every figure page stays small. The numbers checked are the page's own,
read from the data attributes of the frame on display."""
import json
import math

import pytest

from tests.test_site import Visit, browser, server  # noqa: F401  (fixtures)

PAGES = {   # figure name: the page that teaches it
    "temperature": "book/variants/temperature",
    "rotary": "book/variants/positional_encoding",
    "masks": "book/variants/causal_masking",
    "kv-cache": "book/variants/kv_cache",
    "online-softmax": "book/flash/online_softmax",
    "tile-walk": "book/flash/tiling",
    "split-k": "book/flash/decoding",
}
MAX_PAGE_BYTES = 3_000_000   # HTML of a page with figures, images included


class Figure:
    """One interactive figure on a loaded page. The data of the frame on
    display are read in one call and kept until a control is operated."""

    def __init__(self, page, name):
        self.page = page
        self.root = page.locator(f'.cf-stepper[data-figure="{name}"]')
        assert self.root.count() == 1, f"{name}: figure not found"
        self.root.scroll_into_view_if_needed()
        self._state = None

    def state(self):
        if self._state is None:
            self._state = self.root.evaluate("""root => {
                const shown = [...root.querySelectorAll('.cf-frame')].filter(f => !f.hidden);
                if (shown.length !== 1) return null;
                const out = {live: root.querySelector('.cf-live').textContent};
                for (const a of shown[0].attributes) if (a.name.startsWith('data-')) out[a.name.slice(5)] = a.value;
                return out; }""")
            assert self._state is not None, "exactly one frame must be on display"
        return self._state

    def data(self, name):
        return json.loads(self.state()[name])

    def live_text(self):
        return self.state()["live"]

    def summary(self):
        return self.state()["summary"]

    def control(self, name):
        return self.root.locator(f'.cf-controls [data-control="{name}"]')

    def button(self, move):
        return self.root.locator(f".cf-controls button[data-move='{move}']")

    def press(self, name, key):
        self.control(name).focus()
        self.page.keyboard.press(key)
        self._state = None

    def click(self, locator):
        locator.click()
        self._state = None

    def slider_positions(self, name):
        return int(self.control(name).get_attribute("max")) + 1


@pytest.fixture(scope="module")
def visits(browser, server):   # noqa: F811
    opened = {}

    def visit(name):
        if name not in opened:
            opened[name] = Visit(browser, server, f"{PAGES[name]}.html")
        return opened[name]

    yield visit
    for v in opened.values():
        v.close()


def _clean(visit):
    assert not visit.errors, visit.errors
    assert not visit.failed, visit.failed
    assert not visit.external, visit.external


def test_online_softmax_ends_at_the_exact_softmax(visits):
    visit = visits("online-softmax")
    fig = Figure(visit.page, "online-softmax")
    assert fig.data("complete") == 0 and fig.data("seen") == 0
    assert fig.button(-1).is_disabled()
    steps = fig.slider_positions("step")
    seen = []
    for _ in range(steps - 1):
        fig.click(fig.button(1))
        seen.append(fig.data("seen"))
        if fig.data("complete") == 0:
            assert max(abs(a - b) for a, b in zip(fig.data("output"), fig.data("exact"))) > 1e-6
    assert seen == sorted(seen) and seen[-1] == len(fig.data("exact-weights"))
    assert fig.data("complete") == 1 and fig.data("equal") == 1
    assert fig.button(1).is_disabled()
    assert all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(fig.data("output"), fig.data("exact")))
    assert all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(fig.data("weights"), fig.data("exact-weights")))
    assert "equal" in fig.live_text() and fig.live_text() == fig.summary()
    fig.press("step", "Home")
    assert fig.data("seen") == 0 and fig.data("m") is None
    fig.press("step", "ArrowRight")                   # block 0 arrives: known, not yet absorbed
    assert fig.data("seen") == 0 and fig.live_text().startswith("Block 0 arrives")
    fig.press("step", "ArrowRight")
    assert fig.data("seen") > 0 and fig.data("l") > 0
    fig.click(fig.button(-1))
    fig.click(fig.button(-1))
    assert fig.data("l") == 0 and fig.button(-1).is_disabled()
    _clean(visit)


def test_tile_walk_skips_causal_tiles_and_counts_the_model_traffic(visits):
    visit = visits("tile-walk")
    fig = Figure(visit.page, "tile-walk")
    for causal in (False, True):
        assert fig.control("causal").is_checked() == causal
        fig.press("step", "Home")
        assert fig.data("total") == 0
        total, skipped = 0, 0
        for _ in range(fig.slider_positions("step") - 1):
            fig.press("step", "ArrowRight")
            assert sum(fig.data("moved").values()) == fig.data("total")
            if fig.data("skipped") > skipped:            # this step's tile was skipped: nothing moved
                assert fig.data("total") == total
            else:
                assert fig.data("total") > total
            total, skipped = fig.data("total"), fig.data("skipped")
        assert fig.data("finished") == 1 and fig.data("total") == fig.data("model")
        tiles = fig.data("computed") + fig.data("skipped")
        blocks = math.isqrt(tiles)
        if causal:
            assert fig.data("computed") == blocks * (blocks + 1) // 2
            assert fig.data("skipped") == blocks * (blocks - 1) // 2
        else:
            assert fig.data("skipped") == 0 and fig.data("computed") == blocks * blocks
        unmasked_total = fig.data("total")
        fig.press("causal", "Space")
    fig.press("step", "End")
    assert fig.data("total") > unmasked_total       # back to no mask, which reads more
    _clean(visit)


def test_split_k_merges_to_the_exact_output(visits):
    visit = visits("split-k")
    fig = Figure(visit.page, "split-k")
    assert fig.data("states") is None and fig.data("output") is None
    fig.click(fig.button(1))
    states = fig.data("states")
    assert len(states) == fig.data("chunks") and fig.data("output") is None
    for merged in range(2, fig.data("chunks") + 1):
        fig.click(fig.button(1))
        assert fig.data("merged") == merged
        close = all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(fig.data("output"), fig.data("exact")))
        assert close == (merged == fig.data("chunks"))
    assert fig.button(1).is_disabled()
    _clean(visit)


def test_temperature_runs_from_one_hot_towards_uniform(visits):
    visit = visits("temperature")
    fig = Figure(visit.page, "temperature")
    fig.press("tau", "Home")
    assert math.isclose(fig.data("tau"), 0.1)
    assert fig.data("max-weight") > 0.9 and fig.data("entropy") < 0.5
    entropies = [fig.data("entropy")]
    for _ in range(fig.slider_positions("tau") - 1):
        fig.press("tau", "ArrowRight")
        entropies.append(fig.data("entropy"))
        assert math.isclose(sum(fig.data("weights")), 1.0, abs_tol=1e-9)
        assert math.isclose(max(fig.data("weights")), fig.data("max-weight"))
    assert math.isclose(fig.data("tau"), 10.0)
    assert entropies == sorted(entropies) and entropies[-1] > 0.95 * fig.data("log-n")
    assert fig.control("tau").get_attribute("aria-valuetext") == "τ = 10"
    assert "τ = 10" in fig.live_text()
    _clean(visit)


def test_rotary_scores_depend_on_the_offset_only(visits):
    visit = visits("rotary")
    fig = Figure(visit.page, "rotary")
    by_offset = []
    for b in range(fig.slider_positions("offset")):
        fig.press("offset", "Home")
        for _ in range(b):
            fig.press("offset", "ArrowRight")
        fig.press("position", "Home")
        scores = []
        for a in range(fig.slider_positions("position")):
            assert fig.control("position").get_attribute("aria-valuetext") == f"j = {fig.data('j')}"
            assert fig.control("offset").get_attribute("aria-valuetext") == f"Δ = {fig.data('delta')}"
            assert fig.data("i") - fig.data("j") == fig.data("delta")
            scores.append(fig.data("score"))
            assert math.isclose(sum(fig.data("contributions")), fig.data("score"), abs_tol=1e-12)
            fig.press("position", "ArrowRight")
        assert max(scores) - min(scores) < 1e-9, f"offset {fig.data('delta')}: {scores}"
        by_offset.append(scores[0])
    assert len(set(round(s, 6) for s in by_offset)) == len(by_offset)   # another offset, another score
    _clean(visit)


def test_masks_combine_with_and_and_leave_fully_masked_rows(visits):
    visit = visits("masks")
    fig = Figure(visit.page, "masks")
    names = ["causal", "left-padding", "window"]
    n = len(fig.data("keep"))
    allowed = {"causal": lambda i, j: j <= i, "window": lambda i, j: abs(i - j) <= 2}
    alone = {}
    for name in names:           # each mask on its own
        fig.press(name, "Space")
        alone[name] = fig.data("keep")
        fig.press(name, "Space")
    assert fig.data("keep") == [[1] * n for _ in range(n)] and fig.data("empty-rows") == []
    for name, rule in allowed.items():
        assert alone[name] == [[int(rule(i, j)) for j in range(n)] for i in range(n)]
    padding = alone["left-padding"]
    assert all(row == padding[0] for row in padding) and 0 < sum(padding[0]) < n
    for combo in range(1, 8):
        for b, name in enumerate(names):
            if fig.control(name).is_checked() != bool((combo >> b) & 1):
                fig.click(fig.control(name))
        keep, weights = fig.data("keep"), fig.data("weights")
        on = [alone[name] for b, name in enumerate(names) if (combo >> b) & 1]
        assert keep == [[int(all(m[i][j] for m in on)) for j in range(n)] for i in range(n)]
        empty = [i for i in range(n) if not any(keep[i])]
        assert fig.data("empty-rows") == empty
        for i in range(n):
            if i in empty:
                assert all(w is None for w in weights[i])                       # 0/0, shown as nan
            else:
                assert math.isclose(sum(weights[i]), 1.0, abs_tol=1e-5)
                assert all(w == 0 for w, k in zip(weights[i], keep[i]) if not k)
        if combo == 3:              # causal and left padding: the padding queries see nothing
            assert empty == [i for i in range(n) if not padding[0][i]]
    _clean(visit)


def test_kv_cache_grows_one_row_per_layer_and_step(visits):
    visit = visits("kv-cache")
    fig = Figure(visit.page, "kv-cache")
    sizes = [fig.data("bytes")]
    assert fig.data("rows") == 1
    for step in range(1, fig.slider_positions("step")):
        fig.click(fig.button(1))
        assert fig.data("rows") == step + 1
        assert set(fig.data("scores")) == {step + 1}
        sizes.append(fig.data("bytes"))
    growth = {b - a for a, b in zip(sizes, sizes[1:])}
    assert len(growth) == 1 and growth.pop() == sizes[0]      # the same bytes per token, every step
    _clean(visit)


@pytest.mark.parametrize("name", list(PAGES))
def test_figure_pages_are_accessible_and_small(visits, site, name):
    from axe_playwright_python.sync_playwright import Axe

    build, _ = site
    visit = visits(name)
    fig = Figure(visit.page, name)
    for control in fig.root.locator(".cf-controls [data-control], .cf-controls button").all():
        assert control.evaluate("e => e.tagName") in ("INPUT", "BUTTON")
    # The Tab key walks through the enabled controls in order.
    enabled = fig.root.locator(".cf-controls input:enabled, .cf-controls button:enabled")
    enabled.first.focus()
    for k in range(1, enabled.count()):
        visit.page.keyboard.press("Tab")
        assert enabled.nth(k).evaluate("e => e === document.activeElement"), f"{name}: Tab missed control {k}"
    last = fig.root.locator('.cf-controls input[type="range"]').last
    if last.count():
        last.focus()
        visit.page.keyboard.press("End")     # a changed state is checked too
    _clean(visit)                            # (axe's own stylesheet requests can fail; they are not the page's)
    results = Axe().run(visit.page)
    visit.page.emulate_media(color_scheme="dark")          # the theme follows the reader's system setting
    dark = Axe().run(visit.page, context=".cf-figure")
    visit.page.emulate_media(color_scheme="light")
    serious = [f"{mode}: {v['id']} ({v['impact']}): {v['help']} — {[n['target'] for n in v['nodes']][:3]}"
               for mode, run in (("light", results), ("dark", dark))
               for v in run.response["violations"] if v["impact"] in ("serious", "critical")]
    assert not serious, "\n".join(serious)
    html = build / "html" / f"{PAGES[name]}.html"
    images = sum((build / "html" / "_images" / src.split("/")[-1]).stat().st_size
                 for src in visit.page.eval_on_selector_all("main img[src*='_images/']",
                                                            "imgs => imgs.map(i => i.getAttribute('src'))"))
    weight = html.stat().st_size + images
    print(f"{PAGES[name]}: {weight / 1e6:.2f} MB (HTML {html.stat().st_size / 1e6:.2f} MB)")
    assert weight < MAX_PAGE_BYTES
