"""Plotting helpers: attention weights, and grids of panels that the page can show legibly."""


def weights_heatmap(ax, A, fmt=".2f"):
    """Draw an attention-weight matrix with each cell annotated; rows are
    queries, columns are keys. Returns the image for a colour bar."""
    n_q, n_k = A.shape
    im = ax.imshow(A, cmap="Blues", vmin=0, vmax=A.max())
    for r in range(n_q):
        for c in range(n_k):
            ax.text(c, r, format(A[r, c], fmt), ha="center", va="center", fontsize=8,
                    color="white" if A[r, c] > 0.6 * A.max() else "black")
    ax.set_xticks(range(n_k), [f"$k_{c}$" for c in range(n_k)])
    ax.set_yticks(range(n_q), [f"$q_{r}$" for r in range(n_q)])
    ax.set_xlabel("key $j$")
    ax.set_ylabel("query $i$")
    return im


def panel_grid(n, width, height, **kwargs):
    """(figure, 2-D array of axes) for n panels (at least one), two a row at most: the page
    shrinks a wider figure to its text column until the labels cannot be read. Places of the
    grid past the n-th are removed; each panel is width x height inches."""
    import matplotlib.pyplot as plt

    n = max(n, 1)
    cols = min(2, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, **kwargs)
    for ax in axes.flat[n:]:
        ax.remove()
    return fig, axes


def legend_below(fig, axes, ncol, room=0.45):
    """One legend for all panels, below them: each label of the axes once, its first line.
    The panels are laid out to leave `room` inches under them for it (a legend over the
    data hides it once the figure is no wider than the page's column)."""
    handles = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, room / fig.get_figheight(), 1, 1))
