"""Hidden checks for Chapter 4's capstone (Exercise 7): the student's kernels as the
attention of the notebook's small decoder, trained for a few steps, then greedy
generation with the student's split-K decoding kernel and a KV cache.

The model, its data and its training loop are the notebook's given cell, read
from the instructor's notebook and run on both sides: in the student's process
with the student's code (student_runtime.capstone, which reports what ran), and
here with plain PyTorch attention in float64 for the expected answers."""
import functools
import math

import numpy as np

from autograde.compare import GradingFailure, expect_within
from autograde.course import SOLUTIONS
from autograde.sandbox import in_student_process
from student_runtime import capstone

NOTEBOOK = SOLUTIONS / "ch4_flash" / "flash.ipynb"
MODEL_CELL = "capstone_model"

# Tolerances, stated in the exercise. Losses: float32 with the kernels against float64 plain
# attention from the same initial weights differ by about 1e-7 over the five steps in the
# interpreter (the float32 rounding of the whole model, which the kernels' joins); 1e-4 is a
# thousand times that, and a forgotten mask or a wrong head mapping moves the losses by 5e-4 to
# 1e-1. On a GPU float32 products run in TF32 (2^-11 against float32's 2^-24): 2e-2 (not yet
# measured on a GPU).
LOSS_TOL = {"interpreter": 1e-4, "native": 2e-2}
# Logits: float32 against float64 differ by 2e-5 with the generation weights (TF32 on a GPU by
# far more); a token is compared only while the float64 reference's two best logits are further
# apart than this, since a smaller gap could honestly go either way.
LOGIT_TOL = {"interpreter": 1e-3, "native": 1e-1}

PROMPTS = ("each new ", "the key and the value of every")      # the first is not the longest
N_NEW = 12


@functools.lru_cache(maxsize=None)
def model_source():
    import nbformat

    for cell in nbformat.read(NOTEBOOK, as_version=4).cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == MODEL_CELL:
            return cell.source
    raise LookupError(f"{NOTEBOOK} has no cell {MODEL_CELL}")


def _namespace():
    import torch

    namespace = {"torch": torch, "math": math, "__name__": "capstone_reference"}
    exec(compile(model_source(), "<capstone model>", "exec"), namespace)
    return namespace


def _mode():
    from coursekit.triton_env import triton_device

    return "native" if triton_device(quiet=True) == "cuda" else "interpreter"


@functools.lru_cache(maxsize=None)
def reference_run():
    """(float64 losses of the notebook's training with plain attention, the weights it ends
    with as float32 arrays, the vocabulary size), from the float32 initial weights."""
    ns = _namespace()
    vocab = len(ns["CHARS"])
    model = ns["TinyDecoder"](vocab).double()
    losses = ns["train"](model, ns["plain_causal_attention"])
    weights = {name: value.detach().float().numpy() for name, value in model.state_dict().items()}
    return np.array(losses), weights, vocab


# Generation uses weights trained further, with plain attention in float64 (40 steps on 8
# windows), so that the two prompts continue differently and the logits' gaps are wide.
GENERATION_TRAINING = {"steps": 40, "n_batch": 8}


@functools.lru_cache(maxsize=None)
def generation_weights():
    """The float32 weights of the notebook's decoder after GENERATION_TRAINING in float64."""
    ns = _namespace()
    model = ns["TinyDecoder"](len(ns["CHARS"])).double()
    ns["train"](model, ns["plain_causal_attention"], **GENERATION_TRAINING)
    return {name: value.detach().float().numpy() for name, value in model.state_dict().items()}


@functools.lru_cache(maxsize=None)
def reference_tokens():
    """(greedy tokens, each step's gap between the two best logits) per prompt, in float64 with
    plain attention over the whole sequence at every step (no cache), the generation weights."""
    import torch

    ns = _namespace()
    weights, vocab = generation_weights(), len(ns["CHARS"])
    model = ns["TinyDecoder"](vocab)
    model.load_state_dict({name: torch.from_numpy(value) for name, value in weights.items()})
    model = model.double()
    tokens, gaps = [], []
    with torch.no_grad():
        for prompt in PROMPTS:
            sequence = ns["encode"](prompt)[None]
            new, gap = [], []
            for _ in range(N_NEW):
                logits = model(sequence, ns["plain_causal_attention"])[0, -1]
                top = torch.topk(logits, 2).values
                gap.append(float(top[0] - top[1]))
                new.append(int(logits.argmax()))
                sequence = torch.cat([sequence, torch.tensor([[new[-1]]])], dim=1)
            tokens.append(new)
            gaps.append(gap)
    return np.array(tokens), np.array(gaps)


TRAIN_HINT = ("Call FlashAttention.apply(q, k, v, True, None) on (n_batch, H, n, d) views of the projections "
              "(transpose the head and position axes; no copies are needed, the kernels take strides), with "
              "causal=True, and give k and v with their H_kv heads as they are: the kernels map query head h "
              "to key/value head h // (H_q / H_kv). Then transpose the output back to (n_batch, n, H_q, d).")


def check_capstone_training(kernel_attention):
    """The notebook's training (its given cell: the decoder, the data, five steps of SGD with
    momentum) run in the student's process with kernel_attention as the model's attention:
    every attention call launches kernels and uses no PyTorch matrix product, softmax or
    attention; the backward pass launches kernels too (at least one launch per attention
    call besides the forward's); no kernel of the book's modules; and the five losses are
    within LOSS_TOL of a float64 run with plain attention from the same initial weights."""
    expected, _, vocab = reference_run()
    run = in_student_process(capstone.training_run, kernel_attention, model_source(), vocab)
    what = "kernel_attention, as the attention of the model trained by the notebook's `train`"
    for i, entry in enumerate(run["calls"]):
        used = sorted({op for op in entry["ops"] if op in capstone.ATTENTION_OPS or "attention" in op})
        if used:
            raise GradingFailure(f"{what}: attention call {i} used PyTorch's {', '.join(used)}. The attention must "
                                 f"be computed by your kernels, through FlashAttention.apply. {TRAIN_HINT}")
        if entry["launches"] == 0:
            raise GradingFailure(f"{what}: attention call {i} launched no Triton kernel. {TRAIN_HINT}")
    borrowed = [m for m in run["modules"] if m.split(".")[0] in ("bookutils", "coursekit")]
    if borrowed:
        raise GradingFailure(f"{what} launched kernels of the book's modules ({', '.join(borrowed)}): use your own.")
    forward = sum(entry["launches"] for entry in run["calls"])
    if run["launches"] - forward < len(run["calls"]):
        raise GradingFailure(
            f"{what}: the backward pass launched {run['launches'] - forward} kernels for {len(run['calls'])} "
            "attention calls: the gradients must come from your backward kernels (FlashAttention.apply runs "
            "flash_attention_backward).")
    losses = np.asarray(run["losses"], dtype=float)
    if losses.shape != expected.shape:
        raise GradingFailure(f"{what}: train returned {losses.size} losses, expected {expected.size}.")
    tol = LOSS_TOL[_mode()]
    expect_within(losses, expected, np.full(expected.shape, tol), what=f"{what}: the loss before each step",
                  hint=f"The losses must stay within {tol:g} of plain causal attention's. " + TRAIN_HINT)


# ------------------------------------------------------------- generation

_RUNS = []  # (generate, its run): the two generation cells grade one run of the same function


def _generation_run(generate):
    for fn, run in _RUNS:
        if fn is generate:
            return run
    ns = _namespace()
    prompts = [ns["encode"](p).tolist() for p in PROMPTS]
    try:
        run = in_student_process(capstone.generation_run, generate, model_source(), len(ns["CHARS"]),
                                 generation_weights(), prompts, N_NEW)
    except GradingFailure as failure:
        run = failure
    _RUNS[:] = [(generate, run)]
    return run


def _what():
    lengths = [len(p) for p in PROMPTS]
    return f"generate(model, prompts of lengths {lengths}, n_new={N_NEW})"


def _run_or_fail(generate):
    run = _generation_run(generate)
    if isinstance(run, GradingFailure):
        raise GradingFailure(str(run))
    return run


GENERATE_HINT = ("The first new token is the argmax of the prompt's last logits (the prefill); then each step feeds "
                 "the last token of every sequence at its own position (the sequence's length so far), appends "
                 "its key and value at that position of the cache, and calls decode_attention with cache_lens "
                 "counting that new key. Query head h reads cache head h // (H_q / H_kv).")


def check_capstone_generate(generate):
    """Greedy generation of N_NEW tokens after two prompts of different lengths, with the
    generation weights: the returned (2, N_NEW) integer tensor must hold the float64
    reference's greedy tokens (plain attention over the whole sequence at every step) at
    every step up to the first where the reference's two best logits are within LOGIT_TOL
    (after a near-tie an honest float32 run may continue differently; none occurs with these
    weights in the interpreter); and every decode_attention call's cache_lens must count the
    keys in the cache, the new token's included."""
    run = _run_or_fail(generate)
    expected, gaps = reference_tokens()
    what = _what()
    if run["tokens"] is None or tuple(run["tokens"].shape) != expected.shape:
        raise GradingFailure(f"{what} should return a tensor of integer tokens of shape {expected.shape} (one row "
                             f"per prompt, the {N_NEW} new tokens), but returned {run['returned']}.")
    tol = LOGIT_TOL[_mode()]
    for b, (found, want, gap) in enumerate(zip(run["tokens"], expected, gaps)):
        for t in range(N_NEW):
            if gap[t] <= tol:
                break       # a near-tie: the rest may differ honestly
            if found[t] != want[t]:
                raise GradingFailure(
                    f"{what}: sequence {b}, new token {t} is {int(found[t])}, but greedy decoding gives "
                    f"{int(want[t])} (its logit leads the next by {gap[t]:.3g}, far above float32's rounding); "
                    f"the tokens before it were right. {GENERATE_HINT}")
    # The lengths: the first decoding step (one call per layer) reads the prompt's keys and the
    # first new token's (or only the prompt's, when the prefill left its last token to that
    # step); each later step one key more.
    layers = len(_namespace()["TinyDecoder"](2).blocks)
    prompt_lens = np.array([len(p) for p in PROMPTS])
    calls = run["calls"]
    left_last = len(calls) >= layers * N_NEW and calls[0]["lens"] == prompt_lens.tolist()   # one step more
    first = prompt_lens if left_last else prompt_lens + 1
    for i, call in enumerate(calls):
        want = (first + i // layers).tolist()
        if call["lens"] != want:
            raise GradingFailure(
                f"{what} called decode_attention with cache_lens={call['lens']} where the caches held {want} keys "
                f"(the prompts' lengths, {[len(p) for p in PROMPTS]}, plus the tokens fed back so far, the new one "
                f"included). {GENERATE_HINT}")


def check_capstone_cache(generate):
    """The same run, for how it generates: after the prefill, each new token but the last costs
    one decode_attention call per layer for the whole batch (q of shape (n_batch, H_q, d)),
    (N_NEW - 1) to N_NEW calls per layer in all; the caches handed to decode_attention are
    windows of buffers allocated once (at most two storages per layer over the whole run,
    each larger than any window passed); after the first step the host makes no tensor in
    new memory as large as half of one layer's valid keys at the last step (a copy of a
    cache), and never calls PyTorch's softmax or attention."""
    run = _run_or_fail(generate)
    ns = _namespace()
    model = ns["TinyDecoder"](len(ns["CHARS"]))
    layers, heads, kv_heads, d = len(model.blocks), model.heads, model.kv_heads, model.head_dim
    what = _what()
    calls = run["calls"]
    if not layers * (N_NEW - 1) <= len(calls) <= layers * N_NEW:
        raise GradingFailure(
            f"{what} called decode_attention {len(calls)} times; {layers * (N_NEW - 1)} (one call per layer for each "
            f"new token after the first, {layers} layers) are expected. The prefill computes the prompts' keys and "
            "values once; then each step runs one new token per sequence through the layers, reading the cache "
            "with decode_attention, not the model over the whole sequence again.")
    bad = [c for c in calls if c["q"] != [len(PROMPTS), heads, d]]
    if bad:
        raise GradingFailure(f"{what} called decode_attention with q of shape {bad[0]['q']}; each call serves the "
                             f"whole batch, one query per sequence: ({len(PROMPTS)}, {heads}, {d}).")
    storages = {}
    for c in calls:
        for name in ("k", "v"):
            cache = c.get(name)
            if cache is None:
                raise GradingFailure(f"{what} passed decode_attention a {name}_cache that is not a tensor.")
            storages[cache["storage"]] = cache["storage_bytes"]
            window = int(np.prod(cache["shape"])) * cache["element"]
            if cache["storage_bytes"] <= window and cache["shape"][2] < max(len(p) for p in PROMPTS) + N_NEW - 1:
                raise GradingFailure(
                    f"{what} passed decode_attention a {name}_cache of shape {tuple(cache['shape'])} that is all of "
                    "its memory: a tensor made for this step. Allocate each layer's cache once, for the longest "
                    "sequence, and pass windows of it (cache[..., :length, :]) without copying.")
    if len(storages) > 2 * layers:
        raise GradingFailure(
            f"{what} passed decode_attention caches in {len(storages)} different buffers over {len(calls)} calls "
            f"({layers} layers): a cache copied or rebuilt (torch.cat, .contiguous(), .clone()) at every step. "
            "Allocate each layer's cache once and write each new key and value into it in place.")
    element = calls[-1]["k"]["element"]
    longest = max(len(p) for p in PROMPTS) + N_NEW - 1
    half = len(PROMPTS) * kv_heads * longest * d * element // 2
    if run["largest"] >= half:
        raise GradingFailure(
            f"{what}: during the decoding steps the host made a tensor of {run['largest']} bytes "
            f"({run['largest_op']}), as large as a copy of a layer's cache ({2 * half} bytes of keys at the last "
            "step). Write the new key and value into the preallocated cache in place and pass windows of it.")
    used = sorted({op for op in run["ops"] if "softmax" in op or "attention" in op})
    if used:
        raise GradingFailure(f"{what} used PyTorch's {', '.join(used)}: the attention must run in your kernels.")
