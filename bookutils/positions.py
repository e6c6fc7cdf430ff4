"""Sinusoidal positional encodings, as introduced in Chapter 2."""
import numpy as np


def sinusoidal_table(n_positions, d_model, base=10000.0):
    """One row per position p = 0, 1, ...: column 2i holds sin(p * w_i) and
    column 2i + 1 holds cos(p * w_i), with w_i = base^(-2i / d_model).
    d_model is assumed to be even."""
    freqs = base ** (-np.arange(0, d_model, 2) / d_model)      # w_0 > w_1 > ...
    phase = np.arange(n_positions)[:, None] * freqs[None, :]   # (n_positions, d_model/2)
    table = np.zeros((n_positions, d_model))
    table[:, ::2], table[:, 1::2] = np.sin(phase), np.cos(phase)
    return table
