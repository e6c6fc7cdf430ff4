"""One meaning per symbol: every page's math agrees with the table of
book/notation.md, the table is on the site and linked from every chapter, and
the check finds a symbol given another meaning (planted pages below). The same
check holds the wording: a claim true only in exact arithmetic says so, a wgmma
shape says its input type, and an abbreviation is defined where it is first used."""
import json
import re

import pytest
import yaml

from tests.conftest import REPO
from tests.notation_check import (RULES, book_pages, check_page, notebook_page, notebook_text, page_of, read_page,
                                  table_symbols, unconditioned_claims, undefined_abbreviations)

BOOK = REPO / "book"
NOTATION = BOOK / "notation.md"
CHAPTERS = ["principles", "variants", "complexity", "flash"]


def site_pages():
    """Every page of the site: the book's and the exercise notebooks as students receive them."""
    yield from (read_page(path, str(path.relative_to(REPO))) for path in book_pages(BOOK))
    yield from (notebook_page(path, str(path.relative_to(REPO)))
                for path in sorted((REPO / "exercises").glob("*/*.ipynb")))


def toc_files():
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    return [toc["root"]] + [entry["file"] for part in toc["parts"] for chapter in part["chapters"]
                            for entry in [chapter] + chapter.get("sections", [])]


def site_texts():
    """(name, text) of every page of the site in reading order (the table of contents'), then
    the book's other pages (the results' READMEs)."""
    paths = [next(p for p in (REPO / f"{file}.md", REPO / f"{file}.ipynb") if p.exists()) for file in toc_files()]
    paths += [p for p in book_pages(BOOK) if p not in paths]
    for path in paths:
        text = notebook_text(path) if path.suffix == ".ipynb" else path.read_text(encoding="utf-8")
        yield str(path.relative_to(REPO)), text


def test_no_page_gives_a_symbol_another_meaning():
    findings = [f for page in site_pages() for f in check_page(page)]
    assert not findings, "symbols used with another meaning than book/notation.md gives them:\n" + "\n".join(
        str(f) for f in findings)


def test_no_page_states_a_claim_without_its_condition():
    findings = [f for name, text in site_texts() for f in unconditioned_claims(text, name)]
    assert not findings, "claims without the condition they hold under:\n" + "\n".join(str(f) for f in findings)


def test_every_abbreviation_is_defined_where_it_is_first_used():
    findings = undefined_abbreviations(list(site_texts()))
    assert not findings, "\n".join(str(f) for f in findings)


def test_the_table_defines_every_checked_symbol():
    defined = table_symbols(NOTATION.read_text(encoding="utf-8"))
    missing = [rule.latex for rule in RULES.values()
               if not any(re.fullmatch(re.escape(rule.latex) + r"(_i|_\{ij\})?(\s*=.*|,.*)?", s.strip())
                          for s in defined)]
    assert not missing, f"checked symbols missing from the notation table: {missing}"


def test_the_notation_page_is_on_the_site_and_every_chapter_links_to_it():
    assert "book/notation" in toc_files()
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
    "an index m": ("Then $p$ is nearly one-hot, $p \\approx e_m$, with its one at the largest score.", "m"),
    "an index m, in words": ("so $p$ tends to the one-hot vector on key $m$.", "m"),
    "an index m of a range": ("Query $i$ sees the keys $j = i + m\\rho$ with $|m| \\le r$.", "m"),
    "a recurrent cell": ("The encoder reads the tokens, $h_t = \\phi(h_{t-1}, x_t)$.", "\\phi"),
    "a recurrent cell, in words": ("The RNN cell $\\phi$ updates the hidden state.", "\\phi"),
    "a dilation": ("A dilated convolution with dilation $\\delta$ skips the inputs between.", "\\delta"),
    "a gap": ("Two scores a small gap $\\delta$ apart give a norm of order $1/\\delta$.", "\\delta"),
    "an error": ("An error $\\delta$ in a score multiplies $e^{s_j}$ by $e^{\\delta}$.", "\\delta"),
    "a number of chunks": ("Split the keys of a row into $C$ chunks and merge their states.", "C"),
    "a number of chunks, written out": ("The grid has one program per chunk, and the number of chunks $C$ grows.", "C"),
    "a chunk axis": ("The states $m$ and $l$ have shape $(C, ...)$, one row per chunk.", "C"),
    "a head width in a shape": ("The queries have shape $(n_\\text{batch}, H, N, D)$.", "D"),
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
    "The Jacobian is $p_i(\\delta_{ij} - p_j)$, and $dS_{ik} = \\sum_j dP_{ij}\\, P_{ij} (\\delta_{jk} - P_{ik})$.",
    "Then $p \\approx e_{j^*}$, the one-hot vector of the largest score $s_{j^*}$, and $|a| \\le r$.",
    "The running maximum $m = \\max_j s_j$; the states $(m_c, l_c, o_c)$ merge with weights $l_c e^{m_c - m}$.",
    "Linear attention has $\\phi(x) = \\operatorname{elu}(x) + 1$, so $\\phi = \\operatorname{elu} + 1$; an RNN has "
    "$h_t = f(h_{t-1}, x_t)$.",
    "Chunks of $C$ positions give $\\lceil N/C \\rceil$ programs, and the chunk length $C$ is a power of two.",
    "The tensors have shape $(n_\\text{batch}, H, N, d)$, and $(n_c, ..., d_v)$ for the chunks' outputs.",
]


@pytest.mark.parametrize("text", ALLOWED)
def test_the_meanings_of_the_table_pass(text):
    assert not check_page(page_of(text, "allowed.md")), [str(f) for f in check_page(page_of(text, "allowed.md"))]


def test_code_is_not_math():
    text = "```{code-cell} ipython3\nprint(f'${B} = {D}$')\n```\nThe call `f($B$, $M$)` returns."
    assert not page_of(text).formulas


def test_an_exercise_s_shapes_are_read_as_formulas(tmp_path):
    def notebook(text):
        path = tmp_path / "exercise.ipynb"
        path.write_text(json.dumps({"cells": [{"cell_type": "markdown", "source": [text]},
                                              {"cell_type": "code", "source": ["x = (B, H, N, D)"]}]}))
        return notebook_page(path, "exercise.ipynb")

    old = ("`q` of shape `(B, H, N, D)`, where `B` counts the sequences; `m` and `l` have shape `(C, ...)`, "
           "where the code's `C` is the number of chunks.")
    assert {f.symbol for f in check_page(notebook(old))} >= {"B", "C", "D"}
    new = "`q` of shape `(n_batch, H, N, d)`; `m` and `l` have shape `(n_c, ...)`, `o` has shape `(n_c, ..., d_v)`."
    assert not check_page(notebook(new)), [str(f) for f in check_page(notebook(new))]


CLAIMS_PLANTED = {
    "positive weights": "Every entry is an exponential divided by a positive sum, so $A_{ij} > 0$ for every pair.",
    "strictly positive": "But a softmax of finite scores gives every key strictly\npositive weight. The check:",
    "a general wgmma shape": "Every `wgmma.mma_async` computes 64 rows (the `m64` of its shape, `m64nNk16`).",
    "the paper's r": "Local attention of radius $r$ (the paper writes $k$ for the kernel width and\n$r$ for the "
                     "neighbourhood):",
}
CLAIMS_ALLOWED = [
    "so $A_{ij} > 0$\nin exact arithmetic (in floating point a score far below its row's maximum underflows to $0$).",
    "gives every key strictly positive weight (in exact arithmetic; in floating point a weight can underflow).",
    "(the `m64` of its shape, `m64nNk16` for 16-bit inputs; the depth `k` is 8 for TF32 and 32 for 8-bit inputs)",
    "(the paper writes $k$ for the kernel width, and its $r$ is the size of the neighbourhood, $2r + 1$ keys)",
    "Dividing scores by a positive number, $\\tau > 0$, keeps their order.",
]


@pytest.mark.parametrize("case", CLAIMS_PLANTED, ids=str)
def test_a_claim_without_its_condition_is_found(case):
    assert unconditioned_claims(CLAIMS_PLANTED[case], "planted.md"), case


@pytest.mark.parametrize("text", CLAIMS_ALLOWED)
def test_a_claim_with_its_condition_passes(text):
    assert not unconditioned_claims(text, "allowed.md"), [str(f) for f in unconditioned_claims(text, "allowed.md")]


def test_an_abbreviation_used_before_its_definition_is_found():
    defined = "A *CTA*, a cooperative thread array, is CUDA's name for a thread block."
    later = ("compiler.md", "A program of a Triton kernel is a thread block of CUDA, a CTA.")
    assert undefined_abbreviations([("first.md", "There, `warpsPerCTA = [1, 4]` lays the warps out.\n\n" + defined),
                                    later]) == []
    assert [f.page for f in undefined_abbreviations([later, ("kernel.md", defined)])] == ["compiler.md"]
    code = "```{code-cell} ipython3\nprint('one CTA')\n```\n"
    assert undefined_abbreviations([("kernel.md", code + defined)]) == []
