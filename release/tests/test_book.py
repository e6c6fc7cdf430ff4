"""The real `jupyter-book build` of the course site: warnings are errors, every
cell runs, every page of the table of contents is built, and nothing in the
built site carries the marks of a solution or a hidden test."""
import re

from tests.conftest import toc_files
from tests.answers import answer_leaks


def test_build_succeeds_without_warnings(site):
    _, log = site
    assert "build succeeded" in log
    assert not re.search(r"WARNING: (?!Location)", log), log[-4000:]


def test_every_page_in_the_toc_is_built(site):
    build, _ = site
    for page in toc_files():
        assert (build / "html" / f"{page}.html").is_file(), f"{page} was not built"


def test_every_cell_ran_without_error(site):
    build, _ = site
    for page in toc_files():
        text = (build / "html" / f"{page}.html").read_text()
        assert "Traceback (most recent call last)" not in text, f"{page} shows a traceback"
        assert 'class="output traceback' not in text and "ansi-red-fg" not in text, f"{page} shows an error"


def test_no_cell_writes_to_stderr(site):
    """What a cell writes to stderr (a warning, mostly) would be shown on the page, with the
    build machine's paths."""
    build, _ = site
    for page in toc_files():
        text = (build / "html" / f"{page}.html").read_text()
        shown = re.search(r'class="output stderr[^>]*>(.{0,300})', text, re.S)
        assert not shown, f"{page} shows what a cell wrote to stderr: {re.sub('<[^>]+>', '', shown.group(1))!r}"


def test_figures_have_alt_text(site):
    build, _ = site
    images = 0
    for page in toc_files():
        # Figures the pages draw land in _images/; the theme's icons carry their own short alt text.
        for tag in re.findall(r"<img [^>]*_images/[^>]*>", (build / "html" / f"{page}.html").read_text()):
            images += 1
            alt = re.search(r'alt="([^"]*)"', tag)
            assert alt and len(alt.group(1)) > 20, f"{page}: image without a real alt text: {tag[:120]}"
    assert images >= 5


def test_site_holds_no_solutions_or_hidden_tests(site):
    build, _ = site
    leaks = answer_leaks(build)
    assert not leaks, "\n".join(f"{p.relative_to(build)}: {what}" for p, what in leaks[:20])
