"""Every figure of the book has alt text and a caption: a code cell whose metadata
declares a figure must also give its image an `alt`, so that a reader who cannot
see the plot gets what it shows. Captions and alt texts hold no control
characters: in a double-quoted YAML string `\text` is a TAB and `ext`."""
import re

import pytest
import yaml

from tests.conftest import REPO

CELL = re.compile(r"^```\{code-cell\}[^\n]*\n---\n(.*?)\n---\n", re.S | re.M)


def figures(text):
    """The metadata of every code cell that declares a figure."""
    found = []
    for match in CELL.finditer(text):
        meta = yaml.safe_load(match.group(1)) or {}
        if "figure" in meta.get("mystnb", {}):
            found.append(meta["mystnb"])
    return found


PAGES = sorted(p for p in (REPO / "book").rglob("*.md") if "_build" not in p.parts)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_figure_has_alt_text_and_a_caption(page):
    for meta in figures(page.read_text(encoding="utf-8")):
        name = meta["figure"].get("name", "a figure")
        assert meta["figure"].get("caption"), f"{name} in {page.name} has no caption"
        assert (meta.get("image") or {}).get("alt"), f"{name} in {page.name} has no alt text"


def _texts(meta):
    return [meta["figure"].get("caption") or "", (meta.get("image") or {}).get("alt") or ""]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_captions_and_alt_texts_hold_no_control_characters(page):
    for meta in figures(page.read_text(encoding="utf-8")):
        for text in _texts(meta):
            bad = sorted({repr(c) for c in text if ord(c) < 32})
            assert not bad, f"{meta['figure'].get('name')} in {page.name}: {bad} (write \\\\ in double quotes)"


def test_a_tab_from_an_escape_is_found():
    text = '```{code-cell} ipython3\n---\nmystnb:\n  figure:\n    caption: "$n_\\text{batch}$"\n---\nplt.show()\n```\n'
    [meta] = figures(text)
    assert "\t" in _texts(meta)[0]


def test_a_figure_without_alt_text_is_found():
    text = "```{code-cell} ipython3\n---\nmystnb:\n  figure:\n    caption: \"A plot.\"\n    name: fig-x\n---\nplt.show()\n```\n"
    [meta] = figures(text)
    assert not (meta.get("image") or {}).get("alt")
