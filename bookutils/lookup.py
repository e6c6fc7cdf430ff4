"""The smallest trained attention of Chapter 1: one query looks up the matching key
among n, through learned projections W_Q and W_K of width d_k, trained with Adam.
The score factor is a choice: 1/sqrt(d_k) in the forward pass, none, or none
with W_Q drawn sqrt(d_k) times smaller (the factor folded into the
initialisation). Runs in float64 on one thread, so a run is reproducible."""
import math

import torch
import torch.nn.functional as F


def lookup_batch(batch, n, d_model, noise, gen):
    """n random keys per example and a query that is a noisy copy of one of them;
    returns (queries (batch, d_model), keys (batch, n, d_model), index of the copied key)."""
    keys = torch.randn(batch, n, d_model, generator=gen, dtype=torch.float64) / math.sqrt(d_model)
    target = torch.randint(n, (batch,), generator=gen)
    blur = noise * torch.randn(batch, d_model, generator=gen, dtype=torch.float64) / math.sqrt(d_model)
    return keys[torch.arange(batch), target] + blur, keys, target


def train_lookup(scale, d_k=128, d_model=32, n=16, steps=200, lr=1e-2, seed=0, q_lr_factor=1.0, eps=1e-8,
                 noise=1.0, batch=64):
    """Train W_Q and W_K so that the query's row of attention weights puts its mass on
    the copied key (cross-entropy of the row against that key). scale is "sqrt",
    "none" or "fold"; q_lr_factor multiplies W_Q's learning rate. Returns, for every
    step, the loss, the median largest weight of a row, and the fraction of rows whose
    largest weight is on the copied key."""
    init = torch.Generator().manual_seed(seed)
    w_q = torch.randn(d_model, d_k, generator=init, dtype=torch.float64)
    w_k = torch.randn(d_model, d_k, generator=init, dtype=torch.float64)
    if scale == "fold":
        w_q = w_q / math.sqrt(d_k)
    factor = 1 / math.sqrt(d_k) if scale == "sqrt" else 1.0
    w_q.requires_grad_()
    w_k.requires_grad_()
    opt = torch.optim.Adam([{"params": [w_q], "lr": lr * q_lr_factor}, {"params": [w_k], "lr": lr}], eps=eps)
    data = torch.Generator().manual_seed(1000 + seed)
    losses, largest, right = [], [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(steps):
            query, keys, target = lookup_batch(batch, n, d_model, noise, data)
            scores = factor * ((query @ w_q)[:, None, :] * (keys @ w_k)).sum(-1)      # (batch, n)
            loss = F.cross_entropy(scores, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            weights = torch.softmax(scores.detach(), -1)
            largest.append(weights.amax(-1).median().item())
            right.append((weights.argmax(-1) == target).double().mean().item())
    finally:
        torch.set_num_threads(threads)
    return losses, largest, right
