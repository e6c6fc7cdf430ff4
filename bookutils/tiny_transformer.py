"""A tiny Transformer encoder and three synthetic tasks, small enough to train on
a CPU in seconds while the book builds. Everything is seeded and training runs
on one thread, so rebuilding a page on the same machine shows the same numbers.

The attention layer exposes the choices the book compares: the factor applied
to the scores (1/sqrt(d_k), none, 1/d_k, none with the factor folded into
W_Q's initialisation, or queries and keys normalised first), post-norm or
pre-norm, a causal mask, how positions enter (a learned or a sinusoidal table
added to the embeddings, rotary embeddings of the queries and keys, ALiBi's
linear biases of the scores, or none) and optional dropout. Each layer keeps
its last attention weights for plotting."""
from contextlib import contextmanager

import torch
from torch import nn
import torch.nn.functional as F

from bookutils.positions import sinusoidal_table

IGNORE = -100   # target value that the loss skips (F.cross_entropy's ignore_index)
ROPE_BASE = 10000.0


# ---- positions inside attention: rotary embeddings and ALiBi

def rope_frequencies(d_head, base=ROPE_BASE):
    """The angular frequency w_l = base^(-2l / d_head) of each coordinate pair (2l, 2l+1)."""
    return base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)


def ntk_base(factor, d_head, base=ROPE_BASE):
    """The base of "NTK-aware" scaling for a context `factor` times longer:
    base * factor^(d_head / (d_head - 2)), which leaves w_0 as it is and divides
    the lowest frequency, that of the last pair, by exactly `factor`."""
    return base * factor ** (d_head / (d_head - 2))


def rope_angles(n, d_head, stretch=1.0, base=ROPE_BASE):
    """The angle (t / stretch) * w_l of every position t < n and pair l: (n, d_head/2).
    stretch > 1 is position interpolation; a larger base is frequency scaling."""
    t = torch.arange(n, dtype=torch.float64) / stretch
    return t[:, None] * rope_frequencies(d_head, base)[None, :]


def rotate_pairs(x, angles):
    """Rotate the coordinate pairs (2l, 2l+1) of x (..., n, d) by angles (n, d/2), as
    the rope function of the positional-encoding page does."""
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    even, odd = x[..., ::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def alibi_slopes(n_heads):
    """ALiBi's slope of each head: the geometric sequence 2^(-8/H), 2^(-16/H), ..., 2^(-8)
    for H heads, H a power of two."""
    if n_heads & (n_heads - 1):
        raise ValueError("ALiBi's slopes are defined here for a power of two heads")
    return 2.0 ** (-8.0 * torch.arange(1, n_heads + 1, dtype=torch.float64) / n_heads)


class SelfAttention(nn.Module):
    """Multi-head self-attention with a configurable score scale.

    scale: "sqrt" divides the scores by sqrt(d_head), "none" leaves them raw,
    "linear" divides by d_head (the muP choice), "fold" leaves them raw but
    draws W_Q with a standard deviation sqrt(d_head) times smaller, so that the
    initial scores equal those of "sqrt" (the T5 choice), and "qknorm" scales
    each query and key to unit length and multiplies their dot product by a
    learned factor that starts at sqrt(d_head), so that no score can exceed
    that factor in size. causal=True lets query i see keys j <= i only.

    positions="rope" rotates each query and key pair (2l, 2l+1) by the angle
    (t / rope_stretch) * w_l at its position t, with w_l computed from
    rope_base; both attributes may be changed after training (position
    interpolation divides the positions, NTK-aware scaling raises the base).
    positions="alibi" adds -slope * (i - j) to the scores of keys j <= i, one slope
    per head; it requires causal=True, since Press et al. define the bias for a
    causal model only (a symmetric |i - j| would be a choice of this code's)."""

    def __init__(self, d_model, n_heads, d_head, scale="sqrt", causal=False, positions=None):
        super().__init__()
        if positions == "alibi" and not causal:
            raise ValueError("ALiBi is defined for a causal model: pass causal=True")
        self.n_heads, self.d_head, self.causal, self.qk_norm = n_heads, d_head, causal, scale == "qknorm"
        self.positions, self.rope_base, self.rope_stretch = positions, ROPE_BASE, 1.0
        self.factor = {"sqrt": d_head ** -0.5, "none": 1.0, "linear": 1.0 / d_head, "fold": 1.0,
                       "qknorm": 1.0}[scale]
        self.gain = nn.Parameter(torch.tensor(float(d_head) ** 0.5)) if self.qk_norm else None
        self.q = nn.Linear(d_model, n_heads * d_head, bias=False)
        self.k = nn.Linear(d_model, n_heads * d_head, bias=False)
        self.v = nn.Linear(d_model, n_heads * d_head, bias=False)
        self.out = nn.Linear(n_heads * d_head, d_model)
        # Unit-variance inputs give unit-variance query and key components,
        # the setting in which Var(q . k) = d_k.
        q_std = d_model ** -0.5 * (d_head ** -0.5 if scale == "fold" else 1.0)
        nn.init.normal_(self.q.weight, std=q_std)
        nn.init.normal_(self.k.weight, std=d_model ** -0.5)
        self.weights = None

    def forward(self, x):
        b, n, _ = x.shape
        split = lambda t: t.view(b, n, self.n_heads, self.d_head).transpose(1, 2)  # (b, h, n, d_head)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        if self.qk_norm:
            q, k = self.gain * F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        if self.positions == "rope":
            angles = rope_angles(n, self.d_head, self.rope_stretch, self.rope_base)     # (n, d_head/2)
            q, k = rotate_pairs(q, angles), rotate_pairs(k, angles)
        scores = self.factor * q @ k.transpose(-1, -2)                              # (b, h, n, n)
        if self.positions == "alibi":
            t = torch.arange(n)
            distance = t[:, None] - t[None, :]       # i - j; the causal mask below removes j > i
            scores = scores - (alibi_slopes(self.n_heads)[:, None, None] * distance).to(scores.dtype)
        if self.causal:
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        self.scores = scores.detach()
        w = torch.softmax(scores, dim=-1)
        self.weights = w.detach()
        return self.out((w @ v).transpose(1, 2).reshape(b, n, -1))


class Block(nn.Module):
    """Attention and a ReLU feed-forward network in residual connections, with
    LayerNorm after each addition (post-norm) or before each sublayer (pre-norm).
    With dropout > 0, each sublayer's output is dropped out before it is added to
    the residual stream (in training mode only, as nn.Dropout does); with the
    default 0 nothing is added to the computation."""

    def __init__(self, d_model, n_heads, d_head, d_ff, pre_norm, scale, causal=False, dropout=0.0, positions=None):
        super().__init__()
        self.pre_norm = pre_norm
        self.attn = SelfAttention(d_model, n_heads, d_head, scale, causal, positions)
        self.ffn = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()

    def forward(self, x):
        if self.pre_norm:
            x = x + self.drop(self.attn(self.ln1(x)))
            return x + self.drop(self.ffn(self.ln2(x)))
        x = self.ln1(x + self.drop(self.attn(x)))
        return self.ln2(x + self.drop(self.ffn(x)))


class TinyTransformer(nn.Module):
    """Token embedding (plus a learned position table when max_len is given),
    a stack of blocks, and a linear read-out of n_targets classifications with
    n_classes classes each, for every token. forward returns logits of shape
    (batch, tokens, n_targets, n_classes) and, with hidden=True, also the final
    token representations. dropout > 0 drops out the sum of the embeddings and
    every sublayer's output before its residual addition (Vaswani et al.'s
    placement), in training mode only: model.eval() turns it off.

    positions chooses how order enters: None, a learned table when max_len is
    given and nothing otherwise; "sinusoidal", the fixed table of
    bookutils.positions added to the embeddings, for any length; "rope" and
    "alibi", inside every attention layer (SelfAttention says how)."""

    def __init__(self, vocab, n_classes, n_targets=1, d_model=64, n_heads=2, n_layers=1, d_ff=128,
                 max_len=None, pre_norm=True, d_head=None, scale="sqrt", causal=False, dropout=0.0,
                 positions=None):
        super().__init__()
        if positions not in (None, "sinusoidal", "rope", "alibi") or (positions and max_len):
            raise ValueError("positions is None (with or without max_len), 'sinusoidal', 'rope' or 'alibi'")
        self.n_targets, self.n_classes, self.positions = n_targets, n_classes, positions
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model) if max_len else None
        inside = positions if positions in ("rope", "alibi") else None
        self.blocks = nn.ModuleList(Block(d_model, n_heads, d_head or d_model // n_heads, d_ff,
                                          pre_norm, scale, causal, dropout, inside) for _ in range(n_layers))
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()
        # A pre-norm stack leaves its residual stream unnormalised; normalise it once at the end.
        self.final_ln = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self.readout = nn.Linear(d_model, n_targets * n_classes)

    def forward(self, tokens, hidden=False):
        x = self.embed(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1]))
        elif self.positions == "sinusoidal":
            x = x + torch.from_numpy(sinusoidal_table(tokens.shape[1], x.shape[-1])).to(x.dtype)
        x = self.drop(x)
        for block in self.blocks:
            x = block(x)
        h = self.final_ln(x)
        logits = self.readout(h).view(*tokens.shape, self.n_targets, self.n_classes)
        return (logits, h) if hidden else logits

    def scale_rope(self, stretch=1.0, base=ROPE_BASE):
        """Set every layer's rotary positions: t / stretch, frequencies from base.
        Raises ValueError on a model without rotary embeddings, where it would change nothing."""
        if self.positions != "rope":
            raise ValueError(f"scale_rope changes rotary embeddings; this model has positions={self.positions!r}")
        for block in self.blocks:
            block.attn.rope_stretch, block.attn.rope_base = stretch, base

    def attention_weights(self):
        """Weights of the last forward pass, one (batch, heads, n, n) tensor per layer."""
        return [block.attn.weights for block in self.blocks]


# ---- tasks: each sample(batch, gen) returns tokens (batch, n) and targets (batch, n, n_targets)

def mirror_and_previous(batch, gen, n=10, digits=10):
    """Random digits; every token must output the digit at its mirror position
    n-1-i and the digit just before it (none for the first token)."""
    x = torch.randint(digits, (batch, n), generator=gen)
    previous = torch.cat([torch.full((batch, 1), IGNORE), x[:, :-1]], dim=1)
    return x, torch.stack([x.flip(1), previous], dim=-1)


def odd_one_out(batch, gen, n=8, groups=4, per_group=4):
    """A set of n tokens: n-1 drawn from one group of the vocabulary (token t is
    in group t // per_group) and one from another group. Each token outputs 1 if
    it is the odd one out, else 0. Nothing depends on order."""
    main = torch.randint(groups, (batch, 1), generator=gen)
    other = (main + 1 + torch.randint(groups - 1, (batch, 1), generator=gen)) % groups
    group = main.expand(batch, n).clone()
    odd = torch.randint(n, (batch,), generator=gen)
    group[torch.arange(batch), odd] = other[:, 0]
    x = group * per_group + torch.randint(per_group, (batch, n), generator=gen)
    return x, (group != main).long()[..., None]


# Vocabulary of the word-sense task: filler words, two context markers and one ambiguous word.
N_FILLER = 12
RIVER, MONEY, BANK = N_FILLER, N_FILLER + 1, N_FILLER + 2
SENSE_VOCAB = N_FILLER + 3


def word_sense(batch, gen, n=10, context=None):
    """Filler words, one marker (RIVER or MONEY) and one ambiguous word BANK at
    random distinct positions. BANK must output its sense: 0 next to RIVER, 1
    next to MONEY; other tokens have no target. context (0 or 1) fixes the
    marker for every sequence; by default it is random."""
    x = torch.randint(N_FILLER, (batch, n), generator=gen)
    sense = (torch.randint(2, (batch,), generator=gen) if context is None
             else torch.full((batch,), context))
    places = torch.rand(batch, n, generator=gen).argsort(dim=1)[:, :2]  # two distinct positions
    rows = torch.arange(batch)
    x[rows, places[:, 0]] = RIVER + sense
    x[rows, places[:, 1]] = BANK
    y = torch.full((batch, n), IGNORE)
    y[rows, places[:, 1]] = sense
    return x, y[..., None]


# ---- training

@contextmanager
def single_thread():
    """Run on one thread: one summation order, hence the same losses on every run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def task_loss(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=IGNORE)


def train(model, sample, steps, lr=1e-3, batch=64, warmup=0, seed=0, q_lr_factor=1.0, after_step=None,
          schedule=None):
    """Adam on fresh batches from sample(batch, generator); the learning rate
    rises linearly over the first `warmup` steps, then stays at lr (times
    q_lr_factor for the query projections). schedule(step), if given, replaces
    that rule: the learning rate of step `step` (from 0) is lr * schedule(step).
    after_step(step, model), if given, runs after every step, for example to
    record weights. Returns the training loss of every step (NaN once it has
    diverged)."""
    gen = torch.Generator().manual_seed(seed)
    queries = [p for name, p in model.named_parameters() if name.endswith("attn.q.weight")]
    rest = [p for name, p in model.named_parameters() if not name.endswith("attn.q.weight")]
    opt = torch.optim.Adam([{"params": queries, "factor": q_lr_factor}, {"params": rest, "factor": 1.0}],
                           lr=lr, betas=(0.9, 0.98))
    losses = []
    with single_thread():
        for step in range(steps):
            for group in opt.param_groups:
                factor = (schedule(step) if schedule is not None
                          else min(1.0, (step + 1) / warmup) if warmup else 1.0)
                group["lr"] = group["factor"] * lr * factor
            x, y = sample(batch, gen)
            loss = task_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if after_step is not None:
                after_step(step, model)
    return losses


@torch.no_grad()
def accuracy(model, sample, batch=1000, seed=12345):
    """Fraction of targets predicted correctly, per target (a tensor of n_targets)."""
    x, y = sample(batch, torch.Generator().manual_seed(seed))
    with single_thread():
        pred = model(x).argmax(-1)
    keep = y != IGNORE
    return ((pred == y) & keep).sum((0, 1)) / keep.sum((0, 1))
