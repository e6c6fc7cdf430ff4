"""One meaning per symbol: every page's math agrees with the table of
book/notation.md, the table is on the site and linked from every chapter, and
the check finds a symbol given another meaning (planted pages below)."""
import re

import pytest
import yaml

from tests.conftest import REPO
from tests.notation_check import RULES, book_pages, check_page, notebook_page, page_of, read_page, table_symbols

BOOK = REPO / "book"
NOTATION = BOOK / "notation.md"
CHAPTERS = ["principles", "variants", "complexity", "flash"]


def site_pages():
    """Every page of the site: the book's and the exercise notebooks as students receive them."""
    yield from (read_page(path, str(path.relative_to(REPO))) for path in book_pages(BOOK))
    yield from (notebook_page(path, str(path.relative_to(REPO)))
                for path in sorted((REPO / "exercises").glob("*/*.ipynb")))


def test_no_page_gives_a_symbol_another_meaning():
    findings = [f for page in site_pages() for f in check_page(page)]
    assert not findings, "symbols used with another meaning than book/notation.md gives them:\n" + "\n".join(
        str(f) for f in findings)


def test_the_table_defines_every_checked_symbol():
    defined = table_symbols(NOTATION.read_text(encoding="utf-8"))
    missing = [rule.latex for rule in RULES.values()
               if not any(re.fullmatch(re.escape(rule.latex) + r"(_i)?(\s*=.*|,.*)?", s.strip()) for s in defined)]
    assert not missing, f"checked symbols missing from the notation table: {missing}"


def test_the_notation_page_is_on_the_site_and_every_chapter_links_to_it():
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    files = [toc["root"]] + [entry["file"] for part in toc["parts"] for chapter in part["chapters"]
                             for entry in [chapter] + chapter.get("sections", [])]
    assert "book/notation" in files
    for chapter in CHAPTERS:
        index = (BOOK / chapter / "index.md").read_text(encoding="utf-8")
        assert "{doc}`../notation`" in index, f"book/{chapter}/index.md does not link to the notation page"


# --- the check itself: each way of giving a symbol another meaning is found ------------

PLANTED = {
    "a batch": ("The grid has $B \\cdot H$ programs for a batch of $B$ sequences.", "B"),
    "a batch, written out": ("Here $B$ is the batch size and $H$ the number of heads.", "B"),
    "a tensor's shape": ("A contiguous $(B, H, N, d)$ tensor has strides $(HNd, Nd, d)$.", "B"),
    "a multiplying scale": ("For one head, with scale $\\tau$, $S = \\tau\\, QK^\\top$.", "\\tau"),
    "a gradient's scale": ("The last product gives $dQ = \\tau\\, dS\\, K$.", "\\tau"),
    "a head dimension": ("Each product costs $2N^2D$ FLOPs per head, with $D = 64$.", "D"),
    "a log-sum-exp": ("The forward pass stores the log-sum-exp $L_i = m_i + \\log l_i$.", "L"),
    "a cache length": ("Each step reads a cache of $L$ positions... no: the cache $L$ grows.", "L"),
    "a mask": ("Add the mask, $A = \\operatorname{softmax}(S + M)$, with $M_{ij} = -\\infty$ for $j > i$.", "M"),
    "a mask, in words": ("The additive mask $M$ holds zeros and minus infinities.", "M"),
    "a number of heads": ("The layer has $n$ heads of width $d$.", "n"),
    "a model width": ("A layer of model width $d$ and $H$ heads.", "d"),
    "a permutation": ("Let $P$ be an $n \\times n$ permutation matrix.", "P"),
    "a block size": ("With equal blocks, $N = TB$ for $T$ blocks.", "N"),
}


@pytest.mark.parametrize("case", PLANTED, ids=str)
def test_a_planted_second_meaning_is_found(case):
    text, symbol = PLANTED[case]
    findings = check_page(page_of(text, "planted.md"))
    assert any(f.symbol == symbol for f in findings), (case, [str(f) for f in findings])


ALLOWED = [
    "A sequence of $n$ tokens of width $d$, with $H$ heads of width $d_h = d_\\text{model}/H$.",
    "The weights are $\\operatorname{softmax}(s/\\tau)$, and $1/\\sqrt{d_k}$ is $\\tau = \\sqrt{d_k}$.",
    "With $D_i = dO_i \\cdot O_i$, $dS = P \\circ (dP - D)$ and $dQ = dS\\,K/\\tau$.",
    "A budget of $B = 2^{30}$ bytes, and $N_B = \\lfloor B/b \\rfloor$ numbers; tiles of $B_r$ by $B_c$.",
    "A fast memory of $M = 2^{16}$ numbers, so $B_r = \\Theta(M/d)$.",
    "Two tokens $L$ apart, and the log-sum-exp $\\operatorname{LSE}_i$ of row $i$.",
    "Let $\\Pi$ be a permutation matrix; $P_{ij} = e^{S_{ij} - \\operatorname{LSE}_i}$ is one weight.",
    "The additive mask $\\mathit{mask}$ is added: $\\operatorname{softmax}(S + \\mathit{mask})$.",
    "A batch of $n_\\text{batch}$ sequences gives $n_\\text{batch} H$ programs.",
]


@pytest.mark.parametrize("text", ALLOWED)
def test_the_meanings_of_the_table_pass(text):
    assert not check_page(page_of(text, "allowed.md")), [str(f) for f in check_page(page_of(text, "allowed.md"))]


def test_code_is_not_math():
    text = "```{code-cell} ipython3\nprint(f'${B} = {D}$')\n```\nThe call `f($B$, $M$)` returns."
    assert not page_of(text).formulas
