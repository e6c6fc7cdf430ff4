"""Hidden checks for Chapter 2 (Variants)."""
import numpy as np

from autograde.compare import (
    GradingFailure,
    call,
    call_unchanged,
    describe,
    expect_close,
    expect_sequence,
    expect_unchanged,
    expect_value_error,
)
from autograde.reference import variants as ref
from autograde.sandbox import in_student_process, is_instance
from student_runtime import probes

RNG_SEED = 20261


def _rng(offset=0):
    return np.random.default_rng(RNG_SEED + offset)


# ------------------------------------------------------ positional encoding

def check_pe_values(sinusoidal_positional_encoding):
    """Many table sizes, from one position or two columns up to long tables."""
    for n_positions, d_model in [(1, 2), (1, 8), (6, 2), (7, 4), (50, 16), (128, 64), (3, 512), (2048, 128)]:
        what = f"sinusoidal_positional_encoding({n_positions}, {d_model})"
        found = call(sinusoidal_positional_encoding, n_positions, d_model, what=what)
        expect_close(found, ref.sinusoidal_positional_encoding(n_positions, d_model), what=what, atol=1e-8,
                     hint="Even columns 2i hold sin(p / 10000^(2i/d_model)) and odd columns 2i+1 the cos "
                          "of the same angle; compute in float64.")


def check_pe_odd_width(sinusoidal_positional_encoding):
    """An odd d_model has no sin/cos pairing: a ValueError, not a wrong table."""
    for d_model in (1, 3, 7, 129):
        expect_value_error(sinusoidal_positional_encoding, 10, d_model,
                           what=f"sinusoidal_positional_encoding(10, {d_model})", reason="d_model is odd")


# --------------------------------------------------------------- causal mask

def check_causal_mask(causal_mask):
    for n in (1, 2, 3, 5, 8, 13, 64):
        what = f"causal_mask({n})"
        found = call(causal_mask, n, what=what)
        if not isinstance(found, np.ndarray) or found.dtype != np.bool_:
            raise GradingFailure(f"{what} should return a NumPy array of dtype bool, but returned {describe(found)}.")
        if found.shape != (n, n):
            raise GradingFailure(f"{what} should return shape {(n, n)}, but returned shape {found.shape}.")
        expected = ref.causal_mask(n)
        wrong = np.argwhere(found != expected)
        if len(wrong):
            i, j = (int(t) for t in wrong[0])
            raise GradingFailure(f"{what} is wrong at query {i}, key {j}: expected {bool(expected[i, j])}, "
                                 f"found {bool(found[i, j])} ({len(wrong)} entries wrong). Query i may attend "
                                 "to key j exactly when j <= i, itself included.")


# ---------------------------------------------------------- cross-attention

def _cross_inputs(rng, n_dec, n_enc, d_dec, d_enc, d_k, d_v, scale=1.0):
    return (rng.normal(scale=scale, size=(n_dec, d_dec)), rng.normal(scale=scale, size=(n_enc, d_enc)),
            rng.normal(size=(d_dec, d_k)), rng.normal(size=(d_enc, d_k)), rng.normal(size=(d_enc, d_v)))


def _check_cross(cross_attention, inputs, label, hint):
    what = f"cross_attention with {label}"
    found = call_unchanged(cross_attention, *inputs, what=what)
    expect_close(found, ref.cross_attention(*inputs), what=what, hint=hint)


def check_cross_attention_shapes(cross_attention):
    """Decoder and encoder of different lengths and widths, d_k != d_v, one token each side."""
    rng = _rng(1)
    for n_dec, n_enc, d_dec, d_enc, d_k, d_v in [(4, 6, 5, 5, 3, 2), (1, 7, 4, 6, 4, 4), (5, 1, 3, 8, 2, 6),
                                                 (9, 3, 6, 4, 5, 1), (2, 11, 8, 8, 16, 3)]:
        inputs = _cross_inputs(rng, n_dec, n_enc, d_dec, d_enc, d_k, d_v)
        _check_cross(cross_attention, inputs,
                     f"n_dec={n_dec}, n_enc={n_enc}, x_dec width {d_dec}, memory width {d_enc}, "
                     f"d_k={d_k}, d_v={d_v}",
                     "Queries come from x_dec @ w_q, keys and values from memory @ w_k and memory @ w_v; "
                     "scale by 1/sqrt(d_k) and normalise over the encoder positions (the keys).")


def check_cross_attention_extreme(cross_attention):
    """Scores in the thousands: the softmax must not overflow."""
    rng = _rng(2)
    for scale in (20.0, 200.0):
        inputs = _cross_inputs(rng, 3, 5, 4, 6, 4, 3, scale=scale)
        _check_cross(cross_attention, inputs, f"inputs of size about {scale:g}",
                     "Use a numerically stable softmax (subtract the row maximum).")


# -------------------------------------------------------------- KV cache

def _decoder_weights(rng, d_model, d_k, d_v):
    return (rng.normal(size=(d_model, d_k)), rng.normal(size=(d_model, d_k)), rng.normal(size=(d_model, d_v)))


def _check_step(decode_step, x_t, cache_k, cache_v, weights, label):
    what = f"decode_step with {label}"
    result = call_unchanged(decode_step, x_t, cache_k, cache_v, *weights, what=what)
    expect_sequence(result, 3, what=what, names="(output_t, cache_k, cache_v)")
    out, new_k, new_v = result
    ref_out, ref_k, ref_v = ref.decode_step(x_t, cache_k, cache_v, *weights)
    expect_close(new_k, ref_k, what=f"the key cache returned by {what}",
                 hint="Return the old key cache with x_t @ w_k appended as one new last row; "
                      "keep the old rows as they are.")
    expect_close(new_v, ref_v, what=f"the value cache returned by {what}",
                 hint="Return the old value cache with x_t @ w_v appended as one new last row.")
    expect_close(out, ref_out, what=f"the output of {what}",
                 hint="The query x_t @ w_q attends over every cached key, the new one included; "
                      "output_t has shape (d_v,).")
    return new_k, new_v


def check_decode_step(decode_step):
    """From an empty cache, from a cache holding arbitrary rows (attend to them as
    given, do not recompute), and chained steps that feed the caches back."""
    rng = _rng(3)
    for d_model, d_k, d_v in [(4, 3, 2), (6, 6, 6), (5, 2, 7)]:
        weights = _decoder_weights(rng, d_model, d_k, d_v)
        cache_k, cache_v = np.zeros((0, d_k)), np.zeros((0, d_v))
        for t in range(4):
            cache_k, cache_v = _check_step(decode_step, rng.normal(size=d_model), cache_k, cache_v, weights,
                                           f"a cache of {t} rows built by earlier steps "
                                           f"(d_model={d_model}, d_k={d_k}, d_v={d_v})")
        stored_k, stored_v = rng.normal(scale=3.0, size=(5, d_k)), rng.normal(size=(5, d_v))
        _check_step(decode_step, rng.normal(size=d_model), stored_k, stored_v, weights,
                    f"a cache of 5 stored rows (d_model={d_model}, d_k={d_k}, d_v={d_v})")


def check_decode_with_kv_cache(decode_with_kv_cache):
    """Equal to full causal self-attention for many sizes, and built from one
    decode_step call per token, each given one token and the cache so far."""
    rng = _rng(4)
    for n, d_model, d_k, d_v in [(1, 4, 3, 2), (2, 3, 3, 3), (7, 6, 4, 5), (12, 5, 8, 2), (20, 8, 8, 8)]:
        x = rng.normal(size=(n, d_model))
        weights = _decoder_weights(rng, d_model, d_k, d_v)
        what = f"decode_with_kv_cache for x of shape {x.shape}, d_k={d_k}, d_v={d_v}"
        before = [x.copy(), *(w.copy() for w in weights)]
        found, calls = in_student_process(probes.counting_decode_steps, decode_with_kv_cache, x, *weights, what=what)
        for b, a in zip(before, (x, *weights)):
            expect_unchanged(b, a, what=what)
        calls = [tuple(tuple(shape) for shape in c) for c in calls]
        expect_close(found, ref.causal_self_attention(x, *weights), what=what,
                     hint="Token t's output attends to the keys of tokens 0..t, itself included.")
        expected_calls = [((d_model,), (t, d_k), (t, d_v)) for t in range(n)]
        if calls != expected_calls:
            raise GradingFailure(
                f"{what} should call decode_step once per token, in order, with one token of shape "
                f"({d_model},) and the caches so far (0, 1, 2, ... rows); it made {len(calls)} calls"
                + (f", the first with shapes {calls[0]}." if calls else "."))


# ------------------------------------------------------------------ entropy

def _softmax_rows(rng, shape, scale):
    return ref.softmax(rng.normal(scale=scale, size=shape), axis=-1)


def _check_entropy(attention_entropy, weights, label, hint=""):
    what = f"attention_entropy for {label}"
    found = call_unchanged(attention_entropy, weights, what=what)
    expect_close(found, ref.attention_entropy(weights), what=what, hint=hint)


def check_entropy_batched(attention_entropy):
    """Any number of leading axes; the entropy is taken along the last one only."""
    rng = _rng(5)
    for shape in [(5,), (1,), (4, 6), (6, 4), (2, 3, 5), (2, 2, 3, 7)]:
        _check_entropy(attention_entropy, _softmax_rows(rng, shape, 2.0), f"weights of shape {shape}",
                       "Sum -p log p (natural log) along the last axis; the result has the shape "
                       "of weights without its last axis.")


def check_entropy_limits(attention_entropy):
    """One-hot rows give 0, uniform rows give ln n, masked (exactly zero) weights
    add nothing, and probabilities as small as 1e-300 are handled."""
    n = 6
    one_hot = np.eye(n)
    uniform = np.full((3, n), 1.0 / n)
    causal = np.tril(np.ones((n, n)))
    causal /= causal.sum(axis=-1, keepdims=True)
    tiny = np.array([[1.0 - 2e-300, 1e-300, 1e-300, 0.0]])
    rng = _rng(6)
    masked = _softmax_rows(rng, (2, 4, 8), 1.0) * (rng.random((2, 4, 8)) < 0.5)
    masked[..., 0] += 1e-3
    masked /= masked.sum(axis=-1, keepdims=True)
    hint = "Define 0 log 0 = 0: skip the zero weights (for example with np.where) instead of taking log(0)."
    _check_entropy(attention_entropy, one_hot, "one-hot rows (the entropy is exactly 0)", hint)
    _check_entropy(attention_entropy, uniform, f"uniform rows over {n} keys (the entropy is ln {n})")
    _check_entropy(attention_entropy, causal, "the causal weights of uniform scores (rows with zeros)", hint)
    _check_entropy(attention_entropy, tiny, "a row with weights of 1e-300 and 0", hint)
    _check_entropy(attention_entropy, masked, "batched weights where masked keys have weight 0", hint)


# ---------------------------------------------------------- additive attention

def _additive_inputs(rng, lead, n_q, n_k, d_q, d_k, d_h, d_v, score_scale=1.0):
    return (rng.normal(size=(*lead, n_q, d_q)), rng.normal(size=(*lead, n_k, d_k)), rng.normal(size=(*lead, n_k, d_v)),
            rng.normal(size=(d_q, d_h)), rng.normal(size=(d_k, d_h)), rng.normal(scale=score_scale, size=d_h))


def _check_additive(additive_attention, inputs, label, hint):
    what = f"additive_attention with {label}"
    result = call_unchanged(additive_attention, *inputs, what=what)
    expect_sequence(result, 2, what=what, names="(output, weights)")
    ref_out, ref_weights = ref.additive_attention(*inputs)
    expect_close(result[1], ref_weights, what=f"the weights from {what}", hint=hint)
    expect_close(result[0], ref_out, what=f"the output from {what}")


def check_additive_batched(additive_attention):
    """Zero to two batch axes, n_q != n_k, different query, key, hidden and value widths."""
    rng = _rng(7)
    for lead, n_q, n_k, d_q, d_k, d_h, d_v in [((), 3, 5, 4, 6, 7, 2), ((), 1, 1, 2, 2, 3, 1), ((2,), 4, 4, 3, 3, 5, 3),
                                               ((2, 3), 2, 6, 5, 4, 8, 4), ((1,), 7, 3, 6, 2, 4, 5)]:
        _check_additive(additive_attention, _additive_inputs(rng, lead, n_q, n_k, d_q, d_k, d_h, d_v),
                        f"batch axes {lead}, n_q={n_q}, n_k={n_k}, widths d_q={d_q}, d_k={d_k}, "
                        f"d_h={d_h}, d_v={d_v}",
                        "score[i, j] = w_score · tanh(q_i @ w_q + k_j @ w_k); softmax over the keys j.")


def check_additive_extreme(additive_attention):
    """A long w_score makes the scores large: the softmax must not overflow."""
    rng = _rng(8)
    for scale in (100.0, 1000.0):
        _check_additive(additive_attention, _additive_inputs(rng, (), 3, 5, 4, 4, 6, 2, score_scale=scale),
                        f"w_score entries of size about {scale:g}",
                        "Use a numerically stable softmax (subtract the row maximum).")


# ------------------------------------------------------------ encoder layer

def load_torch_weights(layer, torch_layer):
    """Copy a torch.nn.TransformerEncoderLayer's weights into the exercise's
    EncoderLayer (attributes w_q, w_k, w_v, w_o, ff1, ff2, norm1, norm2)."""
    import torch

    d_model = torch_layer.self_attn.embed_dim
    attn = torch_layer.self_attn
    targets = {
        "w_q": (attn.in_proj_weight[:d_model], attn.in_proj_bias[:d_model]),
        "w_k": (attn.in_proj_weight[d_model:2 * d_model], attn.in_proj_bias[d_model:2 * d_model]),
        "w_v": (attn.in_proj_weight[2 * d_model:], attn.in_proj_bias[2 * d_model:]),
        "w_o": (attn.out_proj.weight, attn.out_proj.bias),
        "ff1": (torch_layer.linear1.weight, torch_layer.linear1.bias),
        "ff2": (torch_layer.linear2.weight, torch_layer.linear2.bias),
        "norm1": (torch_layer.norm1.weight, torch_layer.norm1.bias),
        "norm2": (torch_layer.norm2.weight, torch_layer.norm2.bias),
    }
    with torch.no_grad():
        for name, (weight, bias) in targets.items():
            module = getattr(layer, name, None)
            if module is None or getattr(module, "weight", None) is None or getattr(module, "bias", None) is None:
                raise GradingFailure(f"EncoderLayer has no attribute {name} with a weight and a bias; keep the "
                                     "attributes that the given __init__ creates.")
            if module.weight.shape != weight.shape or module.bias.shape != bias.shape:
                raise GradingFailure(f"EncoderLayer.{name} has weight shape {tuple(module.weight.shape)}, "
                                     f"expected {tuple(weight.shape)}.")
            module.weight.copy_(weight)
            module.bias.copy_(bias)


def _torch_layer(d_model, num_heads, d_ff, norm_first, seed):
    import torch

    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(d_model, num_heads, d_ff, dropout=0.0, activation="relu",
                                             batch_first=True, norm_first=norm_first, dtype=torch.float64)
    with torch.no_grad():  # non-trivial LayerNorm parameters and biases, so each must be used
        for name, p in layer.named_parameters():
            if name.startswith("norm"):
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.3 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.5 / p.shape[-1] ** 0.5 if p.dim() == 2 else 0.3))
    return layer.eval()


def _check_encoder(EncoderLayer, norm_first):
    import torch

    kind = "pre-norm (norm_first=True)" if norm_first else "post-norm (norm_first=False)"
    configs = [(2, 5, 8, 2, 16), (1, 1, 4, 1, 8), (3, 7, 12, 3, 5), (2, 4, 8, 8, 32), (1, 9, 6, 2, 24)]
    for seed, (batch, n, d_model, heads, d_ff) in enumerate(configs):
        what = f"EncoderLayer({d_model}, {heads}, {d_ff}, norm_first={norm_first})"
        layer = call(EncoderLayer, d_model, heads, d_ff, norm_first=norm_first, what=what)
        if not is_instance(layer, torch.nn.Module):
            raise GradingFailure(f"{what} should create a torch.nn.Module, but created {describe(layer)}.")
        reference = _torch_layer(d_model, heads, d_ff, norm_first, seed)
        layer = layer.double().eval()
        load_torch_weights(layer, reference)
        x = torch.from_numpy(_rng(9 + seed).normal(size=(batch, n, d_model)))
        before = x.clone()
        what = f"the {kind} output of {what} for x of shape {tuple(x.shape)}"
        found = call(layer, x, what=what)
        if not isinstance(found, torch.Tensor):
            raise GradingFailure(f"{what} should be a torch.Tensor, but is {describe(found)}.")
        if not torch.equal(before, x):
            raise GradingFailure(f"{what}: forward modified its input in place.")
        expected = reference(x).detach().numpy()
        expect_close(found.detach().numpy(), expected, what=what, atol=1e-8,
                     hint="Post-norm: x = norm1(x + attn(x)); x = norm2(x + ff(x)). "
                          "Pre-norm: x = x + attn(norm1(x)); x = x + ff(norm2(x)). "
                          "Each head scales its scores by 1/sqrt(d_model // num_heads).")


def check_encoder_post_norm(EncoderLayer):
    _check_encoder(EncoderLayer, norm_first=False)


def check_encoder_pre_norm(EncoderLayer):
    _check_encoder(EncoderLayer, norm_first=True)
