"""Hidden checks for Chapter 3 (Complexity)."""
import numpy as np

from autograde.compare import (GradingFailure, call, call_unchanged, expect_close, expect_int, expect_value_error,
                               numpy_only)
from autograde.memory import GRANULARITY_BYTES, traced_peak
from autograde.reference import complexity as ref

# The functions these checks grade as NumPy code: their hidden tests call them in the student's
# process without PyTorch (autograde.execute).
NUMPY_GRADED = ('training_flops', 'receptive_field', 'dilated_local_attention', 'causal_linear_attention')

RNG_SEED = 20262


def _rng(offset=0):
    return np.random.default_rng(RNG_SEED + offset)


# ------------------------------------------------------------- counting

TRAINING_HINT = ("Forward: Q, K, V and the output projection cost 2·n·d_model·(heads·d_head) each; per head, "
                 "QK^T and AV cost 2·n·n·d_head each. Backward: each product needs the gradient of both of its "
                 "inputs, two more products of the same cost. Use integers so huge sizes stay exact.")


def _training_sizes():
    """Hand-picked sizes, then sizes drawn across the whole range the cell promises (up to
    n = 10^9, d_model = 10^5), odd ones included: nearly every such total has an odd part
    beyond 2^53, so a float anywhere in the count rounds it."""
    sizes = [(1, 1, 1, 1), (2, 3, 1, 3), (7, 5, 2, 4), (64, 64, 8, 8), (128, 96, 4, 32), (100, 3000, 24, 128),
             (4096, 4096, 32, 128), (10**6, 8192, 64, 160), (10**9, 10**5, 7, 3), (10**9 - 1, 10**5 - 1, 97, 127),
             (999_999_937, 99_991, 13, 251)]
    rng = _rng(20)
    for draw in range(24):  # half spread evenly over the range, half evenly over its orders of magnitude
        n, d_model = ((int(rng.integers(1, top + 1)) if draw % 2 else int(10 ** rng.uniform(0, np.log10(top))))
                      for top in (10**9, 10**5))
        sizes.append((n, d_model, int(rng.integers(1, 129)), int(rng.integers(1, 513))))
    return sizes


def check_training_flops(training_flops):
    for n, d_model, heads, d_head in _training_sizes():
        what = f"training_flops(n={n}, d_model={d_model}, heads={heads}, d_head={d_head})"
        expect_int(call(training_flops, n, d_model, heads, d_head, what=what),
                   ref.training_flops(n, d_model, heads, d_head), what=what, hint=TRAINING_HINT)
    numpy_only(training_flops, 64, 48, 4, 16, what="training_flops(n=64, d_model=48, heads=4, d_head=16)")


RECEPTIVE_HINT = ("Layer l of width w and dilation δ spans (w - 1)·δ positions of its own input; with strides "
                  "s_1, s_2, ... below it, neighbouring positions of that input lie s_1·s_2·...·s_(l-1) input "
                  "positions apart. The top layer's own stride changes nothing for one of its outputs.")


def check_receptive_field(receptive_field):
    cases = [([], [], []), ([3], [1], [1]), ([2, 2, 2], [1, 2, 4], [1, 1, 1]), ([3, 3, 3, 3], [1, 3, 9, 27], [1] * 4),
             ([5, 1, 4], [2, 7, 3], [1, 1, 1]), ([2] * 10, [1] * 10, [1] * 10), ([7, 3], [1, 1], [1, 1]),
             ([4, 4, 4], [5, 1, 5], [1, 1, 1]), ([9], [100], [7]), ([3, 3], [1, 1], [2, 1]), ([2, 2, 2], [1, 1, 1], [2, 2, 2]),
             ([5, 3, 4], [2, 1, 3], [3, 2, 5]), ([4, 1, 3], [2, 5, 1], [1, 3, 2]), ([2] * 10, [1] * 10, [2] * 10),
             ([3, 2, 2, 2], [1, 2, 1, 3], [2, 1, 3, 1]), ([2, 2], [1, 1], [1, 1000]),
             # Spans between 2^53 and 2^63: exact in integers, rounded in floats.
             ([2] * 10, [7, 3, 9, 1, 5, 11, 3, 1, 7, 999], [53] * 10), ([9, 3, 5, 4], [1001, 3, 17, 12347], [99991, 10007, 4999, 31])]
    for widths, dilations, strides in cases:
        what = f"receptive_field(kernel_widths={widths}, dilations={dilations}, strides={strides})"
        expect_int(call(receptive_field, list(widths), list(dilations), list(strides), what=what),
                   ref.receptive_field(widths, dilations, strides), what=what, hint=RECEPTIVE_HINT)
    numpy_only(receptive_field, [3, 2, 5], [1, 4, 2], [2, 1, 3],
               what="receptive_field(kernel_widths=[3, 2, 5], dilations=[1, 4, 2], strides=[2, 1, 3])")


# ------------------------------------------------------------- longest fitting chunk

class MemoryModel:
    """A non-decreasing cost on the positive integers, with the formula a
    failure message shows."""

    def __init__(self, formula, cost):
        self.formula, self.cost = formula, cost

    def __call__(self, n):
        return self.cost(n)


def _ceil_div(a, b):
    return -(-a // b)


def _measured_table():
    """48 peaks as a profiler reports them: rounded to 512 bytes, so some
    neighbours are equal; the model goes on at 4096 bytes per token after them."""
    steps = np.random.default_rng(RNG_SEED + 10).integers(0, 4, size=48)
    return [8192 + 512 * int(s) for s in np.cumsum(steps)]


MEASURED = _measured_table()

BOOK_MODEL = MemoryModel("2·(4·768·n + 12·n²) bytes (the chapter's model)",
                         lambda n: 2 * (4 * 768 * n + 12 * n * n))
GROUPED_MODEL = MemoryModel(
    "32 query heads sharing 8 key-value groups of width 128 in 2 bytes, scores in 4 bytes: "
    "2·128·n·2·(32 + 8) + 4·32·n² bytes", lambda n: ref.chunk_bytes(n, 32, 8, 128, 2, 4))
CHECKPOINT_MODEL = MemoryModel(
    "24 layers checkpointed every 5: 5 stored inputs of 2·4096·n bytes, plus 5 recomputed layers whose 32 heads' "
    "scores sit in 64 x 64 tiles of 4 bytes: 5·2·4096·n + 5·32·4·(64·⌈n/64⌉)² bytes",
    lambda n: 5 * 2 * 4096 * n + 5 * 32 * 4 * (64 * _ceil_div(n, 64)) ** 2)
NLOGN_MODEL = MemoryModel("16·n·⌈log₂ n⌉ bytes (0 for n = 1)", lambda n: 16 * n * (n - 1).bit_length())
PAGES_MODEL = MemoryModel("whole GiB pages for 6144 bytes a token: ⌈6144·n / 2³⁰⌉ pages",
                          lambda n: _ceil_div(6144 * n, 2**30))
TABLE_MODEL = MemoryModel(
    f"a table of 48 measured peaks, {MEASURED[0]} to {MEASURED[-1]} bytes with equal neighbours where the "
    "profiler rounded, then 4096 more bytes a token",
    lambda n: MEASURED[n - 1] if n <= len(MEASURED) else MEASURED[-1] + 4096 * (n - len(MEASURED)))
ONE_TOKEN_MODEL = MemoryModel("1 byte for n = 1, 10^40·n bytes from n = 2 on", lambda n: 1 if n == 1 else 10**40 * n)
HEAVY_START_MODEL = MemoryModel("10^50 + n bytes (a fixed cost far above the per-token one)", lambda n: 10**50 + n)

SEARCH_HINT = ("Find an n that does not fit by doubling, then bisect between the last n known to fit and the first "
               "known not to, with integer midpoints (lo + (hi - lo) // 2).")


class CountedCost:
    """The model as longest_fitting receives it: each call is checked (a Python
    int n >= 1) and counted against the exercise's bound. The first breach is
    kept, so a submission that catches the error it raises still fails, with
    this message."""

    def __init__(self, model, answer):
        self.model, self.answer = model, answer
        self.limit = ref.call_bound(answer)
        self.breach, self.asked = None, []  # the first breach; every n asked for, in order

    def _asked(self):
        shown = ", ".join(str(n) for n in self.asked[:12])
        return shown + (", ..." if len(self.asked) > 12 else "")

    def __call__(self, n):
        self.asked.append(n)
        if type(n) is not int:
            self._breach(f"called cost with n = {n!r} of type {type(n).__name__}: call cost with Python ints only. "
                         "A float midpoint such as int((lo + hi) / 2) is rounded for large n, and NumPy integers "
                         "overflow; lo + (hi - lo) // 2 stays an exact int.")
        if n < 1:
            self._breach(f"called cost({n}): cost is defined for n >= 1 only (a chunk of 0 tokens is not a chunk). "
                         "Start the search at n = 1, and raise ValueError when cost(1) is over the budget.")
        if len(self.asked) > self.limit:
            answer = f"the answer is {self.answer}" if self.answer else "nothing fits"
            self._breach(f"called cost more than {self.limit} times, where {answer}: the exercise allows "
                         f"2·⌈log₂(answer + 1)⌉ + 6 = {self.limit} calls, and it asked for n = "
                         f"{self._asked()}. {SEARCH_HINT}")
        return self.model(n)

    def _breach(self, message):
        if self.breach is None:
            self.breach = message
        raise GradingFailure(message)

    def check(self, what):
        if self.breach is not None:
            raise GradingFailure(f"{what} {self.breach}")

    def judged(self, what, attempt):
        """attempt(), with this cost's first breach, if any, reported instead of
        whatever the student's code made of the error it raised."""
        try:
            result = attempt()
        except GradingFailure:
            self.check(what)
            raise
        self.check(what)
        return result


def _fitting_call(longest_fitting, model, budget):
    """The student's answer for one budget, and the counted cost it was given."""
    expected = ref.longest_fitting(model, budget)
    cost = CountedCost(model, expected)
    what = f"longest_fitting(cost, budget={budget}) with cost(n) = {model.formula}"
    found = cost.judged(what, lambda: call(longest_fitting, cost, budget, what=what))
    return found, expected, what


def _check_fitting(longest_fitting, model, budget):
    found, expected, what = _fitting_call(longest_fitting, model, budget)
    if isinstance(found, int) and not isinstance(found, bool) and found != expected and 0 < found < 2**10000:
        if model(found) > budget:
            hint = f"n = {found} does not fit: cost({found}) = {model(found)} is over the budget."
        else:
            hint = f"n = {found} fits, but so does n = {expected}: cost({expected}) = {model(expected)}."
        hint += f" The largest n that fits is {expected}, since cost({expected + 1}) = {model(expected + 1)}."
    else:
        hint = "Return the largest n >= 1 whose cost fits the budget, as a Python int."
    expect_int(found, expected, what=what, hint=hint)


def _budgets_around(model, lengths):
    """Budgets exactly at cost(n), one below and one above, for each n (those
    below cost(1) left out: nothing fits there)."""
    budgets = set()
    for n in lengths:
        budgets |= {model(n) - 1, model(n), model(n) + 1}
    return sorted(b for b in budgets if b >= model(1))


SMALL_LENGTHS = list(range(1, 41)) + [63, 64, 65, 100, 1000, 4097, 65537, 10**6 + 3]


def check_fitting_models(longest_fitting):
    """Eight memory models, budgets at, just below and just above cost(n) for
    answers up to about 10^6 (and flat runs that reach about 10^7)."""
    for model in (BOOK_MODEL, GROUPED_MODEL, CHECKPOINT_MODEL, NLOGN_MODEL, TABLE_MODEL):
        for budget in _budgets_around(model, SMALL_LENGTHS):
            _check_fitting(longest_fitting, model, budget)
    for budget in range(1, 41):  # each answer the end of a flat run of about 174763 tokens
        _check_fitting(longest_fitting, PAGES_MODEL, budget)
    for budget in (1, 2, 10**40, 2 * 10**40 - 1, 2 * 10**40, 3 * 10**40):
        _check_fitting(longest_fitting, ONE_TOKEN_MODEL, budget)
    for budget in (10**50 + 1, 10**50 + 3, 10**50 + 1000):
        _check_fitting(longest_fitting, HEAVY_START_MODEL, budget)


HUGE_LENGTHS = [10**9 + 7, 10**12 + 39, 10**15 + 37, 10**18 + 3, 2**64 + 1, 10**20 + 39, 10**25 + 13, 10**30 + 57]


def check_fitting_huge(longest_fitting):
    """Answers up to about 10^30, budgets at and just below cost(n), and budgets of
    10^60 and 10^75: far beyond what a float holds exactly."""
    for model in (BOOK_MODEL, GROUPED_MODEL, CHECKPOINT_MODEL, NLOGN_MODEL, TABLE_MODEL):
        for n in HUGE_LENGTHS:
            for budget in (model(n), model(n) - 1):
                _check_fitting(longest_fitting, model, budget)
    for budget in (10**60, 10**75):
        _check_fitting(longest_fitting, BOOK_MODEL, budget)
    for budget in (10**19 + 1, 5 * 10**24 + 3, 6 * 10**24):  # answers up to about 10^30, on flat runs
        _check_fitting(longest_fitting, PAGES_MODEL, budget)


def check_fitting_too_small(longest_fitting):
    """A budget below cost(1), 0 included, raises ValueError naming the budget,
    within the calls allowed when nothing fits, and never asks for cost(0)."""
    for model, budget in [(BOOK_MODEL, 0), (BOOK_MODEL, BOOK_MODEL(1) - 1), (GROUPED_MODEL, 12345),
                          (CHECKPOINT_MODEL, CHECKPOINT_MODEL(1) - 1), (TABLE_MODEL, 8191), (PAGES_MODEL, 0),
                          (ONE_TOKEN_MODEL, 0)]:
        cost = CountedCost(model, 0)
        what = f"longest_fitting(cost, budget={budget}) with cost(n) = {model.formula}"
        reason = f"cost(1) = {model(1)} is over the budget"
        error = cost.judged(what, lambda: expect_value_error(longest_fitting, cost, budget, what=what,
                                                             reason=reason))
        if not any(f"{budget:{spec}}" in str(error) for spec in ("", ",", "_")):
            raise GradingFailure(f"{what} raised ValueError({str(error)!r}), whose message does not name the "
                                 f"budget: say which budget ({budget}) is too small for one token.")


# ------------------------------------------------ dilated and causal linear attention

def _check_output(fn, inputs, expected, what, hint):
    expect_close(call_unchanged(fn, *inputs, what=what), expected, what=what, hint=hint)


def _check_memory(fn, make_inputs, expected_fn, label, sizes=(1024, 4096)):
    """Peak traced memory must grow about linearly in n: from n to 4n, a linear
    algorithm's peak grows about 4x, one that builds an n x n array about 16x.
    The output must also be right at these sizes. A linear algorithm's peaks are
    a fraction of a MiB here, and the kernel's count of a call can exceed that by
    its granularity: growth is measured from no less than GRANULARITY_BYTES, and
    an n x n array (8 MiB of float64 at n = 1024, 16 MiB of booleans at n = 4096)
    is caught above it either way."""
    peaks = []
    for n in sizes:
        inputs = make_inputs(n)
        expected = expected_fn(*inputs)
        what = f"{label} for n={n}"
        found, peak = traced_peak(call, fn, *inputs, what=what)
        expect_close(found, expected, what=what)
        peaks.append(peak)
    growth = peaks[1] / max(peaks[0], GRANULARITY_BYTES)
    n_big = sizes[1]
    if peaks[1] >= n_big * n_big or growth > 8:
        raise GradingFailure(
            f"{label}: peak memory was {peaks[0] / 2**20:.2f} MiB for n={sizes[0]} and {peaks[1] / 2**20:.2f} MiB "
            f"for n={n_big} ({growth:.1f}x for 4x more tokens). Memory that grows like n^2 means an n x n array "
            "(scores, weights or a mask) is built somewhere; keep every intermediate O(n) in size.")


DILATED_HINT = ("Query i attends to the keys j = i + m·dilation with |m| <= radius that exist (0 <= j < n), itself "
                "included; scores scaled by 1/sqrt(d_k), softmax over those keys only.")


def _dilated_numpy_only(dilated_local_attention, rng):
    q, k, v = rng.normal(size=(9, 3)), rng.normal(size=(9, 3)), rng.normal(size=(9, 2))
    numpy_only(dilated_local_attention, q, k, v, 2, 2, what="dilated_local_attention for n=9, radius=2, dilation=2")


def check_dilated_output(dilated_local_attention):
    rng = _rng(1)
    for n, d_k, d_v, radius, dilation in [(1, 3, 2, 0, 1), (1, 3, 2, 4, 3), (5, 4, 4, 0, 2), (5, 4, 3, 1, 1),
                                          (16, 8, 2, 3, 2), (9, 2, 5, 8, 3), (7, 3, 3, 20, 1), (33, 5, 4, 2, 5),
                                          (20, 3, 2, 3, 19), (20, 3, 2, 2, 40), (31, 4, 3, 4, 4)]:
        q, k, v = rng.normal(size=(n, d_k)), rng.normal(size=(n, d_k)), rng.normal(size=(n, d_v))
        _check_output(dilated_local_attention, (q, k, v, radius, dilation),
                      ref.dilated_local_attention(q, k, v, radius, dilation),
                      f"dilated_local_attention for n={n}, d_k={d_k}, d_v={d_v}, radius={radius}, "
                      f"dilation={dilation}", DILATED_HINT)
    _dilated_numpy_only(dilated_local_attention, rng)


GLOBAL_HINT = ("The first n_global tokens are global: a global query attends to every key, and every other query "
               "attends to its dilated window and to all the global keys, a global key inside the window counted "
               "once. n_global may exceed n (then every token is global).")


def check_dilated_global(dilated_local_attention):
    rng = _rng(8)
    for n, d_k, d_v, radius, dilation, n_global in [(1, 3, 2, 0, 1, 1), (6, 4, 2, 0, 1, 1), (9, 3, 3, 1, 2, 2),
                                                    (16, 8, 2, 3, 2, 3), (12, 2, 4, 2, 3, 5), (7, 3, 3, 20, 1, 2),
                                                    (33, 5, 4, 2, 5, 4), (5, 3, 2, 1, 2, 9), (20, 3, 2, 3, 19, 1)]:
        q, k, v = rng.normal(size=(n, d_k)), rng.normal(size=(n, d_k)), rng.normal(size=(n, d_v))
        _check_output(dilated_local_attention, (q, k, v, radius, dilation, n_global),
                      ref.dilated_local_attention(q, k, v, radius, dilation, n_global),
                      f"dilated_local_attention for n={n}, d_k={d_k}, d_v={d_v}, radius={radius}, "
                      f"dilation={dilation}, n_global={n_global}", GLOBAL_HINT)
    _dilated_numpy_only(dilated_local_attention, rng)


EXTREME_HINT = ("Use a numerically stable softmax (subtract the maximum of each query's own scores), and leave the "
                "keys a query does not see out of its softmax (or give them -np.inf): a finite fill such as -1e4 "
                "takes the weight once the scores it should lose to are far below -1e4.")


def _extreme_cases(rng):
    """Scores from the thousands to about a million, of either sign, over several windows and
    global tokens; then queries and keys pointing apart, so that every score is far below -1e4."""
    cases = []
    for seed, (n, radius, dilation, n_global) in enumerate([(14, 2, 3, 0), (14, 2, 3, 0), (17, 1, 4, 2), (9, 3, 1, 0),
                                                           (12, 0, 1, 1), (20, 2, 7, 3)]):
        scale = (30.0, 300.0, 1000.0)[seed % 3]
        q, k = rng.normal(scale=scale, size=(n, 4)), rng.normal(scale=scale, size=(n, 4))
        cases.append((q, k, rng.normal(size=(n, 3)), radius, dilation, n_global, f"entries of size about {scale:g}"))
    for n, radius, dilation, n_global in [(15, 2, 3, 0), (11, 1, 2, 2)]:
        q, k = rng.uniform(200, 400, size=(n, 4)), -rng.uniform(200, 400, size=(n, 4))
        cases.append((q, k, rng.normal(size=(n, 3)), radius, dilation, n_global,
                      "positive queries and negative keys (every score far below -1e4)"))
    return cases


def check_dilated_extreme(dilated_local_attention):
    rng = _rng(2)
    for q, k, v, radius, dilation, n_global, label in _extreme_cases(rng):
        _check_output(dilated_local_attention, (q, k, v, radius, dilation, n_global),
                      ref.dilated_local_attention(q, k, v, radius, dilation, n_global),
                      f"dilated_local_attention for n={len(q)}, radius={radius}, dilation={dilation}, "
                      f"n_global={n_global} with {label}", EXTREME_HINT)
    _dilated_numpy_only(dilated_local_attention, rng)


def check_dilated_memory(dilated_local_attention):
    rng = _rng(3)

    def inputs(n):
        return rng.normal(size=(n, 8)), rng.normal(size=(n, 8)), rng.normal(size=(n, 4)), 4, 3, 2

    _check_memory(dilated_local_attention, inputs, ref.dilated_local_attention,
                  "dilated_local_attention with radius=4, dilation=3, n_global=2, d_k=8, d_v=4")
    _dilated_numpy_only(dilated_local_attention, rng)


CAUSAL_HINT = ("phi(x) = elu(x) + 1 elementwise; output_t = phi(q_t) @ Gamma_t / (phi(q_t) · z_t), where Gamma_t and "
               "z_t sum phi(k_j)^T v_j and phi(k_j)^T over j <= t only (token t included; vectors are rows); leading "
               "axes are batch axes, and "
               "the last chunk may be shorter than the others.")


def _causal_numpy_only(causal_linear_attention, rng):
    q, k, v = rng.normal(size=(2, 9, 3)), rng.normal(size=(2, 9, 3)), rng.normal(size=(2, 9, 2))
    numpy_only(causal_linear_attention, q, k, v, 4, what="causal_linear_attention for q of shape (2, 9, 3), chunk=4")


def check_causal_linear_output(causal_linear_attention):
    rng = _rng(4)
    for batch, n, d_k, d_v, chunk, scale in [((), 1, 3, 2, 1, 1.0), ((), 4, 1, 1, 2, 1.0), ((), 17, 8, 5, 4, 1.0),
                                             ((3,), 10, 4, 3, 3, 2.0), ((2, 2), 9, 6, 6, 9, 0.1),
                                             ((2,), 6, 3, 2, 50, 1.0), ((), 23, 4, 4, 1, 1.0),
                                             ((4,), 33, 5, 2, 8, 1.0)]:
        q, k, v = (rng.normal(scale=scale, size=batch + (n, d_k)), rng.normal(scale=scale, size=batch + (n, d_k)),
                   rng.normal(size=batch + (n, d_v)))
        _check_output(causal_linear_attention, (q, k, v, chunk), ref.causal_linear_attention(q, k, v, chunk),
                      f"causal_linear_attention for q of shape {q.shape}, v of shape {v.shape}, chunk={chunk}",
                      CAUSAL_HINT)
    _causal_numpy_only(causal_linear_attention, rng)


def check_causal_linear_extreme(causal_linear_attention):
    """Entries from -15 to 1000: elu(x) + 1 stays positive, so nothing divides by 0.
    (Below about -15, elu(x) + 1 computed as expm1(x) + 1 loses digits, so
    equally correct implementations would disagree.)"""
    rng = _rng(5)
    cases = {
        "strongly negative queries and keys (phi near e^-15)": (-rng.uniform(10, 15, size=(2, 12, 4)),
                                                               -rng.uniform(10, 15, size=(2, 12, 4))),
        "large positive queries and keys": (rng.uniform(100, 1000, size=(2, 12, 4)),
                                            rng.uniform(100, 1000, size=(2, 12, 4))),
        "mixed signs and sizes": (rng.normal(scale=10, size=(2, 12, 4)), rng.normal(scale=10, size=(2, 12, 4))),
    }
    for label, (q, k) in cases.items():
        v = rng.normal(size=(2, 12, 3))
        _check_output(causal_linear_attention, (q, k, v, 5), ref.causal_linear_attention(q, k, v, 5),
                      f"causal_linear_attention with {label}", CAUSAL_HINT)
    _causal_numpy_only(causal_linear_attention, rng)


def check_causal_linear_memory(causal_linear_attention):
    rng = _rng(6)

    def inputs(n):
        return rng.normal(size=(2, n, 8)), rng.normal(size=(2, n, 8)), rng.normal(size=(2, n, 4)), 64

    _check_memory(causal_linear_attention, inputs, ref.causal_linear_attention,
                  "causal_linear_attention with 2 sequences, d_k=8, d_v=4, chunk=64")
    _causal_numpy_only(causal_linear_attention, rng)


def check_causal_linear_chunked(causal_linear_attention):
    """The chunk is used: the tokens of a chunk meet in a chunk x chunk causal
    block, so the peak memory grows with the chunk. Token by token (the
    chapter's recurrence, or running sums) or as one n x n matrix, it does not.
    And one state (Gamma, z) is carried from chunk to chunk: running sums of every
    token (cumsum) take n x d_k x d_v values, which shows once d_k and d_v are wide."""
    rng = _rng(7)
    n, small, large = 2048, 8, 1024
    q, k, v = rng.normal(size=(n, 8)), rng.normal(size=(n, 8)), rng.normal(size=(n, 4))
    peaks = {}
    for chunk in (small, large):
        what = f"causal_linear_attention for n={n} with chunk={chunk}"
        found, peaks[chunk] = traced_peak(call, causal_linear_attention, q, k, v, chunk, what=what)
        expect_close(found, ref.causal_linear_attention(q, k, v, chunk), what=what, hint=CAUSAL_HINT)
    block = large * large * 8  # one float64 block of a chunk's size
    # Half a block (4 MiB): more than the kernel's count of either call may add to what it
    # allocates (GRANULARITY_BYTES), so that count decides the verdict neither way.
    if peaks[large] - peaks[small] < block // 2:
        raise GradingFailure(
            f"causal_linear_attention for n={n}: the peak memory was {peaks[small] / 2**20:.2f} MiB with "
            f"chunk={small} and {peaks[large] / 2**20:.2f} MiB with chunk={large}, so no {large} x {large} causal "
            f"block ({block / 2**20:.0f} MiB) was ever built. Process the tokens chunk by chunk as the exercise asks: "
            "within a chunk through a causal block of the chunk's size, and through the carried state (S, z) for the "
            "earlier chunks; not one token at a time, and not as one n x n matrix.")
    _check_one_state(causal_linear_attention, rng)
    _causal_numpy_only(causal_linear_attention, rng)


def _check_one_state(causal_linear_attention, rng):
    """A quarter of n x d_k x d_v float64 values (16 MiB) against the 4 MiB or so of a chunked
    computation (inputs' phi, the output, one chunk's blocks): four times apart both ways."""
    n, d, chunk = 2048, 64, 64
    q, k, v = (rng.normal(size=(n, d)) for _ in range(3))
    what = f"causal_linear_attention for n={n}, d_k = d_v = {d}, chunk={chunk}"
    found, peak = traced_peak(call, causal_linear_attention, q, k, v, chunk, what=what)
    expect_close(found, ref.causal_linear_attention(q, k, v, chunk), what=what, hint=CAUSAL_HINT)
    states = n * d * d * 8
    if peak >= states // 4:
        raise GradingFailure(
            f"{what}: the peak memory was {peak / 2**20:.1f} MiB, as much as a quarter of one state per token "
            f"(n x d_k x d_v float64 values, {states / 2**20:.0f} MiB), as running sums of every token take. Carry "
            "one state (Gamma, z) from chunk to chunk, and add each chunk's keys and values to it after the chunk.")
