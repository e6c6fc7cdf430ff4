"""Real text for a small model: the source code of Python's own standard library,
which ships with every Python, read character by character. The task is to name
the closing brackets: every `)`, `]` and `}` that Python's tokenizer reads as an
operator is hidden behind one mask character, and the model must say which of the
three it was. Only the matching opening bracket knows, so the task asks for
attention from each closing bracket to its partner.

windows() cuts the text into windows of equal length; the targets are the
bracket types of the hidden closers whose opener lies inside the window, and
`opener` gives that opener's position, for measuring where attention goes."""
import importlib.util
import io
import tokenize

import numpy as np
import torch

from bookutils.tiny_transformer import IGNORE

OPEN, CLOSE = "([{", ")]}"
MASK = 127                 # the character code that hides a closing bracket
OTHER = 0                  # every character outside KEPT
VOCAB = 128
KEPT = "\n" + "".join(chr(c) for c in range(32, 127))    # newline and printable ASCII keep their codes

# Modules for training and modules the model never sees, for testing.
TRAIN_MODULES = ["argparse", "inspect", "dataclasses", "functools", "collections", "ast", "statistics",
                 "difflib", "textwrap", "random"]
TEST_MODULES = ["fractions", "calendar", "pprint", "json.decoder", "string"]


def module_source(name):
    """The source text of a standard-library module, read from this Python's installation."""
    with open(importlib.util.find_spec(name).origin, encoding="utf-8") as f:
        return f.read()


def bracket_pairs(text):
    """{position of a closing bracket: position of its opening bracket}, for the brackets
    Python's tokenizer reads as operators (not those inside strings or comments)."""
    starts = np.cumsum([0] + [len(line) for line in text.splitlines(keepends=True)])
    stack, pairs = [], {}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.OP and token.string in OPEN + CLOSE:
            where = int(starts[token.start[0] - 1] + token.start[1])
            if token.string in OPEN:
                stack.append(where)
            else:
                pairs[where] = stack.pop()
    return pairs


_KEPT = frozenset(KEPT)


def encode(text):
    """(character codes with the closers masked, bracket type of each closer or -1,
    position of each closer's opener or -1), one entry per character."""
    codes = np.array([ord(c) if c in _KEPT else OTHER for c in text], dtype=np.int64)
    kind = np.full(len(text), -1)
    opener = np.full(len(text), -1)
    for close, open_ in bracket_pairs(text).items():
        kind[close], opener[close] = CLOSE.index(text[close]), open_
        codes[close] = MASK
    return codes, kind, opener


def windows(modules, length, stride):
    """Windows of `length` characters every `stride` characters of the modules' source:
    (tokens (w, length), targets (w, length, 1), opener positions (w, length)). A closer
    whose opener lies before the window has no target and no opener (IGNORE, -1)."""
    tokens, targets, openers = [], [], []
    for name in modules:
        codes, kind, opener = encode(module_source(name))
        for start in range(0, len(codes) - length + 1, stride):
            span = slice(start, start + length)
            inside = (kind[span] >= 0) & (opener[span] >= start)
            tokens.append(codes[span])
            targets.append(np.where(inside, kind[span], IGNORE))
            openers.append(np.where(inside, opener[span] - start, -1))
    return (torch.tensor(np.array(tokens)), torch.tensor(np.array(targets))[..., None],
            torch.tensor(np.array(openers)))


def nearest_opener(tokens):
    """For every position, the position of the nearest opening bracket before it (-1 if none):
    the rule that matches a closer with the last bracket opened, ignoring pairs already closed."""
    is_open = torch.zeros(VOCAB, dtype=torch.bool)
    is_open[[ord(c) for c in OPEN]] = True
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    latest = torch.cummax(torch.where(is_open[tokens], positions, -1), dim=1).values
    return torch.cat([torch.full((len(tokens), 1), -1), latest[:, :-1]], dim=1)


def show(codes):
    """The characters of a window, with each hidden closer shown as '?'."""
    return "".join("?" if c == MASK else chr(c) if c else "\ufffd" for c in codes.tolist())
