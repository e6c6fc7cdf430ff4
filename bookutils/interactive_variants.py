"""The interactive figures of Chapter 2, each built from the code and the
arrays of its page: the temperature of the softmax, rotary positions, masks,
and the key-value cache. See stepper.py for how a figure reaches the site."""
import numpy as np

from bookutils.attention import softmax_row
from bookutils.stepper import Frame, Slider, Steps, Toggle, stepper
from bookutils.svg import BLUE, GREY, MUTED, ORANGE, RED, Canvas, blues, diverging, ink_on


def _vec(values, digits=3):
    return "[" + ", ".join(f"{v:.{digits}f}" for v in values) + "]"


# --- temperature ---------------------------------------------------------------

def temperature_figure(scores, taus, weights_at, entropy_of, caption):
    """A slider over the temperatures `taus`: the weights weights_at(tau) of one
    row of scores, their entropy entropy_of(weights) and the largest weight."""
    scores = np.asarray(scores, dtype=float)
    n = len(scores)
    frames = []
    for t, tau in enumerate(taus):
        raw = weights_at(tau)
        h = float(entropy_of(raw))
        w = np.asarray(raw, dtype=float)
        frames.append(_temperature_frame(scores, w, h, tau, t))
    labels = [f"τ = {tau:.3g}" for tau in taus]
    return stepper("temperature", "Softmax temperature",
                   [Slider("tau", "Temperature τ", labels, start=int(np.argmin(np.abs(np.log(taus)))))],
                   frames, caption)


def _temperature_frame(scores, w, h, tau, t):
    n = len(scores)
    c = Canvas(680, 300)
    left, width = 40, 440
    bar = width / n
    reach = np.abs(scores).max() * 1.1
    c.text(left, 12, "scores s_j (fixed)", anchor="start", weight="bold")
    c.line(left, 70, left + width, 70, stroke=MUTED)
    for j, s in enumerate(scores):
        top = 70 - s / reach * 45
        c.rect(left + j * bar + 3, min(top, 70), bar - 6, abs(top - 70), fill=GREY)
    c.text(left, 132, f"weights softmax(s/τ) at τ = {tau:.3g}", anchor="start", weight="bold")
    top_j = int(np.argmax(w))
    for j, p in enumerate(w):
        height = p * 140
        c.rect(left + j * bar + 3, 290 - height, bar - 6, height, fill=ORANGE if j == top_j else BLUE)
    c.line(left, 290, left + width, 290, stroke=MUTED)
    c.line(left, 290 - 140 / n, left + width, 290 - 140 / n, stroke=MUTED, dash="4,3")
    c.text(left + width + 4, 290 - 140 / n, "1/n", anchor="start", size=11, colour=MUTED)
    c.line(left, 150, left + width, 150, stroke=MUTED, dash="1,3")
    c.text(left + width + 4, 150, "1", anchor="start", size=11, colour=MUTED)

    px, gauge = 530, 130
    h_max = np.log(n)
    c.text(px, 12, "entropy H (nats)", anchor="start", weight="bold")
    c.rect(px, 26, gauge, 16, fill="#eeeeee", stroke=GREY)
    c.rect(px, 26, gauge * h / h_max, 16, fill=BLUE)
    c.text(px, 54, f"H = {h:.3f} of ln {n} = {h_max:.3f}", anchor="start", size=11)
    c.text(px, 72, f"e^H = {np.exp(h):.2f} effective keys", anchor="start", size=11)
    c.text(px, 106, "largest weight", anchor="start", weight="bold")
    c.rect(px, 120, gauge, 16, fill="#eeeeee", stroke=GREY)
    c.rect(px, 120, gauge * w.max(), 16, fill=ORANGE)
    c.text(px, 148, f"max p = {w.max():.3f} (key {top_j})", anchor="start", size=11)

    text = (f"At τ = {tau:.3g} the weights have entropy {h:.3f} nats (at most ln {n} = {h_max:.3f}), "
            f"about {np.exp(h):.1f} effective keys, and the largest weight is {w.max():.3f}, on key {top_j}.")
    data = {"tau": float(tau), "entropy": h, "max-weight": float(w.max()), "weights": [float(p) for p in w],
            "log-n": float(h_max)}
    return Frame((t,), c.markup(f"Softmax weights at temperature {tau:.3g}, described below"), text, data)


# --- rotary positions ----------------------------------------------------------

def rotary_figure(q, k, rope, positions, offsets, caption):
    """Two sliders, the key position j and the offset Δ = i − j: the coordinate
    pairs of q rotated to position i and of k rotated to position j by the
    page's `rope`, and their dot product, which depends on Δ only."""
    pairs = len(q) // 2
    frames = []
    for a, j in enumerate(positions):
        for b, delta in enumerate(offsets):
            i = j + delta
            q_rot = rope(q[None], np.array([i]))[0]
            k_rot = rope(k[None], np.array([j]))[0]
            frames.append(_rotary_frame(q, k, q_rot, k_rot, i, j, delta, (a, b), pairs))
    return stepper("rotary", "Rotary positions",
                   [Slider("position", "Key position j", [f"j = {j}" for j in positions]),
                    Slider("offset", "Offset Δ = i − j", [f"Δ = {d}" for d in offsets])], frames, caption)


def _rotary_frame(q, k, q_rot, k_rot, i, j, delta, key, pairs):
    c = Canvas(680, 250)
    radius = 58
    reach = max(np.hypot(q[0::2], q[1::2]).max(), np.hypot(k[0::2], k[1::2]).max())
    score = float(q_rot @ k_rot)
    contributions = []
    for l in range(pairs):
        cx, cy = 85 + l * 170, 100
        c.circle(cx, cy, radius, stroke=GREY)
        c.line(cx - radius, cy, cx + radius, cy, stroke="#e0e0e0")
        c.line(cx, cy - radius, cx, cy + radius, stroke="#e0e0e0")
        for vec, colour in ((q_rot, BLUE), (k_rot, ORANGE)):
            x, y = vec[2 * l] / reach * radius, vec[2 * l + 1] / reach * radius
            c.line(cx, cy, cx + x, cy - y, stroke=colour, width=2.5, arrow=True)
        part = float(q_rot[2 * l] * k_rot[2 * l] + q_rot[2 * l + 1] * k_rot[2 * l + 1])
        contributions.append(part)
        c.text(cx, 14, f"pair {l}: coordinates {2 * l}, {2 * l + 1}", size=11, weight="bold")
        c.text(cx, 176, f"turns {10000 ** (-2 * l / len(q)):.3g} rad per position", size=11, colour=MUTED)
        c.text(cx, 194, f"contribution {part:+.3f}", size=11)
    c.line(20, 222, 34, 222, stroke=BLUE, width=2.5)
    c.text(40, 222, f"q at position i = {i}", anchor="start", size=11)
    c.line(170, 222, 184, 222, stroke=ORANGE, width=2.5)
    c.text(190, 222, f"k at position j = {j}", anchor="start", size=11)
    c.text(330, 222, f"score q_i·k_j = {score:+.4f}  (offset Δ = {delta})", anchor="start", weight="bold")
    text = (f"Query at position {i}, key at position {j}, offset {delta}: each pair of q is turned by {i} times its "
            f"frequency and each pair of k by {j} times it; the pairs contribute "
            + ", ".join(f"{p:+.3f}" for p in contributions) + f", a score of {score:+.4f}.")
    data = {"score": score, "i": int(i), "j": int(j), "delta": int(delta), "contributions": contributions}
    return Frame(key, c.markup(f"Rotary pairs of q at position {i} and k at position {j}, described below"), text, data)


# --- masks ----------------------------------------------------------------------

def masks_figure(Q, K, V, masked_attention, masks, caption):
    """One check box per mask in `masks` (name: (label, boolean keep array that
    broadcasts to n x n)); the frame for each combination shows the combined
    mask (a logical and; none selected means every pair takes part) and the
    weights that masked_attention(Q, K, V, keep) returns, nan rows included."""
    n = Q.shape[0]
    names = list(masks)
    frames = []
    for combo in range(2 ** len(names)):
        on = [(combo >> b) & 1 for b in range(len(names))]
        keep = np.ones((n, n), dtype=bool)
        for name, flag in zip(names, on):
            if flag:
                keep = keep & np.broadcast_to(masks[name][1], (n, n))
        with np.errstate(invalid="ignore"):
            _, weights = masked_attention(Q, K, V, keep)
        labels = [masks[name][0] for name, flag in zip(names, on) if flag]
        frames.append(_mask_frame(keep, weights, labels, tuple(on)))
    return stepper("masks", "Masks", [Toggle(name, masks[name][0]) for name in names], frames, caption)


def _mask_frame(keep, weights, labels, key):
    n = keep.shape[0]
    c = Canvas(680, 350)
    cell = 40
    empty = [i for i in range(n) if not keep[i].any()]
    for panel, (x0, title) in enumerate(((40, "mask: may query i see key j?"), (340, "weights"))):
        c.text(x0, 12, title, anchor="start", weight="bold")
        for j in range(n):
            c.text(x0 + j * cell + cell / 2, 32, f"k{j}", size=11, colour=MUTED)
        for i in range(n):
            c.text(x0 - 14, 50 + i * cell + cell / 2, f"q{i}", size=11, colour=MUTED)
            for j in range(n):
                x, y = x0 + j * cell, 50 + i * cell
                if panel == 0:
                    fill = "#3b3b3b" if keep[i, j] else "#ffffff"
                    c.rect(x, y, cell, cell, fill=fill, stroke=GREY)
                    continue
                w = weights[i, j]
                if np.isnan(w):
                    c.rect(x, y, cell, cell, fill="#fbe3e3", stroke=GREY)
                    c.text(x + cell / 2, y + cell / 2, "nan", size=11, colour=RED)
                else:
                    fill = blues(w)
                    c.rect(x, y, cell, cell, fill=fill, stroke=GREY)
                    c.text(x + cell / 2, y + cell / 2, f"{w:.2f}", size=11, colour=ink_on(fill))
    for i in empty:
        c.text(340 + n * cell + 6, 50 + i * cell + cell / 2, "no key", anchor="start", size=11, colour=RED,
               weight="bold")
    active = " and ".join(labels) if labels else "no mask"
    c.text(40, 50 + n * cell + 18, f"in force: {active}", anchor="start", size=11)
    c.text(40, 50 + n * cell + 36, "dark: the pair takes part; nan: a row with no visible key (0/0)",
           anchor="start", size=11, colour=MUTED)
    visible = keep.sum(axis=1)
    text = (f"Masks in force: {active}. Visible keys per query: "
            + ", ".join(f"q{i}: {int(v)}" for i, v in enumerate(visible)) + ". "
            + (f"Rows with no visible key, whose weights are 0/0 = nan: "
               + ", ".join(f"q{i}" for i in empty) + "." if empty else "Every query sees at least one key."))
    data = {"keep": keep.astype(int).tolist(),
            "weights": [[None if np.isnan(w) else round(float(w), 6) for w in row] for row in weights],
            "empty-rows": empty}
    return Frame(key, c.markup(f"Mask and weights with {active}, described below"), text, data)


# --- the key-value cache --------------------------------------------------------

def kv_cache_figure(X, layers, caches, Y, caption):
    """Step through generation token by token with the caches the page filled:
    at step t every layer appends the key and value rows of token t and computes
    t + 1 scores for its query, and nothing else. The scores are recomputed
    here from the cached rows, and each step's output checked against Y, the
    page's incremental result."""
    d = X.shape[1]
    n = len(X)
    n_layers = len(layers)
    K = [np.array(k_rows) for k_rows, _ in caches]
    V = [np.array(v_rows) for _, v_rows in caches]
    frames = []
    for t in range(n):
        h = X[t]
        step_scores = []
        for (Wq, Wk, Wv), K_l, V_l in zip(layers, K, V):
            assert np.allclose(h @ Wk, K_l[t]) and np.allclose(h @ Wv, V_l[t])   # the row this step appended
            s = (h @ Wq) @ K_l[:t + 1].T / np.sqrt(d)
            step_scores.append(s)
            h = h + softmax_row(s) @ V_l[:t + 1]
        assert np.allclose(h, Y[t])
        cache_bytes = sum(K_l[:t + 1].nbytes + V_l[:t + 1].nbytes for K_l, V_l in zip(K, V))
        frames.append(_kv_frame(t, n, n_layers, d, step_scores, cache_bytes, K[0].itemsize))
    labels = [f"token {t} enters" for t in range(n)]
    return stepper("kv-cache", "Key-value cache", [Steps("step", labels)], frames, caption)


def _kv_frame(t, n, n_layers, d, step_scores, cache_bytes, itemsize):
    c = Canvas(680, 110 + 92 * n_layers)
    cell = 36
    x0 = 150
    top = max(np.abs(s).max() for s in step_scores)
    for j in range(n):
        c.text(x0 + j * cell + cell / 2, 14, f"{j}", size=11, colour=MUTED)
    c.text(x0 - 8, 14, "token", anchor="end", size=11, colour=MUTED)
    for layer, scores in enumerate(step_scores):
        y = 30 + 92 * layer
        c.text(10, y + 10, f"layer {layer}", anchor="start", weight="bold")
        for row, name in enumerate((f"q{t}·k_j/√d", "keys k_j", "values v_j")):
            c.text(x0 - 8, y + 10 + 24 * row, name, anchor="end", size=11)
            for j in range(n):
                x = x0 + j * cell
                if row == 0:
                    if j <= t:
                        fill = diverging(scores[j], top)       # the sign shows: red negative, blue positive
                        c.rect(x + 1, y + 24 * row, cell - 2, 20, fill=fill)
                        c.text(x + cell / 2, y + 10, f"{scores[j]:.1f}", size=10, colour=ink_on(fill))
                    continue
                if j < t:
                    c.rect(x + 1, y + 24 * row, cell - 2, 20, fill="#bcd7ec")
                elif j == t:
                    c.rect(x + 1, y + 24 * row, cell - 2, 20, fill=ORANGE)
                else:
                    c.rect(x + 1, y + 24 * row, cell - 2, 20, fill="#ffffff", stroke=GREY, dash="2,2")
    y = 30 + 92 * n_layers
    c.rect(x0, y, 12, 12, fill=ORANGE)
    c.text(x0 + 18, y + 6, "appended this step", anchor="start", size=11)
    c.rect(x0 + 150, y, 12, 12, fill="#bcd7ec")
    c.text(x0 + 168, y + 6, "cached earlier, read again", anchor="start", size=11)
    c.text(x0 + 340, y + 6, "scores: red < 0 < blue", anchor="start", size=11)
    c.text(x0, y + 32, f"cache size: {n_layers} layers × 2 × {t + 1} rows × {d} numbers × {itemsize} bytes = "
           f"{cache_bytes:,} bytes", anchor="start", weight="bold")
    c.text(x0, y + 52, f"scores computed this step: {t + 1} per layer; outputs of tokens 0–{t - 1} are not "
           f"recomputed" if t else "scores computed this step: 1 per layer", anchor="start", size=11)
    text = (f"Step {t}: token {t} enters. Each of the {n_layers} layers appends one key row and one value row "
            f"(its cache now holds {t + 1} of each) and computes {t + 1} score{'s' if t else ''} for the new query; "
            f"the cache holds {cache_bytes:,} bytes.")
    data = {"step": t, "rows": t + 1, "scores": [len(s) for s in step_scores], "bytes": int(cache_bytes)}
    return Frame((t,), c.markup(f"Key-value caches at step {t}, described below"), text, data)
