"""A character-level language model's data: the source code of Python's own
standard library (the modules of bookutils.brackets, read by its module_source),
as a sequence of character indices, and random windows of it whose targets are
the next character at every position.

The alphabet is that of bookutils.brackets without its mask: newline, the 95
printable ASCII characters, and one symbol for every other character (a tab, a
letter with an accent), which stands first."""
import numpy as np
import torch

from bookutils.brackets import KEPT, module_source

OTHER = "\ufffd"                                               # shown for every character outside the alphabet
ALPHABET = OTHER + KEPT
_INDEX = {c: i for i, c in enumerate(ALPHABET)}


def encode(text):
    """The index in ALPHABET of every character of text (0 for a character outside it)."""
    return torch.tensor([_INDEX.get(c, 0) for c in text], dtype=torch.int64)


def decode(indices):
    return "".join(ALPHABET[i] for i in indices.tolist())


def corpus(modules):
    """The modules' source, one after the other with a blank line between them, encoded."""
    return encode("\n\n".join(module_source(name) for name in modules))


def next_character_windows(data, n):
    """sample(batch, gen) for bookutils.tiny_transformer.train: windows of n characters of
    data at random offsets, as tokens (batch, n) and targets (batch, n, 1), the character
    after each position."""
    def sample(batch, gen):
        start = torch.randint(len(data) - n, (batch,), generator=gen)
        rows = start[:, None] + torch.arange(n + 1)
        window = data[rows]
        return window[:, :-1], window[:, 1:, None]
    return sample


def consecutive_windows(data, n):
    """The whole of data cut into consecutive windows of n characters (the end that does
    not fill a window dropped): tokens (w, n) and next characters (w, n, 1)."""
    w = (len(data) - 1) // n
    return data[:w * n].view(w, n), data[1:w * n + 1].view(w, n, 1)


def bits(log_probs):
    """The mean of -log2 p over the targets, from natural logarithms: bits per character."""
    return float(-log_probs.mean() / np.log(2))
