"""In-graph masking: pick masking units covering a share (15% by default) of a sequence, corrupt them.

The contract: docs/design.md, "Masking schemes" and "Determinism". Pure TensorFlow on a batch
[B, L], usable in a tf.data map (no py_function, no Python loop over tokens); each row is masked
on its own stateless key (pmi_jax/randomness.py), so a mask is a function of the run seed, the
example and the epoch. Three steps: `scheme_units` (a unit index per token), `select_units`
(units in random order, each taken if it still fits the budget) and BERT's 80/10/10
corruption; steps 2 and 3 run as one XLA computation (`_mask_units`). informask instead draws
tokens with probabilities proportional to their rates (`_mask_weighted`; docs/design.md,
"InforMask"); random_span runs SpanBERT's span loop (`_mask_spans`; docs/design.md,
"random_span"). Why: docs/design.md, "Module notes", masking.py.
"""
from __future__ import annotations

import functools
from typing import Mapping

import numpy as np
import tensorflow as tf

import dataclasses
import math

from pmi_jax.config import MASK_RATE, MASK_RATE_UNIT, SCHEMES, TOKEN_RATE_SCHEMES, UNIT_SCHEMES, mask_rate_units
from pmi_jax.randomness import Stream, random_below, random_bits, random_uniform

# Schemes whose units come from the prepared corpus, and the unit feature each one reads.
PREPARED_UNIT_FEATURES = {scheme: f"units_{scheme}" for scheme in UNIT_SCHEMES}
# informask: every token's weight is at least this, so that a sequence whose tokens all have rate
# 0 still fills its budget (uniformly among them).
MIN_TOKEN_WEIGHT = 1e-6
_CERTAIN = 1.0 - 1e-9  # an inclusion probability this close to 1 is taken as 1

MASK_SHARE = 0.8
RANDOM_SHARE = 0.1
SPAN_P = 0.2
SPAN_MAX_WORDS = 10

# What happens to a unit: the codes of `_mask_units`.
_UNSELECTED, _MASKED, _RANDOMISED, _KEPT = range(4)


def masking_budget(num_tokens: tf.Tensor | int, rate_units: tf.Tensor | int = 1500) -> tf.Tensor | int:
    """floor(rate x `num_tokens`), at least 1, with the rate in basis points (`rate_units`: 1500 is
    15%; a Python int in, a Python int out; tensors per row).

    Floor rather than BERT's round: with round, 15% of 510 tokens (76.5) becomes 77 and the
    masked share could exceed 15%; floor keeps it at or under the rate for every sequence long
    enough that the one-token minimum does not win (7 tokens at 15%). Integer arithmetic (a
    product below 2^31 for sequences up to 65,535 tokens), so the budget never depends on
    float rounding.
    """
    if isinstance(num_tokens, int) and isinstance(rate_units, int):
        return max(1, rate_units * num_tokens // MASK_RATE_UNIT)
    num_tokens = tf.cast(num_tokens, tf.int32)
    return tf.maximum(1, tf.cast(rate_units, tf.int32) * num_tokens // MASK_RATE_UNIT)


@dataclasses.dataclass(frozen=True)
class MaskRate:
    """The masking rate of each example, from the step of the batch it lands in.

    constant: `start` at every step. linear: start + (end - start) * min(s, num_steps) / num_steps.
    cosine: end + (start - end) * (1 + cos(pi * min(s, num_steps) / num_steps)) / 2, flat at both
    ends. Ankner et al. (2023, "Dynamic Masking Rate Schedules for MLM Pretraining") decay
    30% -> 15% linearly over training; the cosine shape is ours, as is rounding each step's rate
    to the nearest basis point (so budgets stay integer arithmetic).

    The step of an example is `first_step + index // examples_per_step`, with `index` its
    place in this host's stream from the start of the run's reading; `pmi_jax.tasks` supplies
    it. A mask is thus a function of (seed, shard, position, epoch) and the step.
    """

    start: float = MASK_RATE
    end: float = MASK_RATE  # unused when constant
    schedule: str = "constant"
    num_steps: int = 1
    examples_per_step: int = 1  # this host's batch size

    def __post_init__(self):
        mask_rate_units(self.start)
        if self.schedule != "constant":
            mask_rate_units(self.end, "data.mask_rate_end")
            if self.num_steps < 1 or self.examples_per_step < 1:
                raise ValueError(f"{self}: num_steps and examples_per_step must be positive")

    @property
    def highest(self) -> float:
        return self.start if self.schedule == "constant" else max(self.start, self.end)

    def units_at(self, step_B: tf.Tensor) -> tf.Tensor:
        """int32 [B]: the rate in basis points at each step (int64 steps)."""
        start = mask_rate_units(self.start)
        if self.schedule == "constant":
            return tf.fill(tf.shape(step_B), start)
        end = mask_rate_units(self.end, "data.mask_rate_end")
        done_B = tf.cast(tf.minimum(tf.cast(step_B, tf.int64), self.num_steps), tf.float64) / self.num_steps
        if self.schedule == "linear":
            rate_B = start + (end - start) * done_B
        else:
            rate_B = end + (start - end) * 0.5 * (1.0 + tf.cos(math.pi * done_B))
        return tf.cast(tf.round(rate_B), tf.int32)

    def rate_at(self, step: int) -> float:
        """The rate at one step, as a share (for logs and tests)."""
        return int(self.units_at(tf.constant([step], tf.int64))[0]) / MASK_RATE_UNIT


def _segment(values_BxL: tf.Tensor, ids_BxL: tf.Tensor, op) -> tf.Tensor:
    """Per-row segment reduction: [B, L] values into L segments per row; ids in [0, L]
    (id L is a spare segment for entries that belong nowhere, dropped from the result)."""
    batch, length = tf.shape(ids_BxL)[0], ids_BxL.shape[1]
    flat_ids = ids_BxL + (length + 1) * tf.range(batch)[:, None]
    out = op(values_BxL, flat_ids, batch * (length + 1))
    return tf.reshape(out, [batch, length + 1])[:, :length]


@dataclasses.dataclass(frozen=True)
class NeighbourVisibility:
    """Of a set of masks: how many selected tokens have both neighbours unselected."""

    isolated: int  # selected tokens whose two neighbours are both unselected (shown as they are)
    selected: int  # selected tokens
    share: float  # isolated / selected
    half_width: float  # of its 95% interval: 1.96 standard errors, the sequences as clusters


def neighbour_visibility(weights_NxL) -> NeighbourVisibility:
    """The share of selected tokens whose left and right neighbours are both unselected, so the
    model sees both in their original form (weights 0; [CLS], [SEP] and padding count as
    unselected, as they are never masked).

    Why: a token predicted from its two neighbours is easy when they are visible (a word's
    continuation piece, a collocation's middle) and hard when they are masked with it; the
    share measures how much of a scheme's loss is the easy kind. The interval is the ratio
    estimator's over sequences (the delta method with each sequence a cluster), since the
    tokens of one sequence are not independent.
    """
    selected_NxL = np.asarray(weights_NxL) > 0
    padded = np.pad(selected_NxL, ((0, 0), (1, 1)))
    isolated_NxL = selected_NxL & ~padded[:, :-2] & ~padded[:, 2:]
    a_N, m_N = isolated_NxL.sum(axis=1).astype(np.float64), selected_NxL.sum(axis=1).astype(np.float64)
    isolated, selected = int(a_N.sum()), int(m_N.sum())
    share = isolated / selected if selected else float("nan")
    n = len(m_N)
    half = float("nan")
    if selected and n > 1:
        se = math.sqrt(n / (n - 1) * float(((a_N - share * m_N) ** 2).sum())) / selected
        half = 1.96 * se
    return NeighbourVisibility(isolated, selected, share, half)


def token_units(word_ids_BxL: tf.Tensor) -> tf.Tensor:
    """random_token: every non-special token is a unit of its own, numbered 0, 1, 2, ..."""
    is_token = word_ids_BxL >= 0
    return tf.where(is_token, tf.cumsum(tf.cast(is_token, tf.int32), axis=-1) - 1, -1)


def span_lengths(key_Bx2: tf.Tensor, length: int, p: float = SPAN_P, max_words: int = SPAN_MAX_WORDS,
                 offset: tf.Tensor | int = 0) -> tf.Tensor:
    """int32 [B, length]: span lengths in words ~ Geometric(p) truncated to [1, max_words]
    (the `SPAN_LENGTHS` stream at positions offset, offset + 1, ...).

    SpanBERT's law (Joshi et al. 2020, §3.1, and its code): P(k) ∝ p (1 - p)^(k - 1) for
    k = 1..max_words, renormalised, so the mean is 3.80 words for p = 0.2 and P(10) = 3.0%.
    Clipping an untruncated geometric at `max_words` instead would pile its whole tail
    (13.4%) onto 10 and raise the mean to 4.46.

    Inverse CDF of the truncated law: with q = 1 - p and U ~ U[0, 1),
    V = 1 - U (1 - q^max_words) lies in (q^max_words, 1], and floor(log V / log q) + 1 is in
    [1, max_words] with exactly the truncated probabilities. The final clip only guards
    against float32 rounding at the top edge.
    """
    q = 1.0 - p
    v = 1.0 - random_uniform(key_Bx2, Stream.SPAN_LENGTHS, length, offset) * (1.0 - q ** max_words)
    lengths = tf.floor(tf.math.log(v) / tf.math.log(q)) + 1.0
    return tf.cast(tf.clip_by_value(lengths, 1.0, float(max_words)), tf.int32)


def span_budget(num_tokens: tf.Tensor, rate_units: tf.Tensor | int = 1500) -> tf.Tensor:
    """random_span's budget: ceil(rate x `num_tokens`) (SpanBERT's masking.py:
    `math.ceil(sent_length * mask_ratio)`), in integer arithmetic like `masking_budget`."""
    num_tokens = tf.cast(num_tokens, tf.int32)
    return (tf.cast(rate_units, tf.int32) * num_tokens + MASK_RATE_UNIT - 1) // MASK_RATE_UNIT


def scheme_budget(scheme: str, num_tokens: tf.Tensor | int, rate_units: tf.Tensor | int = 1500) -> tf.Tensor | int:
    """The tokens `scheme` selects of `num_tokens` non-special ones: ceil for random_span
    (SpanBERT's, `span_budget`), floor for every other scheme (`masking_budget`)."""
    if scheme != "random_span":
        return masking_budget(num_tokens, rate_units)
    budget = span_budget(num_tokens, rate_units)
    return int(budget) if isinstance(num_tokens, int) else budget


def _last_word_of_document(word_ids_BxL: tf.Tensor) -> tf.Tensor:
    """int32 [B, L]: on each content token, the word id of its document's last word (documents
    are the runs of content tokens between special tokens); -1 elsewhere."""
    length = word_ids_BxL.shape[1]
    content = word_ids_BxL >= 0
    follows_special = tf.concat([tf.ones_like(content[:, :1]), ~content[:, :-1]], axis=-1)
    doc_BxL = tf.cumsum(tf.cast(content & follows_special, tf.int32), axis=-1) - 1
    last_D = _segment(word_ids_BxL, tf.where(content, doc_BxL, length), tf.math.unsorted_segment_max)
    return tf.where(content, tf.gather(last_D, tf.maximum(doc_BxL, 0), batch_dims=1), -1)


def span_selection(word_ids_BxL: tf.Tensor, budget_B: tf.Tensor, key_Bx2: tf.Tensor) -> tf.Tensor:
    """bool [B, L]: the tokens random_span selects, SpanBERT's sampling loop draw by draw.

    SpanBERT's `PairWithSpanMaskingScheme.mask` (pretraining/fairseq/data/masking.py) on a packed
    sequence instead of its one-document block (docs/design.md, "random_span"): until `budget_B` tokens are
    selected, draw t takes a span length k ~ `span_lengths` (the `SPAN_LENGTHS` stream at t) and
    an anchor uniform over the row's content tokens (`SPAN_ANCHORS` at t); an anchor already
    selected is rejected (the draw is spent); else the span is the anchor's word and the words
    after it, k words in all, cut at the document's end, and its tokens not yet selected are
    added in order until the budget is full (so the last span is cut, even inside a word). A
    span may run into earlier ones: their tokens count among its k words but not against the
    budget. Word = word id (WordPiece's "##" continuation in SpanBERT's code: the same words).

    One draw per row and loop step, on [B] vectors; the loop ends when every row is full.
    """
    length = word_ids_BxL.shape[1]
    content = word_ids_BxL >= 0
    num_B = tf.reduce_sum(tf.cast(content, tf.int32), axis=-1)
    rank_BxL = tf.cumsum(tf.cast(content, tf.int32), axis=-1) - 1
    position_BxL = tf.broadcast_to(tf.range(length)[None, :], tf.shape(word_ids_BxL))
    position_of_rank_BxL = _segment(position_BxL, tf.where(content, rank_BxL, length), tf.math.unsorted_segment_max)
    last_word_BxL = _last_word_of_document(word_ids_BxL)

    def at(values_BxL, index_B):
        return tf.gather(values_BxL, index_B[:, None], batch_dims=1)[:, 0]

    def draw(t, selected_BxL, left_B):
        words_B = span_lengths(key_Bx2, 1, offset=t)[:, 0]
        rank_B = random_below(key_Bx2, Stream.SPAN_ANCHORS, 1, tf.maximum(num_B, 1), offset=t)[:, 0]
        anchor_B = at(position_of_rank_BxL, rank_B)
        first_B = at(word_ids_BxL, anchor_B)
        last_B = tf.minimum(first_B + words_B - 1, at(last_word_BxL, anchor_B))
        live_B = (left_B > 0) & ~at(selected_BxL, anchor_B)
        new_BxL = (live_B[:, None] & ~selected_BxL & (word_ids_BxL >= first_B[:, None])
                   & (word_ids_BxL <= last_B[:, None]))
        take_BxL = new_BxL & (tf.cumsum(tf.cast(new_BxL, tf.int32), axis=-1) <= left_B[:, None])
        return t + 1, selected_BxL | take_BxL, left_B - tf.reduce_sum(tf.cast(take_BxL, tf.int32), axis=-1)

    left_B = tf.minimum(tf.cast(budget_B, tf.int32), num_B)
    _, selected_BxL, _ = tf.while_loop(lambda t, selected, left_B: tf.reduce_any(left_B > 0), draw,
                                       (tf.constant(0), tf.zeros_like(content), left_B))
    return selected_BxL


def merged_spans(selected_BxL: tf.Tensor) -> tf.Tensor:
    """int32 [B, L]: the index of each selected token's merged span (a maximal run of selected
    tokens: SpanBERT's `merge_intervals` joins overlapping and adjacent spans), -1 elsewhere."""
    starts_BxL = selected_BxL & ~tf.concat([tf.zeros_like(selected_BxL[:, :1]), selected_BxL[:, :-1]], axis=-1)
    return tf.where(selected_BxL, tf.cumsum(tf.cast(starts_BxL, tf.int32), axis=-1) - 1, -1)


def span_codes(selected_BxL: tf.Tensor, key_Bx2: tf.Tensor) -> tf.Tensor:
    """int32 [B, L]: each token's code: one fate per merged span (SpanBERT's
    `--replacement-method span`: span s draws the `UNIT_FATE` stream at s; < 0.8 all [MASK],
    < 0.9 all random, else unchanged), `_UNSELECTED` off the spans."""
    span_BxL = merged_spans(selected_BxL)
    fate_BxL = tf.gather(random_uniform(key_Bx2, Stream.UNIT_FATE, selected_BxL.shape[1]), tf.maximum(span_BxL, 0),
                         batch_dims=1)
    code_BxL = tf.where(fate_BxL < MASK_SHARE + RANDOM_SHARE, _RANDOMISED, _KEPT)
    return tf.where(selected_BxL, tf.where(fate_BxL < MASK_SHARE, _MASKED, code_BxL), _UNSELECTED)


def span_unit_ids(word_ids_BxL: tf.Tensor, selected_BxL: tf.Tensor) -> tf.Tensor:
    """int32 [B, L]: random_span's units for `data dump|show`: each merged span is one unit, every
    unselected content token one of its own, numbered 0, 1, ... in order; -1 on special tokens."""
    content = word_ids_BxL >= 0
    previous = tf.concat([tf.zeros_like(selected_BxL[:, :1]), selected_BxL[:, :-1]], axis=-1)
    opens_BxL = content & (~selected_BxL | ~previous)
    return tf.where(content, tf.cumsum(tf.cast(opens_BxL, tf.int32), axis=-1) - 1, -1)


def unigram_draws(key_Bx2: tf.Tensor, length: int, cumulative_V: tf.Tensor) -> tf.Tensor:
    """int32 [B, length]: ids drawn from the corpus's unigram law, P(v) = count_v / total
    (`cumulative_V`: int64 inclusive cumulative counts), as SpanBERT's `np.random.choice(tokens)`
    over the corpus's tokens. Two 32-bit draws of `REPLACEMENT_IDS` per position (2i, 2i + 1)
    make a 53-bit uniform r in [0, total); the id is the first v with cumulative_v > r, found by
    binary search (a fixed number of gathers, which XLA compiles)."""
    bits_BxLx2 = tf.reshape(random_bits(key_Bx2, Stream.REPLACEMENT_IDS, 2 * length), [-1, length, 2])
    high = tf.cast(bits_BxLx2[..., 0], tf.float64)
    low = tf.cast(tf.bitwise.right_shift(bits_BxLx2[..., 1], 11), tf.float64)
    total = cumulative_V[-1]
    r_BxL = tf.cast(tf.floor((high * 2.0 ** 21 + low) * 2.0 ** -53 * tf.cast(total, tf.float64)), tf.int64)
    r_BxL = tf.minimum(r_BxL, total - 1)
    vocab = int(cumulative_V.shape[0])
    lo_BxL, hi_BxL = tf.zeros_like(r_BxL), tf.fill(tf.shape(r_BxL), tf.constant(vocab - 1, tf.int64))
    for _ in range(max(1, (vocab - 1).bit_length())):
        mid_BxL = (lo_BxL + hi_BxL) // 2
        below = tf.gather(cumulative_V, mid_BxL) <= r_BxL
        lo_BxL, hi_BxL = tf.where(below, mid_BxL + 1, lo_BxL), tf.where(below, hi_BxL, mid_BxL)
    return tf.cast(lo_BxL, tf.int32)


def _mask_spans(
    input_ids_BxL: tf.Tensor,
    word_ids_BxL: tf.Tensor,
    key_Bx2: tf.Tensor,
    cumulative_V: tf.Tensor,
    mask_id: tf.Tensor,
    rate_units_B: tf.Tensor,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """random_span's (corrupted ids, weights, units) [B, L]: `span_selection` of
    `span_budget` tokens, `span_codes`, random ids from `unigram_draws`."""
    budget_B = span_budget(tf.reduce_sum(tf.cast(word_ids_BxL >= 0, tf.int32), axis=-1), rate_units_B)
    selected_BxL = span_selection(word_ids_BxL, budget_B, key_Bx2)
    code_BxL = span_codes(selected_BxL, key_Bx2)
    replacements_BxL = unigram_draws(key_Bx2, input_ids_BxL.shape[1], cumulative_V)
    corrupted_BxL, weights_BxL = _corrupt(input_ids_BxL, code_BxL, replacements_BxL, mask_id)
    return corrupted_BxL, weights_BxL, span_unit_ids(word_ids_BxL, selected_BxL)


@functools.cache
def _compiled_mask_spans(length: int, vocab: int):
    """`_mask_spans` for [B, length] batches, compiled by XLA like `_compiled_mask_units`."""
    ids = tf.TensorSpec([None, length], tf.int32)
    return tf.function(_mask_spans, jit_compile=True, input_signature=[
        ids, ids, tf.TensorSpec([None, 2], tf.uint32), tf.TensorSpec([vocab], tf.int64),
        tf.TensorSpec([], tf.int32), tf.TensorSpec([None], tf.int32),
    ])


def scheme_units(scheme: str, features: Mapping[str, tf.Tensor], key_Bx2: tf.Tensor) -> tf.Tensor:
    """int32 [B, L]: the unit index per token that `scheme` masks by (-1 on special tokens).
    random_span has none before its selection (`span_unit_ids`)."""
    word_ids = tf.cast(features["word_ids"], tf.int32)
    if scheme == "random_token" or scheme in TOKEN_RATE_SCHEMES:
        return token_units(word_ids)
    if scheme == "whole_word":
        return word_ids
    if scheme in PREPARED_UNIT_FEATURES:
        return tf.cast(features[PREPARED_UNIT_FEATURES[scheme]], tf.int32)
    if scheme == "random_span":
        raise ValueError("random_span's units come out of its selection (span_unit_ids, mask_batch)")
    # Internal guard: callers validate names with config.check_scheme, the one user-facing check.
    raise ValueError(f"scheme {scheme!r} is not in config.SCHEMES")


def greedy_fill(sizes_BxN: tf.Tensor, budget_B: tf.Tensor) -> tf.Tensor:
    """bool [B, N]: which of N units per row, scanned in order, the greedy fill takes.

    Greedy: take a unit (size > 0) if its size fits what is left of the budget, else skip it
    and go on. The scan is literal, one step per unit on [B] vectors: N is small (a window
    of draws), and under XLA a loop step costs well under a microsecond, less than the
    vectorised alternatives (rounds of cumulative sums, or the N steps unrolled).
    """
    sizes_NxB = tf.transpose(tf.cast(sizes_BxN, tf.int32))
    num_units = tf.shape(sizes_NxB)[0]

    def step(n, left_B, taken_N):
        size_B = sizes_NxB[n]
        take_B = (size_B > 0) & (size_B <= left_B)
        return n + 1, left_B - tf.where(take_B, size_B, 0), taken_N.write(n, take_B)

    _, _, taken_N = tf.while_loop(
        lambda n, left_B, taken_N: n < num_units,
        step,
        (tf.constant(0), tf.cast(budget_B, tf.int32), tf.TensorArray(tf.bool, size=num_units)),
    )
    return tf.transpose(taken_N.stack())


def _unit_codes(sizes_BxU: tf.Tensor, budget_B: tf.Tensor, key_Bx2: tf.Tensor, window: int) -> tf.Tensor:
    """int32 [B, U]: per unit slot (U = L + 1, see `_unit_slots`), `_UNSELECTED`, or how the
    selected unit is corrupted.

    The random order: draw unit slots independently and uniformly from [0, n) (n = the
    row's highest unit slot + 1; draw t is the `UNIT_ORDER` stream at position t) and keep each
    slot's first draw. The first occurrences of i.i.d. uniform draws come in a uniformly
    random order (exactly so, up to `random_below`'s bias of n / 2^32), and the scan order
    comes out directly, with no sort: sorting random priorities (top_k of the next units, the
    earlier method) cost a third of the masking in TensorFlow, and XLA's CPU sort is slower.
    Repeated draws and unused slots count as units of size 0, which the fill skips.

    The draws go `window` at a time: dedup (a scatter-min of the draw index by slot, then
    "is this the slot's first draw?"), `greedy_fill` of the window's new units into what is
    left of the budget (so the budget is never exceeded), and, for every unit taken at draw
    t, its fate: one draw u ~ U(0, 1) (the `UNIT_FATE` stream at t: one independent draw per
    unit, as a unit is taken once): u < 0.8 -> all [MASK], u < 0.9 -> all random ids, else
    unchanged. A row is done when nothing is left of its budget or no undrawn unit fits what
    is left; until then the next window continues the same draws, so the windows are
    exactly one greedy scan of the order, whatever the window. With one more draw than the
    largest budget, one window settled every row of the demo corpus's `pmi` and `frequency`
    batches (units of 1.7 tokens on average) in our measurements; one-token units
    (random_token, most words) take two, as ~8% of the draws repeat a slot.
    """
    batch, slots = tf.shape(sizes_BxU)[0], sizes_BxU.shape[1]
    if slots > 1 << 16:
        raise ValueError(f"sequence length {slots - 1}: masking supports up to 65,535 tokens")
    sizes_BxU = tf.cast(sizes_BxU, tf.int32)
    real_BxU = sizes_BxU > 0
    num_slots_B = tf.reduce_max(tf.where(real_BxU, tf.range(1, slots + 1)[None, :], 0), axis=-1)
    row_base_Bx1 = slots * tf.range(batch)[:, None]  # row offsets into the flattened tables
    sizes_R = tf.reshape(sizes_BxU, [-1])
    never = tf.int32.max

    def draw_window(w, first_R, code_R, left_B, done_B):
        draw_BxD = tf.broadcast_to(w * window + tf.range(window)[None, :], [batch, window])  # draw indices t
        slot_BxD = random_below(key_Bx2, Stream.UNIT_ORDER, window, num_slots_B, offset=w * window)
        index_Nx1 = tf.reshape(row_base_Bx1 + slot_BxD, [-1, 1])
        first_R = tf.tensor_scatter_nd_min(first_R, index_Nx1, tf.reshape(draw_BxD, [-1]))
        is_first_BxD = tf.reshape(tf.gather_nd(first_R, index_Nx1), [batch, window]) == draw_BxD
        sizes_BxD = tf.reshape(tf.gather_nd(sizes_R, index_Nx1), [batch, window])
        sizes_BxD = tf.where(is_first_BxD & ~done_B[:, None], sizes_BxD, 0)
        taken_BxD = greedy_fill(sizes_BxD, left_B)
        left_B -= tf.reduce_sum(tf.where(taken_BxD, sizes_BxD, 0), axis=-1)
        fate_BxD = random_uniform(key_Bx2, Stream.UNIT_FATE, window, offset=w * window)
        code_BxD = tf.where(fate_BxD < MASK_SHARE + RANDOM_SHARE, _RANDOMISED, _KEPT)
        code_BxD = tf.where(taken_BxD, tf.where(fate_BxD < MASK_SHARE, _MASKED, code_BxD), _UNSELECTED)
        code_R = tf.tensor_scatter_nd_max(code_R, index_Nx1, tf.reshape(code_BxD, [-1]))
        undrawn_BxU = tf.reshape(first_R, [batch, slots]) == never
        can_fit_B = tf.reduce_any(real_BxU & undrawn_BxU & (sizes_BxU <= left_B[:, None]), axis=-1)
        return w + 1, first_R, code_R, left_B, done_B | (left_B == 0) | ~can_fit_B

    state = draw_window(tf.constant(0), tf.fill(tf.shape(sizes_R), never), tf.zeros_like(sizes_R),
                        tf.cast(budget_B, tf.int32), tf.zeros([batch], tf.bool))
    # Usually every row is done after the first window (see above): the loop then runs no step.
    _, _, code_R, _, _ = tf.while_loop(lambda w, first_R, code_R, left_B, done_B: tf.reduce_any(~done_B),
                                       draw_window, state)
    return tf.reshape(code_R, [batch, slots])


def _unit_slots(unit_ids_BxL: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(index_BxL, sizes_BxU): each token's unit as an index into a flattened [B, U] table,
    U = L + 1 slots per row (slot L, of size 0, for tokens in no unit), and the unit sizes.

    Flat indices into one-dimensional tables: XLA's CPU scatters run 2-4x faster on them
    than on [row, slot] index pairs (tensor_scatter_nd_* on [B, U]).
    """
    batch, length = tf.shape(unit_ids_BxL)[0], unit_ids_BxL.shape[1]
    in_unit = unit_ids_BxL >= 0
    index_BxL = tf.where(in_unit, unit_ids_BxL, length) + (length + 1) * tf.range(batch)[:, None]
    sizes_R = tf.math.unsorted_segment_sum(tf.cast(in_unit, tf.int32), index_BxL, batch * (length + 1))
    sizes_BxU = tf.reshape(sizes_R, [batch, length + 1])
    return index_BxL, tf.where(tf.range(length + 1)[None, :] < length, sizes_BxU, 0)


def _token_codes(unit_ids_BxL: tf.Tensor, budget_B: tf.Tensor, key_Bx2: tf.Tensor, window: int | None) -> tf.Tensor:
    """int32 [B, L]: each token's `_unit_codes` code, the fate of its unit (`_UNSELECTED` for
    tokens in no unit). window: draws per step, by default one more than the largest budget at
    15% (any window gives the same codes, `_unit_codes`)."""
    index_BxL, sizes_BxU = _unit_slots(unit_ids_BxL)
    code_BxU = _unit_codes(sizes_BxU, budget_B, key_Bx2, window or masking_budget(unit_ids_BxL.shape[1]) + 1)
    return tf.gather(tf.reshape(code_BxU, [-1]), index_BxL)


def select_units(
    unit_ids_BxL: tf.Tensor, budget_B: tf.Tensor, key_Bx2: tf.Tensor, window: int | None = None
) -> tf.Tensor:
    """bool [B, L]: the tokens of the units a greedy fill takes in a uniformly random order.

    Unit ids are indices in [0, L) (at most one unit per token); -1 marks tokens in no unit.
    The order and the fill are `_unit_codes`'.
    """
    return _token_codes(unit_ids_BxL, budget_B, key_Bx2, window) != _UNSELECTED


def _mask_units(
    input_ids_BxL: tf.Tensor,
    unit_ids_BxL: tf.Tensor,
    word_ids_BxL: tf.Tensor,
    key_Bx2: tf.Tensor,
    regular_ids_V: tf.Tensor,
    mask_id: tf.Tensor,
    rate_units_B: tf.Tensor,
    window: int,
) -> tuple[tf.Tensor, tf.Tensor]:
    """(corrupted ids, weights) [B, L]: select units and corrupt them (`_unit_codes`); the
    weights are 1.0 on the selected tokens, 0.0 elsewhere. `rate_units_B`: each row's rate in
    basis points.

    Each token of a randomly replaced unit draws its own id from `regular_ids_V` (the
    `REPLACEMENT_IDS` stream, by position).
    """
    budget_B = masking_budget(tf.reduce_sum(tf.cast(word_ids_BxL >= 0, tf.int32), axis=-1), rate_units_B)
    code_BxL = _token_codes(unit_ids_BxL, budget_B, key_Bx2, window)
    return _corrupt(input_ids_BxL, code_BxL, uniform_draws(key_Bx2, input_ids_BxL.shape[1], regular_ids_V), mask_id)


def uniform_draws(key_Bx2: tf.Tensor, length: int, regular_ids_V: tf.Tensor) -> tf.Tensor:
    """int32 [B, length]: ids drawn uniformly from `regular_ids_V` (the `REPLACEMENT_IDS` stream,
    by position): every scheme's random replacements but random_span's (`unigram_draws`)."""
    return tf.gather(regular_ids_V, random_below(key_Bx2, Stream.REPLACEMENT_IDS, length, int(regular_ids_V.shape[0])))


def _corrupt(input_ids_BxL, code_BxL, replacements_BxL, mask_id) -> tuple[tf.Tensor, tf.Tensor]:
    """(corrupted ids, weights) from each token's code; a randomised token takes its position's
    replacement id (each token its own draw)."""
    corrupted_BxL = tf.where(code_BxL == _RANDOMISED, replacements_BxL, input_ids_BxL)
    corrupted_BxL = tf.where(code_BxL == _MASKED, mask_id, corrupted_BxL)
    return corrupted_BxL, tf.cast(code_BxL != _UNSELECTED, tf.float32)


def inclusion_probabilities(weights_BxL: tf.Tensor, budget_B: tf.Tensor) -> tf.Tensor:
    """float64 [B, L]: pi_i = min(1, c w_i) with c per row such that the pi sum to the budget.

    The inclusion probabilities of a sample of `budget` positions proportional to weight
    (w = 0: never). A weight too large for its share to stay below 1 is capped at 1 (certain)
    and the rest of the budget shared among the others in proportion, repeated until no new
    weight reaches 1 (at most L rounds; one or two in practice). A row whose positive weights
    are fewer than its budget takes them all.
    """
    w_BxL = tf.cast(weights_BxL, tf.float64)
    real_BxL = w_BxL > 0
    budget_B1 = tf.cast(budget_B, tf.float64)[:, None]

    def scale(certain_BxL):
        free_B1 = tf.reduce_sum(tf.where(certain_BxL, tf.zeros_like(w_BxL), w_BxL), axis=-1, keepdims=True)
        left_B1 = budget_B1 - tf.reduce_sum(tf.cast(certain_BxL, tf.float64), axis=-1, keepdims=True)
        return tf.math.divide_no_nan(tf.maximum(left_B1, tf.zeros_like(left_B1)), free_B1)

    def widen(certain_BxL):
        return certain_BxL | (real_BxL & (scale(certain_BxL) * w_BxL >= _CERTAIN))

    first = tf.zeros_like(real_BxL)
    certain_BxL, _ = tf.while_loop(lambda new, old: tf.reduce_any(new != old),
                                   lambda new, old: (widen(new), new), (widen(first), first))
    return tf.where(certain_BxL, tf.ones_like(w_BxL), scale(certain_BxL) * w_BxL)


def systematic_sample(pi_BxL: tf.Tensor, key_Bx2: tf.Tensor) -> tf.Tensor:
    """bool [B, L]: position i taken with probability exactly pi_i, round(sum pi) positions in all.

    Randomised systematic sampling (Madow 1949; Hartley and Rao 1962): positions with pi = 1
    are taken; the others are laid end to end in a random order (`WEIGHTED_ORDER`), each an
    interval of length pi_i, and one random start u in [0, 1) (`WEIGHTED_START`) takes every
    position whose interval holds a point u + m, m an integer. An interval shorter than 1
    holds at most one such point, and holds one with probability its length; the intervals
    fill [0, sum pi), which holds exactly sum pi points. The random order keeps the joint
    choice free of the positions' order (in document order, neighbours would never be taken
    together).

    The intervals' ends are float64 sums rescaled to end exactly at the integer
    round(sum pi): the count never exceeds it, and falls one short only if float rounding
    left the last end below it and u lands in that gap (a chance below 1e-12).
    """
    length = pi_BxL.shape[1]
    certain_BxL = pi_BxL >= 1.0
    pi_BxL = tf.cast(pi_BxL, tf.float64)
    pi_BxL = tf.where(certain_BxL, tf.zeros_like(pi_BxL), pi_BxL)
    order_BxL = tf.argsort(tf.cast(random_bits(key_Bx2, Stream.WEIGHTED_ORDER, length), tf.int64), axis=-1,
                           stable=True)
    pi_ordered = tf.gather(pi_BxL, order_BxL, batch_dims=1)
    ends = tf.cumsum(pi_ordered, axis=-1)
    total_B1 = ends[:, -1:]
    target_B1 = tf.round(total_B1)
    ends = tf.minimum(ends * tf.math.divide_no_nan(target_B1, total_B1), target_B1)
    starts = tf.concat([tf.zeros_like(ends[:, :1]), ends[:, :-1]], axis=-1)
    start_B1 = tf.cast(random_bits(key_Bx2, Stream.WEIGHTED_START, 1), tf.float64) * 2.0 ** -32
    taken_ordered = (tf.floor(ends + start_B1) > tf.floor(starts + start_B1)) & (pi_ordered > 0)
    taken_BxL = _segment(tf.cast(taken_ordered, tf.int32), tf.cast(order_BxL, tf.int32), tf.math.unsorted_segment_max)
    return certain_BxL | (taken_BxL > 0)


def weighted_codes(weights_BxL: tf.Tensor, budget_B: tf.Tensor, key_Bx2: tf.Tensor) -> tf.Tensor:
    """int32 [B, L]: `_unit_codes`' codes per token for a sample of `budget` tokens with
    inclusion probabilities proportional to `weights_BxL` (`inclusion_probabilities`,
    `systematic_sample`); each selected token's fate is one draw of the `UNIT_FATE` stream at
    its position: < 0.8 [MASK], < 0.9 a random id, else unchanged."""
    taken_BxL = systematic_sample(inclusion_probabilities(weights_BxL, budget_B), key_Bx2)
    fate_BxL = random_uniform(key_Bx2, Stream.UNIT_FATE, weights_BxL.shape[1])
    code_BxL = tf.where(fate_BxL < MASK_SHARE, _MASKED, tf.where(fate_BxL < MASK_SHARE + RANDOM_SHARE, _RANDOMISED, _KEPT))
    return tf.where(taken_BxL, code_BxL, _UNSELECTED)


def _mask_weighted(
    input_ids_BxL: tf.Tensor,
    word_ids_BxL: tf.Tensor,
    rates_V: tf.Tensor,
    key_Bx2: tf.Tensor,
    regular_ids_V: tf.Tensor,
    mask_id: tf.Tensor,
    rate_units_B: tf.Tensor,
) -> tuple[tf.Tensor, tf.Tensor]:
    """informask's (corrupted ids, weights) [B, L]: the budget drawn with each non-special
    token's inclusion probability proportional to its id's rate (at least `MIN_TOKEN_WEIGHT`)."""
    content_BxL = word_ids_BxL >= 0
    budget_B = masking_budget(tf.reduce_sum(tf.cast(content_BxL, tf.int32), axis=-1), rate_units_B)
    rates_BxL = tf.maximum(tf.gather(rates_V, input_ids_BxL), tf.constant(MIN_TOKEN_WEIGHT, tf.float64))
    code_BxL = weighted_codes(tf.where(content_BxL, rates_BxL, tf.zeros_like(rates_BxL)), budget_B, key_Bx2)
    return _corrupt(input_ids_BxL, code_BxL, uniform_draws(key_Bx2, input_ids_BxL.shape[1], regular_ids_V), mask_id)


@functools.cache
def _compiled_mask_weighted(length: int, vocab: int, rates: int):
    """`_mask_weighted` for [B, length] batches, compiled by XLA like `_compiled_mask_units`."""
    ids = tf.TensorSpec([None, length], tf.int32)
    return tf.function(_mask_weighted, jit_compile=True, input_signature=[
        ids, ids, tf.TensorSpec([rates], tf.float64), tf.TensorSpec([None, 2], tf.uint32),
        tf.TensorSpec([vocab], tf.int32), tf.TensorSpec([], tf.int32), tf.TensorSpec([None], tf.int32),
    ])


@functools.cache
def _compiled_mask_units(length: int, vocab: int, window: int):
    """`_mask_units` for [B, length] batches, compiled by XLA (once per batch size B, ~1-2 s).

    Traced once per (length, vocab, window): the batch size stays open, so a final partial
    batch costs one more compilation, not a retrace warning.
    """
    ids = tf.TensorSpec([None, length], tf.int32)
    return tf.function(functools.partial(_mask_units, window=window), jit_compile=True, input_signature=[
        ids, ids, ids, tf.TensorSpec([None, 2], tf.uint32), tf.TensorSpec([vocab], tf.int32),
        tf.TensorSpec([], tf.int32), tf.TensorSpec([None], tf.int32),
    ])


def mask_batch(
    features: Mapping[str, tf.Tensor],
    scheme: str,
    key_Bx2: tf.Tensor,
    *,
    mask_id: int,
    regular_ids_V: tf.Tensor,
    rate_units_B: tf.Tensor | None = None,
    highest_rate: float = MASK_RATE,
    token_rates_V: tf.Tensor | None = None,
    token_counts_V: tf.Tensor | None = None,
) -> dict[str, tf.Tensor]:
    """Mask a batch of prepared sequences (padded to a static length L) under `scheme`.

    `features` holds `input_ids` (0 on padding), `word_ids` and, for the PMI family, the
    scheme's `units_<name>` (-1 on special tokens and padding), all [B, L]; `key_Bx2` are
    the rows' keys (`randomness.example_keys`); `rate_units_B` each row's masking rate in basis
    points (`MaskRate.units_at`; default 15%), at most `highest_rate`; `token_rates_V`, for
    informask, each token id's rate (`pmi_jax.formats.informask_rates`); `token_counts_V`, for
    random_span, each id's count in the corpus (its random replacements' law). Returns `inputs` (int32, corrupted), `targets` (int32,
    original), `weights` (float32, 1 on every selected token, 0 elsewhere) and `units`
    (int32, the scheme's unit index per token, -1 on special tokens and padding), [B, L].
    """
    input_ids = tf.cast(features["input_ids"], tf.int32)
    length = int(input_ids.shape[1])
    if rate_units_B is None:
        rate_units_B = tf.fill(tf.shape(input_ids)[:1], mask_rate_units(MASK_RATE))
    if scheme == "random_span":
        if token_counts_V is None:
            raise ValueError("random_span needs token_counts_V")  # internal: tasks passes the corpus's
        cumulative_V = tf.cumsum(tf.cast(token_counts_V, tf.int64))
        corrupted, weights, unit_ids = _compiled_mask_spans(length, int(cumulative_V.shape[0]))(
            input_ids, tf.cast(features["word_ids"], tf.int32), tf.cast(key_Bx2, tf.uint32), cumulative_V,
            tf.constant(mask_id, tf.int32), tf.cast(rate_units_B, tf.int32))
        return {"inputs": corrupted, "targets": input_ids, "weights": weights, "units": unit_ids}
    unit_ids = scheme_units(scheme, features, key_Bx2)
    if scheme in TOKEN_RATE_SCHEMES:
        if token_rates_V is None:
            raise ValueError(f"scheme {scheme!r} needs token_rates_V")  # internal: tasks passes the corpus's
        mask_weighted = _compiled_mask_weighted(length, int(regular_ids_V.shape[0]), int(token_rates_V.shape[0]))
        corrupted, weights = mask_weighted(
            input_ids, tf.cast(features["word_ids"], tf.int32), tf.cast(token_rates_V, tf.float64),
            tf.cast(key_Bx2, tf.uint32), tf.cast(regular_ids_V, tf.int32), tf.constant(mask_id, tf.int32),
            tf.cast(rate_units_B, tf.int32))
        return {"inputs": corrupted, "targets": input_ids, "weights": weights, "units": unit_ids}
    # One more draw than the largest budget at the highest rate: one window settles most rows.
    window = masking_budget(length, mask_rate_units(highest_rate)) + 1
    mask_units = _compiled_mask_units(length, int(regular_ids_V.shape[0]), window)
    corrupted, weights = mask_units(
        input_ids, unit_ids, tf.cast(features["word_ids"], tf.int32), tf.cast(key_Bx2, tf.uint32),
        tf.cast(regular_ids_V, tf.int32), tf.constant(mask_id, tf.int32), tf.cast(rate_units_B, tf.int32),
    )
    return {"inputs": corrupted, "targets": input_ids, "weights": weights, "units": unit_ids}
