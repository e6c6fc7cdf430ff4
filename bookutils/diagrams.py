"""Static diagrams of Chapters 2 and 4, drawn with matplotlib when the page is
built. Every number a diagram shows is passed in by the page, from the cells
that compute or cite it; the diagrams only draw."""
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import FancyArrowPatch, Rectangle

BLUE, ORANGE, GREEN, RED, GREY, PURPLE = "tab:blue", "tab:orange", "tab:green", "tab:red", "0.55", "tab:purple"


def _box(ax, x, y, w, h, text="", fill="white", edge="0.2", size=10, alpha=1.0, weight=None, lw=1.2, **kw):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=fill, edgecolor=edge, alpha=alpha, lw=lw, **kw))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, weight=weight)


def _arrow(ax, start, end, colour="0.2", text="", size=9, style="-|>", lw=1.5, ls="-", offset=(0, 0.15)):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=colour, lw=lw,
                                 linestyle=ls, shrinkA=2, shrinkB=2))
    if text:
        ax.text((start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1], text, ha="center",
                va="bottom", fontsize=size, color=colour)


def _blank(ax, width, height):
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_aspect("equal")
    ax.axis("off")


# --- Chapter 4: the IO model -------------------------------------------------

def memory_hierarchy(levels, off_chip):
    """One bar per level, fastest at the top, its length the logarithm of the
    capacity `size` in bytes. `levels`: list of (name, where, size, size text,
    bandwidth text); levels from index `off_chip` on are off the GPU's die."""
    fig, ax = plt.subplots(figsize=(7.4, 3.9))
    sizes = np.array([level[2] for level in levels], dtype=float)
    lo, hi = np.log10(sizes.min()) - 1.0, np.log10(sizes.max())
    for row, (name, where, size, size_text, bandwidth) in enumerate(levels):
        y = len(levels) - 1 - row
        length = (np.log10(size) - lo) / (hi - lo)
        ax.barh(y, length, height=0.62, color=ORANGE if row < off_chip else "0.45", alpha=0.75)
        ax.text(-0.02, y + 0.12, name, ha="right", va="center", fontsize=11, weight="bold")
        ax.text(-0.02, y - 0.16, where, ha="right", va="center", fontsize=9, color="0.3")
        ax.text(length + 0.015, y + 0.1, size_text, ha="left", va="center", fontsize=10, weight="bold")
        ax.text(length + 0.015, y - 0.17, bandwidth, ha="left", va="center", fontsize=8.5, color="0.25")
    boundary = len(levels) - off_chip - 0.5
    ax.axhline(boundary, color="0.3", ls="--", lw=1)
    ax.text(1.68, boundary + 0.08, "on the GPU's die", ha="right", va="bottom", fontsize=9, color="0.3")
    ax.text(1.68, boundary - 0.08, "off the die,\nin the same package", ha="right", va="top", fontsize=9,
            color="0.3")
    ax.set_xlim(-0.55, 1.7)
    ax.set_ylim(-0.6, len(levels) - 0.4)
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title("bar length: capacity, on a logarithmic scale", fontsize=10)  # the caller says per SM or total
    fig.tight_layout()
    return fig


def roofline(points, roofs, bandwidth, ridge_label):
    """Attainable FLOP/s against arithmetic intensity. `roofs`: {name: peak
    FLOP/s}; `bandwidth`: bytes/s of the memory the traffic is charged to;
    `points`: list of (label, FLOPs, bytes moved, roof name, marker, colour,
    label offset in points)."""
    fig, ax = plt.subplots(figsize=(7.6, 4.6))
    intensities = np.logspace(-1, 4.2, 300)
    for (name, peak), style in zip(roofs.items(), ("-", "--")):
        ax.loglog(intensities, np.minimum(peak, bandwidth * intensities), "k" + style, lw=1.6,
                  label=f"roof: {name}")
        ax.annotate(f"ridge {peak / bandwidth:.0f}", (peak / bandwidth, peak), textcoords="offset points",
                    xytext=(4, -14), fontsize=8, color="0.3")
    for label, flops, moved, roof, marker, colour, offset in points:
        intensity = flops / moved
        attained = min(roofs[roof], bandwidth * intensity)
        ax.loglog(intensity, attained, marker, color=colour, ms=9)
        shown = f"{intensity:.3g}" if intensity < 100 else f"{intensity:,.0f}"
        ax.annotate(f"{label}\n{shown} FLOP/byte", (intensity, attained), textcoords="offset points",
                    xytext=offset, fontsize=8.5, color=colour)
    ax.set_xlabel("arithmetic intensity (FLOPs per byte moved to or from HBM)")
    ax.set_ylabel("attainable FLOP/s")
    ax.set_title(ridge_label, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


# --- Chapter 4: the kernel ----------------------------------------------------

def tile_dataflow(blocks=4, i=1, j=2):
    """Where the data of one program of the forward kernel lives: Q_i loaded
    once, K_j and V_j streamed, S_ij and its exponentials P~_ij only on the chip,
    O_i written once."""
    fig, ax = plt.subplots(figsize=(7.4, 3.6))
    _blank(ax, 18.4, 8.8)
    _box(ax, 0.2, 0.3, 6.0, 8.1, fill="0.95", edge="0.4")
    ax.text(3.2, 8.0, "HBM: slow, large", ha="center", fontsize=11, weight="bold")
    _box(ax, 8.6, 0.3, 9.6, 8.1, fill="#fff4e8", edge=ORANGE, lw=2)
    ax.text(13.4, 8.0, "on the chip: registers, shared memory", ha="center", fontsize=11, weight="bold")
    width = 5.2 / blocks
    rows = {"Q": (6.6, BLUE, i), "K": (4.9, ORANGE, j), "V": (3.2, ORANGE, j), "O": (0.9, GREEN, i)}
    for name, (y, colour, mine) in rows.items():
        ax.text(0.45, y + 0.5, name, ha="center", va="center", fontsize=10, weight="bold")
        for b in range(blocks):
            _box(ax, 0.7 + b * width, y, width, 1.0, f"{name}{b}", fill=colour, alpha=0.75 if b == mine else 0.15,
                 size=9, edge="0.5")
    ax.text(3.2, 2.45, "no N × N matrix\nis ever stored here", ha="center", va="center", fontsize=9, color="0.3")
    _box(ax, 9.0, 6.4, 2.6, 1.2, f"$Q_{{{i}}}$\n$B_r \\times d$", fill=BLUE, alpha=0.6, size=9)
    _box(ax, 9.0, 4.8, 2.6, 1.2, f"$K_{{{j}}}$\n$B_c \\times d$", fill=ORANGE, alpha=0.6, size=9)
    _box(ax, 9.0, 3.1, 2.6, 1.2, f"$V_{{{j}}}$\n$B_c \\times d$", fill=ORANGE, alpha=0.6, size=9)
    _box(ax, 12.6, 5.0, 5.2, 2.3, f"$S_{{{i}{j}}} = Q_{{{i}}} K_{{{j}}}^\\top / \\tau$\n$\\tilde{{P}}_{{{i}{j}}} = \\exp(S_{{{i}{j}}} - m')$\n"
         "$B_r \\times B_c$: never leaves the chip",
         fill="#f3d9f0", edge=PURPLE, size=9)
    _box(ax, 12.6, 2.4, 5.2, 1.9, "$m$, $l$ ($B_r$ numbers each)\nacc ($B_r \\times d$)\nupdated for every key block",
         fill="#e6f2e6", edge=GREEN, size=9)
    _box(ax, 9.0, 0.8, 2.6, 1.4, f"$O_{{{i}}}$ = acc / $l$\nafter the\nlast block", fill="#e6f2e6", edge=GREEN, size=8)
    _arrow(ax, (5.9, 7.1), (9.0, 7.0), BLUE, "once", size=9)
    _arrow(ax, (5.9, 5.4), (9.0, 5.4), ORANGE, "each step", size=8.5)
    _arrow(ax, (5.9, 3.7), (9.0, 3.7), ORANGE, "each step", size=8.5)
    _arrow(ax, (9.0, 1.4), (5.9, 1.4), GREEN, "once", size=9)
    _arrow(ax, (11.6, 7.0), (12.6, 6.6), "0.3")
    _arrow(ax, (11.6, 5.4), (12.6, 5.6), "0.3")
    _arrow(ax, (15.2, 5.0), (15.2, 4.3), "0.3")
    _arrow(ax, (11.6, 3.7), (12.6, 3.5), "0.3")
    _arrow(ax, (12.6, 2.6), (11.6, 1.8), "0.3")
    fig.tight_layout()
    return fig


def warp_partitioning(warps=4):
    """Inside one program: the key block cut between warps (split-K, the first
    FlashAttention) or the query block (split-Q, FlashAttention-2)."""
    fig, axes = plt.subplots(1, 2, figsize=(7.4, 3.4))
    colours = [BLUE, ORANGE, GREEN, PURPLE]
    for ax, split in zip(axes, ("K", "Q")):
        _blank(ax, 10.6, 8.6)
        # Q_i (rows) on the left, K_j^T across the top, the S tile in the middle
        _box(ax, 0.3, 0.8, 1.4, 5.2, "", fill="0.92")
        _box(ax, 2.2, 6.4, 5.2, 1.2, "", fill="0.92")
        for w in range(warps):
            colour = colours[w % len(colours)]
            if split == "Q":
                _box(ax, 0.3, 0.8 + (warps - 1 - w) * 1.3, 1.4, 1.3, f"warp {w}", fill=colour, alpha=0.45, size=7.5)
                _box(ax, 2.2, 0.8 + (warps - 1 - w) * 1.3, 5.2, 1.3, f"warp {w}'s rows of S, P, O", fill=colour,
                     alpha=0.25, size=7.5)
            else:
                _box(ax, 2.2 + w * 1.3, 6.4, 1.3, 1.2, f"warp {w}", fill=colour, alpha=0.45, size=7.5)
                _box(ax, 2.2 + w * 1.3, 0.8, 1.3, 5.2, f"cols\nof\nwarp\n{w}", fill=colour, alpha=0.25, size=8)
        ax.text(0.3 if split == "K" else 1.0, 0.45, "$Q_i$" + (": all warps" if split == "K" else ""),
                ha="left" if split == "K" else "center",
                fontsize=9.5)
        ax.text(4.8, 8.0, "$K_j^\\top$ (and $V_j$)" + (": all warps" if split == "Q" else ""), ha="center", fontsize=9.5)
        if split == "Q":
            ax.set_title("split-Q (FlashAttention-2): each warp owns\nsome query rows and sees all of $K_j$, $V_j$",
                         fontsize=10)
            _box(ax, 7.8, 0.8, 2.6, 5.2, "each warp\nfinishes\nits own\noutput rows:\nno exchange", fill="#e6f2e6",
                 edge=GREEN, size=8)
        else:
            ax.set_title("split-K (first FlashAttention): each warp owns\nsome keys; every warp needs all of $Q_i$",
                         fontsize=10)
            _box(ax, 7.8, 0.8, 2.6, 5.2, "each warp\nholds a partial\n$O$ ($B_r \\times d$):\nwritten to\nshared memory,\nsynchronised,\nadded",
                 fill="#fbe3e3", edge=RED, size=8)
    fig.tight_layout()
    return fig


def split_k_grid(chunks, heads_drawn=3):
    """The programs of one decoding step: one per head reading the whole cache
    (the forward kernel's grid), against one per (head, chunk), each writing
    its state (m, l, o), followed by a merge of the states."""
    fig, axes = plt.subplots(2, 1, figsize=(7.2, 8.6))   # one above the other, on the same scale
    for ax, split in zip(axes, (False, True)):
        _blank(ax, 12.6, 8.0)
        for h in range(heads_drawn):
            y = 5.6 - h * 2.5
            ax.text(0.1, y + 0.9, f"head {h}", fontsize=9, va="center")
            if not split:
                _box(ax, 1.4, y + 0.6, 5.6, 0.7, "one program reads the whole cache", fill=BLUE, alpha=0.35, size=8.5)
                ax.text(7.2, y + 0.95, "→ o", fontsize=10, va="center")
                continue
            width = 6.0 / chunks
            for c in range(chunks):
                x = 1.4 + c * width
                _box(ax, x, y + 1.0, width - 0.1, 0.7, f"chunk {c}", fill=BLUE, alpha=0.35, size=8)
                _box(ax, x + 0.15, y, width - 0.4, 0.55, "$m$, $l$, $o$", fill="#e6f2e6", edge=GREEN, size=7.5)
                _arrow(ax, (x + width / 2 - 0.05, y + 1.0), (x + width / 2 - 0.05, y + 0.55), "0.35", lw=1)
            _arrow(ax, (7.3, y + 0.28), (8.6, y + 0.28), GREEN, lw=1.3)
            _box(ax, 8.6, y - 0.05, 3.6, 0.65, "merge → o", fill="#e6f2e6", edge=GREEN, size=8.5)
        ax.text(0.1, 0.2, "⋮ one row like these per sequence and head", fontsize=8.5, color="0.35")
        ax.set_title(f"split-K: {chunks} programs per head write their states, a merge combines them" if split
                     else "forward kernel's grid: one program per head", fontsize=10)
    fig.tight_layout()
    return fig


def backward_ownership(blocks=4):
    """Which program keeps which gradient on the chip in the tiled backward
    pass: one pass over key blocks with atomic adds into dQ, or two passes."""
    fig = plt.figure(figsize=(7.2, 8.0))   # one pass above, the two passes side by side below
    grid = fig.add_gridspec(2, 2)
    axes = [fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])]
    titles = ["one pass, one program per key block:\n$dK_j$, $dV_j$ on the chip; $dQ$ by atomic adds",
              "two passes, pass 1: one program per key block\nkeeps $dK_j$, $dV_j$ and writes them once",
              "two passes, pass 2: one program per query block\nkeeps $dQ_i$ and writes it once"]
    for panel, (ax, title) in enumerate(zip(axes, titles)):
        _blank(ax, 8.2, 9.4)
        ax.text(4.1, 9.3, title, ha="center", va="top", fontsize=9.5)
        size = 1.2
        x0, y0 = 1.4, 1.0
        for i in range(blocks):
            ax.text(x0 - 0.2, y0 + (blocks - 1 - i) * size + size / 2, f"Q{i}", ha="right", va="center", fontsize=9)
            for j in range(blocks):
                own = (panel in (0, 1) and j == 1) or (panel == 2 and i == 1)
                _box(ax, x0 + j * size, y0 + (blocks - 1 - i) * size, size, size, fill=ORANGE if own else "0.93",
                     alpha=0.55 if own else 1, edge="white")
        for j in range(blocks):
            ax.text(x0 + j * size + size / 2, y0 + blocks * size + 0.25, f"K{j}", ha="center", fontsize=9)
        top = y0 + blocks * size
        if panel in (0, 1):
            _box(ax, x0 + 1 * size, top + 0.7, size, 0.9, "dK1\ndV1", fill=ORANGE, alpha=0.8, size=8)
            ax.text(x0 + 1.5 * size + 0.8, top + 1.15, "program 1 owns these;\nqueries stream past", fontsize=8,
                    va="center")
        if panel == 0:
            for i in range(blocks):
                y = y0 + (blocks - 1 - i) * size + size / 2
                _box(ax, 6.6, y - 0.4, 1.1, 0.8, f"dQ{i}", fill="#fbe3e3", edge=RED, size=8)
                _arrow(ax, (x0 + 2 * size, y), (6.6, y), RED, lw=1.2)
            ax.text(5.9, 0.35, "atomic adds from\nevery key block's program", ha="center", fontsize=8, color=RED)
            ax.text(7.15, y0 + blocks * size + 0.25, "in HBM", ha="center", fontsize=8, color=RED)
        if panel == 2:
            y = y0 + (blocks - 2) * size + size / 2
            _box(ax, 6.6, y - 0.4, 1.1, 0.8, "dQ1", fill=ORANGE, alpha=0.8, size=8)
            ax.text(4.0, 0.35, "program 1 owns dQ1; keys stream past;\nno two programs write the same rows",
                    ha="center", fontsize=8)
    fig.tight_layout()
    return fig


# --- Chapter 2: the key-value cache ---------------------------------------------

def prefill_and_decode(cache_rows, prompt):
    """Left: layers × tokens, the cached key and value rows, marked with the
    decoding step that wrote them when the first `prompt` tokens come in one
    prefill pass (P). The grid is read off `cache_rows`, the page's record of
    how many rows each layer's cache held after each step. Right: the scores
    one layer computes: the causal triangle of the prompt in one pass, then one
    row per decoding step."""
    cache_rows = np.asarray(cache_rows)
    steps, layers = cache_rows.shape
    # the step at which row `token` entered the cache of `layer`
    written = np.array([[int(np.argmax(cache_rows[:, layer] > token)) for token in range(steps)]
                        for layer in range(layers)])
    fig, (left, right) = plt.subplots(2, 1, figsize=(6.8, 7.4), gridspec_kw={"height_ratios": [0.7, 1.3]})
    shade = plt.get_cmap("Blues")
    for layer in range(layers):
        for token in range(steps):
            step = written[layer, token] - (prompt - 1)
            prefilled = step <= 0
            colour = PURPLE if prefilled else shade(0.3 + 0.6 * step / (steps - prompt))
            left.add_patch(Rectangle((token, layer), 1, 1, facecolor=colour, alpha=0.45 if prefilled else 1,
                                     edgecolor="white", lw=1.5))
            left.text(token + 0.5, layer + 0.5, "P" if prefilled else str(step), ha="center", va="center",
                      fontsize=8, color="white" if not prefilled and step > (steps - prompt) / 2 else "black")
    left.set_xlim(0, steps)
    left.set_ylim(layers, 0)
    left.set_xticks(np.arange(steps) + 0.5, [str(t) for t in range(steps)])
    left.set_yticks(np.arange(layers) + 0.5, [f"layer {layer}" for layer in range(layers)])
    left.set_xlabel("token position: one key row and one value row per cell")
    left.set_title(f"the caches: P = written by the prefill of {prompt} prompt tokens,\n"
                   f"1–{steps - prompt} = written by that decoding step", fontsize=10)
    for i in range(steps):
        for j in range(steps):
            if j > i:
                continue
            step = i - (prompt - 1)
            prefilled = i < prompt
            colour = PURPLE if prefilled else shade(0.3 + 0.6 * step / (steps - prompt))
            right.add_patch(Rectangle((j, i), 1, 1, facecolor=colour, alpha=0.45 if prefilled else 1,
                                      edgecolor="white", lw=0.8))
    for i in range(prompt, steps):
        right.text(steps + 0.2, i + 0.5, f"step {i - prompt + 1}", va="center", fontsize=8.5)
    right.text(prompt + 0.6, prompt / 2, "prefill:\none pass over\nthe prompt", ha="left", va="center", fontsize=8.5,
               color=PURPLE)
    right.set_xlim(0, steps + 2.2)
    right.set_ylim(steps, 0)
    right.set_aspect("equal")
    right.set_xticks([])
    right.set_yticks([])
    right.set_xlabel("key j")
    right.set_ylabel("query i")
    right.set_title("scores computed in one layer:\na triangle at once, then one row per step", fontsize=10)
    for ax in (left, right):
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
    fig.tight_layout()
    return fig
