"""No graded solution copies the book: the code between the solution markers of
each solution cell shares no run of copydetect.RUN consecutive statements with
a code cell of the book, a file the book shows, or the helpers it ships
(bookutils, coursekit), once names, literals and layout are normalised."""
import pytest

from tests.conftest import REPO
from tests.copydetect import RUN, BookIndex, describe, index_of, normalised_lines, solution_sources

# Assignments whose exercises ask for what the book did not write out.
CHECKED = ["ch1_principles", "ch2_variants", "ch3_complexity", "ch4_flash"]


@pytest.fixture(scope="module")
def book():
    return index_of(REPO)


@pytest.mark.parametrize("assignment", CHECKED)
def test_no_solution_shares_a_run_of_lines_with_the_book(book, assignment):
    notebooks = sorted((REPO / "solutions" / assignment).glob("*.ipynb"))
    assert notebooks
    copies = []
    for notebook in notebooks:
        solutions = solution_sources(notebook)
        assert solutions, f"{notebook.name} has no solution code"
        for grade_id, code in solutions:
            hits = book.copies(code, where=f"{notebook.name}: {grade_id}")
            if hits:
                copies.append(describe(hits))
    assert not copies, "solutions that copy the book:\n" + "\n".join(copies)


# --- the detector itself -----------------------------------------------------

BOOK_CELL = '''
def heads_loop(x, W_Q, W_K, W_V, W_O, H):
    """Book-style loop over heads."""
    d_h = x.shape[1] // H
    Q, K, V = x @ W_Q, x @ W_K, x @ W_V
    heads = []
    for h in range(H):
        cols = slice(h * d_h, (h + 1) * d_h)
        A_h = softmax(Q[:, cols] @ K[:, cols].T / d_h**0.5, axis=-1)
        heads.append(A_h @ V[:, cols])
    return np.concatenate(heads, axis=-1) @ W_O
'''

# The same statements with other names, other constants, comments, blank lines,
# a docstring and statements spread over several physical lines.
RENAMED_AND_REFLOWED = '''
width = inputs.shape[1] // n_heads   # per-head width
queries, keys, values = (inputs @ wq,
                         inputs @ wk,
                         inputs @ wv)
"""Now the heads."""
outs = []

for head in range(n_heads):
    # this head's columns
    sl = slice(head * width,
               (head + 1) * width)
    attn = softmax(queries[:, sl] @ keys[:, sl].T / width**0.5, axis=1)
    outs.append(attn @ values[:, sl])
return np.concatenate(outs, axis=-1) @ wo
'''

# Same idea, written differently: no run of RUN statements in common.
NOT_A_COPY = '''
*lead, n, _ = x.shape
q = (x @ w_q).reshape(*lead, n, num_heads, -1).swapaxes(-2, -3)
k = (x @ w_k).reshape(*lead, n, num_heads, -1).swapaxes(-2, -3)
v = (x @ w_v).reshape(*lead, n, num_heads, -1).swapaxes(-2, -3)
heads, _ = scaled_dot_product_attention(q, k, v)
return heads.swapaxes(-2, -3).reshape(*lead, n, -1) @ w_o
'''


def test_a_renamed_and_reformatted_copy_is_found():
    index = BookIndex([("book cell", BOOK_CELL)])
    hits = index.copies(RENAMED_AND_REFLOWED)
    assert hits
    report = describe(hits)
    assert "book cell" in report and "queries, keys, values" in report


def test_a_copy_of_a_real_book_cell_is_found(book):
    """The book's multi_head_one_sequence (Chapter 1), renamed and reflowed."""
    copied = '''
width = seq.shape[1] // n_heads
queries, keys, values = seq @ wq, seq @ wk, seq @ wv
outs, maps = [], []
for head in range(n_heads):
    sl = slice(head * width, (head + 1) * width)
    attn = torch.softmax(queries[:, sl] @ keys[:, sl].T / width ** 0.5,
                         dim=-1)
    outs.append(attn @ values[:, sl])
    maps.append(attn)
return torch.cat(outs, dim=-1) @ wo, maps
'''
    assert book.copies(copied)


def test_a_different_solution_to_the_same_problem_is_not_a_copy():
    index = BookIndex([("book cell", BOOK_CELL)])
    assert index.copies(NOT_A_COPY) == []


def test_runs_shorter_than_the_threshold_do_not_count():
    index = BookIndex([("book cell", BOOK_CELL)])
    three = "width = inputs.shape[1] // n_heads\nq, k, v = inputs @ a, inputs @ b, inputs @ c\nouts = []\n"
    assert len(normalised_lines(three, "three")) == RUN - 1
    assert index.copies(three) == []


def test_docstrings_comments_and_magics_are_not_statements():
    lines = normalised_lines('"""Doc."""\n# note\n%timeit f()\n\nx = f(1, -2)  # why\n', "cell")
    assert [line.shape for line in lines] == ["_ = _ 0 , 0"]
