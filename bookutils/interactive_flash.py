"""The interactive figures of Chapter 4, each built from the code of its page:
the online softmax (absorb_block), the tiles of the tiled loop
(blockwise_attention's visit), and split-K decoding (the page's chunk_state
and merge_two). See stepper.py for how a figure reaches the site."""
import math

import numpy as np

from bookutils.attention import softmax_row
from bookutils.online import absorb_block
from bookutils.stepper import Frame, Steps, Toggle, stepper, table
from bookutils.svg import BLUE, GREEN, GREY, INK, MUTED, ORANGE, ORANGE_TEXT, RED, Canvas, ink_on


def _vec(values, digits=3):
    return "[" + ", ".join(f"{v:.{digits}f}" for v in values) + "]"


def _num(value, digits=3):
    return "−∞" if value == -np.inf else f"{value:.{digits}f}"


# --- the online softmax ------------------------------------------------------

def online_softmax_states(x, v, block):
    """Every state of one row's pass, from absorb_block: before the first block,
    then for each block the state it meets (with the new maximum and alpha
    already known) and the state it leaves."""
    states = [dict(phase="start", block=-1, m=-np.inf, l=0.0, alpha=None, acc=np.zeros(v.shape[1]),
                   m_new=None)]
    m, l, acc = -np.inf, 0.0, np.zeros(v.shape[1])
    for b, start in enumerate(range(0, len(x), block)):
        m_new, l_new, alpha, e = absorb_block(m, l, x[start:start + block])
        states.append(dict(phase="before", block=b, m=m, l=l, alpha=alpha, acc=acc.copy(), m_new=m_new))
        acc = alpha * acc + e @ v[start:start + block]
        m, l = m_new, l_new
        states.append(dict(phase="after", block=b, m=m, l=l, alpha=alpha, acc=acc.copy(), m_new=m_new))
    return states


def _online_frame(x, v, block, state, exact_w, exact_o, step):
    n, b = len(x), state["block"]
    seen = 0 if b < 0 else min(n, (b + 1) * block) if state["phase"] == "after" else b * block
    m, l = state["m"], state["l"]
    weights = [float(np.exp(x[j] - m) / l) if j < seen and l > 0 else 0.0 for j in range(n)]
    output = state["acc"] / l if l > 0 else np.zeros(v.shape[1])
    complete = state["phase"] == "after" and seen == n
    equal = complete and np.allclose(output, exact_o, rtol=0, atol=1e-12)

    c = Canvas(680, 330)
    left, width = 40, 430
    bar = width / n
    lo, hi = min(0.0, x.min()) - 0.3, x.max() + 0.6

    def y_score(s):
        return 145 - (s - lo) / (hi - lo) * 115

    c.text(left, 12, f"scores s_j of one row, read {block} at a time", anchor="start", weight="bold")
    c.line(left, y_score(0), left + width, y_score(0), stroke=MUTED)
    for j in range(n):
        current = b >= 0 and b * block <= j < (b + 1) * block
        fill = ORANGE if current else BLUE if j < seen else GREY
        top, bottom = sorted((y_score(x[j]), y_score(0)))
        c.rect(left + j * bar + 3, top, bar - 6, bottom - top, fill=fill)
    for edge in range(block, n, block):
        c.line(left + edge * bar, 24, left + edge * bar, 150, stroke=MUTED, dash="2,3")
        c.line(left + edge * bar, 180, left + edge * bar, 300, stroke=MUTED, dash="2,3")
    if m > -np.inf:
        c.line(left, y_score(m), left + seen * bar, y_score(m), stroke=RED, width=2, dash="6,3")
        c.text(left - 4, y_score(m), "m", anchor="end", colour=RED, weight="bold")
    if state["phase"] == "before" and state["m_new"] > m:
        end = left + min(n, (b + 1) * block) * bar
        c.line(left, y_score(state["m_new"]), end, y_score(state["m_new"]), stroke=ORANGE, width=2, dash="2,2")
        c.text(end + 3, y_score(state["m_new"]), "m′", anchor="start", colour=ORANGE_TEXT, weight="bold")

    c.text(left, 170, "weights e^(s_j − m)/l so far (bars); exact softmax (ticks)", anchor="start", weight="bold")
    top_w = max(exact_w.max(), max(weights)) * 1.1

    def y_weight(w):
        return 300 - w / top_w * 110

    c.line(left, y_weight(0), left + width, y_weight(0), stroke=MUTED)
    for j in range(n):
        if weights[j] > 0:
            c.rect(left + j * bar + 5, y_weight(weights[j]), bar - 10, y_weight(0) - y_weight(weights[j]), fill=BLUE)
        c.line(left + j * bar + 2, y_weight(exact_w[j]), left + (j + 1) * bar - 2, y_weight(exact_w[j]),
               stroke=INK, width=2)
    c.text(left + width / 2, 318, "key j", colour=MUTED, size=11)

    px = 500
    c.text(px, 12, "acc/l (bars), exact (ticks)", anchor="start", weight="bold", size=11)
    reach = max(np.abs(exact_o).max(), np.abs(output).max(), 1e-9) * 1.15
    mid, half = 95, 70

    def y_out(value):
        return mid - value / reach * half

    c.line(px, mid, px + 165, mid, stroke=MUTED)
    for t in range(len(exact_o)):
        x0 = px + 10 + t * 52
        if l > 0:
            top, bottom = sorted((y_out(output[t]), mid))
            c.rect(x0 + 6, top, 30, bottom - top, fill=GREEN if equal else BLUE)
        c.line(x0, y_out(exact_o[t]), x0 + 42, y_out(exact_o[t]), stroke=INK, width=2)
        c.text(x0 + 21, 178, f"o{t}", size=11, colour=MUTED)
    rows = [("m", _num(m)), ("l", _num(l, 4)),
            ("m′", "" if state["m_new"] is None else _num(state["m_new"])),
            ("α", "" if state["alpha"] is None else f"{state['alpha']:.4f}")]
    for k, (name, value) in enumerate(rows):
        if value:
            c.text(px, 205 + 20 * k, f"{name} = {value}", anchor="start")
    if complete:
        c.text(px, 300, "output = exact softmax" if equal else "output ≠ exact softmax", anchor="start",
               colour=GREEN if equal else RED, weight="bold")

    if state["phase"] == "start":
        what = "Nothing read yet: m = −∞, l = 0, acc = 0."
    elif state["phase"] == "before":
        grew = state["m_new"] > m
        what = (f"Block {b} arrives (scores {b * block} to {min(n, (b + 1) * block) - 1}). "
                + (f"Its largest score raises the maximum from {_num(m)} to m′ = {_num(state['m_new'])}, so l and "
                   f"acc, measured from the old maximum, are about to be multiplied by α = e^(m − m′) = "
                   f"{state['alpha']:.4f}." if grew else
                   f"Its largest score does not raise the maximum {_num(m)}: α = 1, nothing is rescaled."))
    else:
        what = (f"After block {b}: l ← α·l + Σ e^(s_j − m′) = {_num(l, 4)} and acc ← α·acc + e·V; "
                f"{seen} of {n} scores read.")
    so_far = _vec(output) if l > 0 else "undefined (l = 0: nothing summed yet)"
    text = (f"{what} Output so far acc/l = {so_far}; exact softmax(s)·V = {_vec(exact_o)}"
            + ((": equal, the pass is complete." if equal else ": NOT equal, the update is wrong.") if complete else "."))
    data = {"m": None if m == -np.inf else m, "l": l, "output": [float(o) for o in output],
            "exact": [float(o) for o in exact_o], "weights": weights, "exact-weights": [float(w) for w in exact_w],
            "seen": seen, "complete": int(complete), "equal": int(equal)}
    values = [["m", _num(m, 4)], ["l", _num(l, 4)],
              ["α", "" if state["alpha"] is None else f"{state['alpha']:.4f}"],
              ["output acc/l", so_far], ["exact softmax(s)·V", _vec(exact_o)]]
    return Frame((step,), c.markup(f"Online softmax, step {step}, described below"), text, data,
                 table(["quantity", "value"], values))


def online_softmax_figure(x, v, block, caption):
    """Step through the blocks of one row x with values v: m, l and the output
    before and after each rescaling, ending at softmax_row(x) @ v."""
    x, v = np.asarray(x, dtype=float), np.asarray(v, dtype=float)
    exact_w = softmax_row(x)
    exact_o = exact_w @ v
    states = online_softmax_states(x, v, block)
    labels = ["start"] + [f"block {s['block']}, {'before' if s['phase'] == 'before' else 'after'} its update"
                          for s in states[1:]]
    frames = [_online_frame(x, v, block, s, exact_w, exact_o, i) for i, s in enumerate(states)]
    return stepper("online-softmax", "Online softmax", [Steps("step", labels)], frames, caption)


# --- the tiles of the tiled loop ---------------------------------------------

def tile_walk(visited, n, d, block_q, block_k):
    """The grid walked in the order of blockwise_attention's loops, one event
    per (query block, key block) position: whether the tile is computed, and
    the elements moved to and from slow memory so far, counted as the IO model
    of the io_model page counts them (Q_i read once per program, K_j and V_j
    once per computed tile, O_i written once)."""
    rows, cols = math.ceil(n / block_q), math.ceil(n / block_k)
    done = set(visited)
    last = {i: max(j for (qi, j) in visited if qi == i) for i in range(rows)}
    moved = dict(Q=0, K=0, V=0, O=0)
    events = []
    for i in range(rows):
        height = min(block_q, n - i * block_q)
        for j in range(cols):
            width = min(block_k, n - j * block_k)
            event = dict(i=i, j=j, computed=(i, j) in done, loads=[], writes=[])
            if event["computed"]:
                if j == 0:
                    moved["Q"] += height * d
                    event["loads"].append(f"Q_{i}")
                moved["K"] += width * d
                moved["V"] += width * d
                event["loads"] += [f"K_{j}", f"V_{j}"]
                if j == last[i]:
                    moved["O"] += height * d
                    event["writes"].append(f"O_{i}")
            event.update(moved=dict(moved))
            events.append(event)
    return events


def _tile_frame(events, upto, n, d, block_q, block_k, causal, step, model_total):
    rows, cols = math.ceil(n / block_q), math.ceil(n / block_k)
    current = events[upto - 1] if upto > 0 else None
    moved = current["moved"] if current else dict(Q=0, K=0, V=0, O=0)
    total = sum(moved.values())
    seen = {(e["i"], e["j"]): e for e in events[:upto]}

    c = Canvas(680, 350)
    cell, gx, gy = 42, 50, 62
    c.text(10, 12, "rows: query blocks Q_i (one program each)", anchor="start", weight="bold", size=11)
    c.text(10, 28, "columns: key and value blocks K_j, V_j", anchor="start", weight="bold", size=11)
    for j in range(cols):
        on = current is not None and current["computed"] and current["j"] == j
        c.rect(gx + j * cell + 2, 40, cell - 4, 18, fill=ORANGE if on else "#e8e8e8", rx=3)
        c.text(gx + j * cell + cell / 2, 49, f"K{j} V{j}", size=10, colour=ink_on(ORANGE) if on else INK)
    for i in range(rows):
        on = current is not None and current["i"] == i and current["computed"]
        c.rect(gx - 36, gy + i * cell + 2, 32, cell - 4, fill=ORANGE if on else "#e8e8e8", rx=3)
        c.text(gx - 20, gy + i * cell + cell / 2, f"Q{i}", size=10, colour=ink_on(ORANGE) if on else INK)
    for i in range(rows):
        for j in range(cols):
            x, y = gx + j * cell, gy + i * cell
            e = seen.get((i, j))
            diagonal = causal and (j + 1) * block_k - 1 > i * block_q and j * block_k < (i + 1) * block_q
            if e is None:
                c.rect(x, y, cell, cell, fill="#ffffff", stroke=GREY)
            elif not e["computed"]:
                c.rect(x, y, cell, cell, fill="#eeeeee", stroke=GREY)
                c.line(x + 9, y + 9, x + cell - 9, y + cell - 9, stroke="#8a8a8a")
                c.line(x + 9, y + cell - 9, x + cell - 9, y + 9, stroke="#8a8a8a")
            else:
                c.rect(x, y, cell, cell, fill="#f6c9a8" if diagonal else "#bcd7ec", stroke="#ffffff")
            if e is current and current is not None:
                c.rect(x + 1.5, y + 1.5, cell - 3, cell - 3, stroke=INK, width=3)
    ly = gy + rows * cell + 12
    legend = [("#bcd7ec", "computed"), ("#f6c9a8", "computed, partly masked"), ("#eeeeee", "skipped, never loaded")]
    for k, (fill, words) in enumerate(legend if causal else legend[:1]):
        c.rect(gx, ly + 18 * k, 13, 13, fill=fill, stroke=GREY)
        c.text(gx + 19, ly + 18 * k + 6.5, words, anchor="start", size=11)
    c.rect(gx + 170, ly, 13, 13, stroke=INK, width=3)
    c.text(gx + 189, ly + 6.5, "this step", anchor="start", size=11)

    px = 330
    c.text(px, 12, "on the chip now", anchor="start", weight="bold")
    if current is not None and current["computed"]:
        i, j = current["i"], current["j"]
        on_chip = [f"Q{i} ({block_q}×{d}), m, l, acc of program {i}", f"K{j}, V{j} (2 × {block_k}×{d})",
                   f"tile S({i},{j}) = Q{i}·K{j}ᵀ ({block_q}×{block_k}): never written out"]
    elif current is not None:
        on_chip = [f"nothing: program {current['i']} stopped before key block {current['j']}",
                   "(every key in it comes after every query of the block)"]
    else:
        on_chip = ["nothing: the grid has not started"]
    for k, line in enumerate(on_chip):
        c.text(px, 34 + 18 * k, line, anchor="start", size=11)
    c.text(px, 120, "moved to or from slow memory so far (elements)", anchor="start", weight="bold")
    scale = 270 / max(model_total, 1)
    for k, name in enumerate(["Q", "K", "V", "O"]):
        y = 140 + 24 * k
        c.text(px, y + 8, f"{name} {'written' if name == 'O' else 'read'}", anchor="start", size=11)
        c.rect(px + 62, y, moved[name] * scale, 16, fill=BLUE if name != "O" else GREEN)
        c.text(px + 66 + moved[name] * scale, y + 8, f"{moved[name]:,}", anchor="start", size=11)
    c.text(px, 250, f"total {total:,}", anchor="start", weight="bold")
    finished = upto == len(events)
    if finished:
        c.text(px, 272, f"IO model: {model_total:,}", anchor="start", colour=GREEN, weight="bold")

    if current is None:
        what = "Before the launch: nothing has been read."
    elif current["computed"]:
        what = (f"Program {current['i']}, key block {current['j']}: loads "
                + ", ".join(current["loads"])
                + (f", writes {', '.join(current['writes'])}" if current["writes"] else "")
                + f"; the tile S({current['i']},{current['j']}) stays on the chip.")
    else:
        what = f"Tile ({current['i']}, {current['j']}) is above the diagonal: skipped, nothing loaded."
    text = (f"{what} Moved so far: Q {moved['Q']:,}, K {moved['K']:,}, V {moved['V']:,} read, "
            f"O {moved['O']:,} written; total {total:,} elements"
            + (f", equal to the IO model's count {model_total:,}." if finished else "."))
    data = {"moved": moved, "total": total, "model": model_total, "finished": int(finished),
            "computed": sum(1 for e in events[:upto] if e["computed"]),
            "skipped": sum(1 for e in events[:upto] if not e["computed"]),
            "tile": [current["i"], current["j"]] if current else None}
    return Frame((int(causal), step), c.markup(f"Tiles, {'causal' if causal else 'no mask'}, step {step}, described below"),
                 text, data)


def tile_walk_figure(tiled_attention, n, d, block_q, block_k, caption, seed=0):
    """Step through the grid of (query block, key block) tiles in the order of
    `tiled_attention`'s loops (blockwise_attention, whose visit callback
    reports every tile it computes), with and without the causal mask, counting
    the elements moved as the IO model does. The unmasked total is checked
    against the model's 2Nd + 2Nd⌈N/B_r⌉ and the causal one against the same
    count over the tiles actually visited."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((n, d)) for _ in range(3))
    rows, cols = math.ceil(n / block_q), math.ceil(n / block_k)
    labels = ["before the launch"] + [f"query block {i}, key block {j}" for i in range(rows) for j in range(cols)]
    frames = []
    for causal in (False, True):
        visited = []
        tiled_attention(q, k, v, block_q, block_k, causal=causal, visit=lambda i, j: visited.append((i, j)))
        events = tile_walk(visited, n, d, block_q, block_k)
        if causal:
            model_total = 2 * n * d + 2 * d * sum(min(block_k, n - j * block_k) for _, j in visited)
        else:
            model_total = 2 * n * d + 2 * n * d * math.ceil(n / block_q)     # the io_model page's count
        assert sum(events[-1]["moved"].values()) == model_total
        frames += [_tile_frame(events, s, n, d, block_q, block_k, causal, s, model_total)
                   for s in range(len(events) + 1)]
    return stepper("tile-walk", "Tiles of the tiled loop", [Toggle("causal", "causal mask"), Steps("step", labels)],
                   frames, caption)


# --- split-K decoding ---------------------------------------------------------

def _chunks(first, last):
    """'chunk 0' or 'chunks 0–2'."""
    return f"chunk {first}" if first == last else f"chunks {first}–{last}"


def split_k_figure(q, k, v, chunk, chunk_state, merge_two, caption):
    """One decoding query against a cache cut into chunks: the scores, every
    chunk's state (m_c, l_c, o_c) computed side by side with the page's
    chunk_state, then the states folded in with its merge_two, ending at the
    exact output."""
    s = k @ q / np.sqrt(q.shape[0])
    exact = softmax_row(s) @ v
    starts = list(range(0, len(s), chunk))
    states = [chunk_state(s[a:a + chunk], v[a:a + chunk]) for a in starts]
    merged = [states[0]]
    for state in states[1:]:
        merged.append(merge_two(merged[-1], state))
    labels = (["the cache, cut into chunks", "every chunk's state, side by side"]
              + [f"merge chunk {c} into {_chunks(0, c - 1)}" for c in range(1, len(states))])
    frames = [_split_k_frame(s, v, chunk, states, merged, exact, step) for step in range(len(labels))]
    return stepper("split-k", "Split-K decoding", [Steps("step", labels)], frames, caption)


def _bars(c, values, x, mid, half, reach, fill, exact=None, width=14, gap=20):
    """Small signed bars for the entries of a vector, with ticks at `exact`."""
    c.line(x, mid, x + gap * len(values) + 2, mid, stroke=MUTED)
    for t, value in enumerate(values):
        if value is not None:
            top = mid - value / reach * half
            c.rect(x + 3 + t * gap, min(top, mid), width, abs(top - mid), fill=fill)
        if exact is not None:
            tick = mid - exact[t] / reach * half
            c.line(x + t * gap, tick, x + t * gap + width + 6, tick, stroke=INK, width=2)


def _split_k_frame(s, v, chunk, states, merged, exact, step):
    n, chunks = len(s), len(states)
    palette = [BLUE, ORANGE, GREEN, "#7b3294", RED, "#4d4d4d"]
    text_palette = [ORANGE_TEXT if colour == ORANGE else colour for colour in palette]   # 4.5:1 on white
    c = Canvas(680, 400)
    left, width = 50, 600
    bar = width / n
    lo, hi = min(0.0, s.min()) - 0.3, s.max() + 0.5
    merged_upto = step - 1 if step >= 2 else -1       # chunks 0..merged_upto are folded together
    reach = 1.15 * max(np.abs(exact).max(), max(np.abs(o).max() for _, _, o in states))

    def y_score(x):
        return 135 - (x - lo) / (hi - lo) * 105

    c.text(left, 12, "scores s_j = k_j·q/√d of one query against the cache, by chunk; dashed: each chunk's maximum",
           anchor="start", weight="bold", size=11)
    c.line(left, y_score(0), left + width, y_score(0), stroke=MUTED)
    for j in range(n):
        top, bottom = sorted((y_score(s[j]), y_score(0)))
        c.rect(left + j * bar + 2, top, bar - 4, bottom - top, fill=palette[(j // chunk) % len(palette)])
    for a in range(chunk, n, chunk):
        c.line(left + a * bar, 24, left + a * bar, 300, stroke=MUTED, dash="2,3")
    if step >= 1:
        for ci, (m, _, _) in enumerate(states):
            a = ci * chunk
            c.line(left + a * bar, y_score(m), left + min(n, a + chunk) * bar, y_score(m), stroke=INK, dash="5,3")
    if merged_upto >= 1:
        end = left + min(n, (merged_upto + 1) * chunk) * bar
        c.line(left + 2, 150, end - 2, 150, stroke=INK, width=2)
        c.line(left + 2, 145, left + 2, 150, stroke=INK, width=2)
        c.line(end - 2, 145, end - 2, 150, stroke=INK, width=2)
        c.text((left + end) / 2, 162, f"merged: {_chunks(0, merged_upto)}", size=11, weight="bold")
    for ci, (m, l, o) in enumerate(states):
        x = left + ci * chunk * bar + 6
        c.text(x, 182, f"chunk {ci}", anchor="start", colour=text_palette[ci % len(text_palette)], weight="bold",
               size=11)
        if step == 0:
            c.text(x, 200, "state not computed", anchor="start", size=11, colour=MUTED)
            continue
        c.text(x, 200, f"m = {m:.2f}, l = {l:.2f}", anchor="start", size=11)
        c.text(x, 218, "o_c:", anchor="start", size=11)
        _bars(c, list(o), x + 34, 255, 38, reach, palette[ci % len(palette)])
    output = merged[merged_upto][2] if merged_upto >= 1 else None
    equal = step == chunks and np.allclose(output, exact, rtol=0, atol=1e-12)
    c.text(left, 320, "merged output (bars) and exact softmax(s)·V (ticks)", anchor="start", weight="bold", size=11)
    _bars(c, list(output) if output is not None else [None] * len(exact), left + 10, 360, 34, reach,
          GREEN if equal else BLUE, exact=list(exact), width=22, gap=34)
    if merged_upto >= 1:
        m, l, o = merged[merged_upto]
        prev_m, prev_l, _ = merged[merged_upto - 1]
        cm, cl, _ = states[merged_upto]
        w1, w2 = prev_l * math.exp(prev_m - m), cl * math.exp(cm - m)
        c.text(left + 140, 340, f"m = max(m_a, m_b) = {m:.3f}", anchor="start", size=11)
        c.text(left + 140, 358, f"w = l·e^(m_c − m): {w1:.3f} for {_chunks(0, merged_upto - 1)}, {w2:.3f} for chunk "
               f"{merged_upto}", anchor="start", size=11)
        c.text(left + 140, 376, f"o = (w_a·o_a + w_b·o_b)/(w_a + w_b) = {_vec(o)}", anchor="start", size=11)
    else:
        c.text(left + 140, 358, "no merge yet", anchor="start", size=11, colour=MUTED)
    if step == chunks:
        c.text(left + 140, 394, "equal to the exact output" if equal else "NOT equal to the exact output",
               anchor="start", size=11, colour=GREEN if equal else RED, weight="bold")

    if step == 0:
        what = f"The cache holds {n} keys, cut into {chunks} chunks of {chunk}; one program per chunk."
    elif step == 1:
        what = ("Each chunk's program computes its state, all at the same time: "
                + "; ".join(f"chunk {ci}: m = {m:.3f}, l = {l:.4f}, o = {_vec(o)}"
                            for ci, (m, l, o) in enumerate(states)) + ".")
    else:
        what = (f"Chunk {merged_upto} merged into {_chunks(0, merged_upto - 1)}: the output of chunks 0–{merged_upto} "
                f"is {_vec(output)}.")
    text = what + f" Exact output {_vec(exact)}" + (
        (": equal, every chunk is merged." if equal else ": NOT equal, a merge is wrong.") if step == chunks else ".")
    data = {"output": None if output is None else [float(x) for x in output],
            "exact": [float(x) for x in exact], "merged": merged_upto + 1 if merged_upto >= 1 else 0, "equal": int(equal),
            "chunks": chunks, "states": [[float(m), float(l)] for m, l, _ in states] if step >= 1 else None}
    return Frame((step,), c.markup(f"Split-K decoding, step {step}, described below"), text, data)
