"""The real-text task of Chapter 2: Python's tokenizer pairs the operator brackets
(not those in strings or comments), the windows hide exactly those closers and
point at their openers, and the nearest-opener rule is what it says."""
import torch

from bookutils.brackets import (CLOSE, MASK, OPEN, TEST_MODULES, TRAIN_MODULES, bracket_pairs, encode,
                                module_source, nearest_opener, show, windows)
from bookutils.tiny_transformer import IGNORE

SNIPPET = 'f(x[i], {"a": (1, 2)})  # not a bracket: )\ns = "(]"\n'


def test_the_tokenizer_pairs_operator_brackets_only():
    pairs = bracket_pairs(SNIPPET)
    assert {SNIPPET[c] + SNIPPET[o] for c, o in pairs.items()} == {")(", "][", "}{"}
    assert len(pairs) == 4                           # the brackets in the comment and the string are text
    for close, open_ in pairs.items():
        assert OPEN.index(SNIPPET[open_]) == CLOSE.index(SNIPPET[close]) and open_ < close
    outer = SNIPPET.index("})") + 1
    assert pairs[outer] == 1                        # the last ) closes f(, around the nested pairs


def test_encoding_hides_exactly_the_paired_closers():
    codes, kind, opener = encode(SNIPPET)
    hidden = (codes == MASK).nonzero()[0].tolist()
    assert hidden == sorted(bracket_pairs(SNIPPET))
    assert show(torch.tensor(codes)).count("?") == 4 and '"(]"' in show(torch.tensor(codes))
    assert all(CLOSE[kind[i]] == SNIPPET[i] and opener[i] == bracket_pairs(SNIPPET)[i] for i in hidden)


def test_windows_target_the_closers_whose_opener_is_inside():
    tokens, targets, openers = windows(TEST_MODULES[:1], 48, 24)
    source = module_source(TEST_MODULES[0])
    for w in range(0, len(tokens), 37):
        start = 24 * w
        for i in range(48):
            t, o = int(targets[w, i, 0]), int(openers[w, i])
            if t != IGNORE:
                assert tokens[w, i] == MASK and source[start + i] == CLOSE[t]
                assert 0 <= o < i and source[start + o] == OPEN[t]
            else:
                assert o == -1
    assert (targets != IGNORE).sum() > 100


def test_the_training_and_test_modules_are_disjoint_and_readable():
    assert not set(TRAIN_MODULES) & set(TEST_MODULES)
    assert all(len(module_source(name)) > 1000 for name in TRAIN_MODULES + TEST_MODULES)


def test_nearest_opener_is_the_last_opening_bracket_before_each_position():
    codes = torch.tensor([[ord(c) for c in "a(b[c)d]"]])
    assert nearest_opener(codes).tolist() == [[-1, -1, 1, 1, 3, 3, 3, 3]]
