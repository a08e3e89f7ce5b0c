"""In-graph masking (DESIGN §5): pick masking units covering 15% of a sequence, corrupt them.

Every function here is pure TensorFlow on a batch of B sequences padded to a fixed length
L (`input_ids` 0, the index features -1 on padding), usable inside a tf.data map function:
no py_function and no Python loop over tokens or sequences. Working on whole batches makes
the per-op cost of TensorFlow negligible; each row is still masked on its own, so a
sequence's mask does not depend on which batch it lands in.

Randomness is stateless and per sequence: `example_keys` turns (run seed, shard, position,
epoch) into a 64-bit key per row, and `random_bits` hashes (key, stream, position) into
32 random bits. A mask is thus a pure function of the run seed, the example and the epoch.
(tf.random.stateless_* take one seed per op, which would force one op per sequence; the
hash keeps every op batched. It is the `lowbias32` integer mixer applied twice, ample for
choosing masks.)

Masking takes three steps:
  1. units    `scheme_units`: an int32 unit index per token, -1 on special tokens and
              padding. random_token (each token), whole_word (`word_ids`), random_span
              (`span_units`), and the PMI family frequency / naive_pmi / pmi (the prepared
              `units_<name>` feature).
  2. select   `select_units`: units in a uniformly random order, each taken if it still fits
              the budget of floor(15% of the non-special tokens) (at least 1) and skipped if
              it would overflow it, so the budget is never exceeded.
  3. corrupt  `corrupt`: one draw u ~ U(0, 1) per selected unit: u < 0.8 -> every token
              [MASK]; u < 0.9 -> every token an independent uniformly random non-special
              id; else unchanged. Every selected token gets weight 1 whatever its fate.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import tensorflow as tf

from pmi_jax.config import SCHEMES, UNIT_SCHEMES  # the scheme names, defined once

# Schemes whose units come from the prepared corpus, and the unit feature each one reads.
PREPARED_UNIT_FEATURES = {scheme: f"units_{scheme}" for scheme in UNIT_SCHEMES}

MASK_PERCENT = 15
MASK_SHARE = 0.8
RANDOM_SHARE = 0.1
SPAN_P = 0.2
SPAN_MAX_WORDS = 10

# Random streams drawn from one example key; each is used for one purpose only.
_ORDER, _FATE, _REPLACEMENT, _SPAN_LENGTH = range(4)
_LANES = (0x243F6A88, 0x85A308D3)  # two independent 32-bit hash lanes make a 64-bit key


def _mix32(x: tf.Tensor) -> tf.Tensor:
    """lowbias32 (C. Wellons): a bijective 32-bit mixer with near-ideal avalanche."""
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16)) * tf.constant(0x7FEB352D, tf.uint32)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 15)) * tf.constant(0x846CA68B, tf.uint32)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16))


def _words32(x: tf.Tensor) -> list[tf.Tensor]:
    """A non-negative int64 tensor as its low and high 32-bit words (uint32)."""
    x = tf.cast(x, tf.int64)
    low = tf.cast(tf.bitwise.bitwise_and(x, 0xFFFFFFFF), tf.uint32)
    return [low, tf.cast(tf.bitwise.right_shift(x, 32), tf.uint32)]


def example_keys(*ids_B: tf.Tensor) -> tf.Tensor:
    """uint32 [B, 2]: the random key of each row, a hash of its non-negative int ids.

    The data pipeline passes (run seed, shard, position, epoch): the mask of an example is
    then a function of the run seed, its place in the prepared files and the epoch only.
    """
    words = [w for ids in ids_B for w in _words32(ids)]
    lanes = []
    for lane in _LANES:
        h = tf.fill(tf.shape(words[0]), tf.constant(lane, tf.uint32))
        for w in words:
            h = _mix32(tf.bitwise.bitwise_xor(h, w))
        lanes.append(h)
    return tf.stack(lanes, axis=-1)


def random_bits(key_Bx2: tf.Tensor, stream: int, length: int) -> tf.Tensor:
    """uint32 [B, length]: 32 random bits per (row key, stream, position)."""
    row_B1 = _mix32(tf.bitwise.bitwise_xor(key_Bx2[:, :1], tf.constant(0x9E3779B9 * (stream + 1) % 2**32, tf.uint32)))
    position_1xN = tf.cast(tf.range(length)[None, :], tf.uint32) * tf.constant(0x9E3779B9, tf.uint32)
    return _mix32(tf.bitwise.bitwise_xor(_mix32(row_B1 + position_1xN), key_Bx2[:, 1:]))


def random_uniform(key_Bx2: tf.Tensor, stream: int, length: int) -> tf.Tensor:
    """float32 [B, length] in [0, 1), 24 random bits each."""
    bits = tf.bitwise.right_shift(random_bits(key_Bx2, stream, length), 8)
    return tf.cast(bits, tf.float32) * (1.0 / (1 << 24))


def random_below(key_Bx2: tf.Tensor, stream: int, length: int, n: int) -> tf.Tensor:
    """int32 [B, length] uniform on [0, n): floor(bits * n / 2^32), bias below n / 2^32."""
    bits = tf.cast(random_bits(key_Bx2, stream, length), tf.int64)
    return tf.cast(tf.bitwise.right_shift(bits * n, 32), tf.int32)


def masking_budget(num_tokens: tf.Tensor | int) -> tf.Tensor | int:
    """floor(15% of `num_tokens`), at least 1 (a Python int in, a Python int out).

    Floor rather than DESIGN's round: with round, 15% of 510 tokens (76.5) becomes 77 and the
    masked share could exceed 15%; floor keeps it at or under 15% for every sequence holding at
    least 7 tokens (below that the one-token minimum wins). Integer arithmetic, so the budget
    never depends on float rounding.
    """
    if isinstance(num_tokens, int):
        return max(1, MASK_PERCENT * num_tokens // 100)
    num_tokens = tf.cast(num_tokens, tf.int32)
    return tf.maximum(1, MASK_PERCENT * num_tokens // 100)


def _segment(values_BxL: tf.Tensor, ids_BxL: tf.Tensor, op) -> tf.Tensor:
    """Per-row segment reduction: [B, L] values into L segments per row; ids in [0, L]
    (id L is a spare segment for entries that belong nowhere, dropped from the result)."""
    batch, length = tf.shape(ids_BxL)[0], ids_BxL.shape[1]
    flat_ids = ids_BxL + (length + 1) * tf.range(batch)[:, None]
    out = op(values_BxL, flat_ids, batch * (length + 1))
    return tf.reshape(out, [batch, length + 1])[:, :length]


def token_units(word_ids_BxL: tf.Tensor) -> tf.Tensor:
    """random_token: every non-special token is a unit of its own, numbered 0, 1, 2, ..."""
    is_token = word_ids_BxL >= 0
    return tf.where(is_token, tf.cumsum(tf.cast(is_token, tf.int32), axis=-1) - 1, -1)


def span_lengths(key_Bx2: tf.Tensor, length: int, p: float = SPAN_P, max_words: int = SPAN_MAX_WORDS) -> tf.Tensor:
    """int32 [B, length]: span lengths ~ Geometric(p) on {1, 2, ...}, capped at `max_words`.

    Inverse CDF: for V ~ U(0, 1], floor(log V / log(1 - p)) + 1 is Geometric(p).
    """
    v = 1.0 - random_uniform(key_Bx2, _SPAN_LENGTH, length)
    lengths = tf.floor(tf.math.log(v) / tf.math.log(1.0 - p)) + 1.0
    return tf.cast(tf.minimum(lengths, float(max_words)), tf.int32)


def span_units(word_ids_BxL: tf.Tensor, key_Bx2: tf.Tensor) -> tf.Tensor:
    """random_span: cut each document into SpanBERT spans; a span is one masking unit.

    Precisely: inside each document of the sequence (documents are separated by special
    tokens), spans are laid end to end from the document's first word, with lengths in
    words drawn independently from Geometric(0.2) capped at 10; the document's end cuts
    its last span. `select_units` then draws spans uniformly at random without replacement
    into the token budget, exactly as for every other scheme. So spans are whole words,
    never overlap, never cross a document boundary, start at random words, and have the
    capped geometric length law (only a document's last span is shortened).

    This is SpanBERT's sampling (a length, then a random start, overlaps rejected) made
    vectorisable: candidate spans are disjoint by construction instead of being rejected
    in a sequential loop. Rejection would also skew the accepted lengths towards short
    spans, since long ones overlap more often; this construction does not.

    Vectorised form: with lengths drawn for every word position j and their exclusive
    cumulative sum C, the k-th span of the document starting at word a starts at word
    a + C[a + k] - C[a]; taking j = a + k gives every span start of every document at once.
    """
    length = word_ids_BxL.shape[1]
    is_word = word_ids_BxL >= 0
    word_slot = tf.where(is_word, word_ids_BxL, length)  # specials and padding -> spare slot
    follows_special = tf.concat([tf.ones_like(is_word[:, :1]), ~is_word[:, :-1]], axis=-1)
    opens_doc_W = _segment(tf.cast(is_word & follows_special, tf.int32), word_slot, tf.math.unsorted_segment_max) > 0
    num_words_B1 = tf.reduce_max(word_ids_BxL, axis=-1, keepdims=True) + 1
    word_W = tf.broadcast_to(tf.range(length)[None, :], tf.shape(word_ids_BxL))
    is_real_W = word_W < num_words_B1

    doc_W = tf.where(is_real_W, tf.cumsum(tf.cast(opens_doc_W, tf.int32), axis=-1) - 1, length)
    doc_index_W = tf.minimum(doc_W, length - 1)  # in range for gather; padding words are masked below
    first_W = tf.gather(_segment(word_W, doc_W, tf.math.unsorted_segment_min), doc_index_W, batch_dims=1)
    end_W = tf.gather(_segment(word_W + 1, doc_W, tf.math.unsorted_segment_max), doc_index_W, batch_dims=1)

    offset_W = tf.cumsum(span_lengths(key_Bx2, length), axis=-1, exclusive=True)
    start_W = first_W + offset_W - tf.gather(offset_W, tf.minimum(first_W, length - 1), batch_dims=1)
    start_slot_W = tf.where(is_real_W & (start_W < end_W), start_W, length)
    opens_span_W = _segment(tf.ones_like(start_W), start_slot_W, tf.math.unsorted_segment_max) > 0
    span_W = tf.cumsum(tf.cast(opens_span_W, tf.int32), axis=-1) - 1
    return tf.where(is_word, tf.gather(span_W, tf.maximum(word_ids_BxL, 0), batch_dims=1), -1)


def scheme_units(scheme: str, features: Mapping[str, tf.Tensor], key_Bx2: tf.Tensor) -> tf.Tensor:
    """int32 [B, L]: the unit index per token that `scheme` masks by (-1 on special tokens)."""
    word_ids = tf.cast(features["word_ids"], tf.int32)
    if scheme == "random_token":
        return token_units(word_ids)
    if scheme == "whole_word":
        return word_ids
    if scheme == "random_span":
        return span_units(word_ids, key_Bx2)
    if scheme in PREPARED_UNIT_FEATURES:
        return tf.cast(features[PREPARED_UNIT_FEATURES[scheme]], tf.int32)
    raise ValueError(f"unknown masking scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")


def greedy_fill(sizes_BxN: tf.Tensor, budget_B: tf.Tensor) -> tf.Tensor:
    """bool [B, N]: which of N units per row, scanned in order, the greedy fill takes.

    Greedy: take a unit if its size fits what is left of the budget, else skip it and go
    on. Computed in a few vectorised rounds instead of a scan over N units. A round takes,
    among the untaken units that fit what is left (`size <= left`), the longest prefix (in
    scan order) whose sizes sum to at most `left`.

    Why this equals the greedy scan: a unit the scan skips has size > left at that time,
    and `left` only shrinks, so skipped units are exactly those no later round admits. The
    scan therefore takes, after its current point, the next units of size <= left for as
    long as their running sum fits: one round. The round stops at a unit c that overflows;
    everything before c is settled, the next round's size filter excludes c, and the scan
    continues after c. Each round takes a unit and leaves `left` below the size of the unit
    that stopped it, so there are at most 1 + (largest unit size) rounds, in practice 2-3.
    """
    sizes_BxN = tf.cast(sizes_BxN, tf.int32)
    real_BxN = sizes_BxN > 0

    def open_units(taken_BxN, left_B):
        return ~taken_BxN & real_BxN & (sizes_BxN <= left_B[:, None])

    def round_(taken_BxN, left_B):
        fits_BxN = open_units(taken_BxN, left_B)
        running_BxN = tf.cumsum(tf.where(fits_BxN, sizes_BxN, 0), axis=-1)
        take_BxN = fits_BxN & (running_BxN <= left_B[:, None])
        return taken_BxN | take_BxN, left_B - tf.reduce_sum(tf.where(take_BxN, sizes_BxN, 0), axis=-1)

    taken_BxN, _ = tf.while_loop(
        lambda taken_BxN, left_B: tf.reduce_any(open_units(taken_BxN, left_B)),
        round_,
        (tf.zeros_like(real_BxN), tf.cast(budget_B, tf.int32)),
    )
    return taken_BxN


def select_units(
    unit_ids_BxL: tf.Tensor, budget_B: tf.Tensor, key_Bx2: tf.Tensor, window: int | None = None
) -> tf.Tensor:
    """bool [B, L]: the tokens of the units chosen in a random order by the greedy fill.

    Unit ids are indices in [0, L) (at most one unit per token); -1 marks tokens in no unit.
    The random order ranks the units of a row by random priorities.

    Rather than sorting all L slots, the scan goes a window at a time: the next `window`
    units in order among those that could still fit (size <= left), found with top_k and
    settled by `greedy_fill`. A unit outside that set is one the scan would skip anyway
    (`left` only shrinks), so the windows reproduce the full scan exactly. The default
    window, one more than the largest budget, covers every unit the scan can take before
    its first overflow, so a second window is rarely needed.
    """
    batch, length = tf.shape(unit_ids_BxL)[0], unit_ids_BxL.shape[1]
    window = min(length, window or masking_budget(length) + 1)
    in_unit = unit_ids_BxL >= 0
    slot = tf.where(in_unit, unit_ids_BxL, length)  # tokens in no unit -> a spare slot
    sizes_U = _segment(tf.cast(in_unit, tf.int32), slot, tf.math.unsorted_segment_sum)
    priority_U = random_uniform(key_Bx2, _ORDER, length)
    rows_BxK = tf.broadcast_to(tf.range(batch)[:, None], [batch, window])

    def open_units(scanned_U, left_B):
        return ~scanned_U & (sizes_U <= left_B[:, None])

    def scan_window(taken_U, scanned_U, left_B):
        open_U = open_units(scanned_U, left_B)
        next_K = tf.math.top_k(tf.where(open_U, -priority_U, -2.0), window).indices  # the next units, in order
        index_K = tf.stack([rows_BxK, next_K], axis=-1)
        sizes_K = tf.where(tf.gather(open_U, next_K, batch_dims=1), tf.gather(sizes_U, next_K, batch_dims=1), 0)
        taken_K = greedy_fill(sizes_K, left_B)
        left_B -= tf.reduce_sum(tf.where(taken_K, sizes_K, 0), axis=-1)
        taken_U = tf.tensor_scatter_nd_update(taken_U, index_K, taken_K | tf.gather(taken_U, next_K, batch_dims=1))
        scanned_U = tf.tensor_scatter_nd_update(scanned_U | ~open_U, index_K, tf.ones_like(taken_K))
        return taken_U, scanned_U, left_B

    taken_U, _, _ = tf.while_loop(
        lambda taken_U, scanned_U, left_B: tf.reduce_any(open_units(scanned_U, left_B)),
        scan_window,
        (tf.zeros_like(in_unit), sizes_U == 0, tf.cast(budget_B, tf.int32)),
    )
    taken_U = tf.pad(taken_U, [[0, 0], [0, 1]])  # the spare slot is never taken
    return tf.gather(taken_U, slot, batch_dims=1)


def corrupt(
    input_ids_BxL: tf.Tensor,
    unit_ids_BxL: tf.Tensor,
    selected_BxL: tf.Tensor,
    key_Bx2: tf.Tensor,
    *,
    mask_id: int,
    regular_ids_V: tf.Tensor,
) -> tf.Tensor:
    """The corrupted ids: per selected unit, 80% all [MASK], 10% all random, 10% unchanged.

    `regular_ids_V` lists the ids a random replacement may take (every id but the special
    ones); each token of a randomly replaced unit draws its own id.
    """
    length = input_ids_BxL.shape[1]
    slot = tf.where(unit_ids_BxL >= 0, unit_ids_BxL, length)
    fate_U = tf.pad(random_uniform(key_Bx2, _FATE, length), [[0, 0], [0, 1]], constant_values=1.0)
    fate_BxL = tf.gather(fate_U, slot, batch_dims=1)
    draw_BxL = random_below(key_Bx2, _REPLACEMENT, length, int(regular_ids_V.shape[0]))
    random_ids_BxL = tf.gather(regular_ids_V, draw_BxL)
    to_mask = selected_BxL & (fate_BxL < MASK_SHARE)
    to_random = selected_BxL & (fate_BxL >= MASK_SHARE) & (fate_BxL < MASK_SHARE + RANDOM_SHARE)
    corrupted_BxL = tf.where(to_random, random_ids_BxL, input_ids_BxL)
    return tf.where(to_mask, tf.constant(mask_id, input_ids_BxL.dtype), corrupted_BxL)


def regular_ids(vocab_size: int, special_ids: Sequence[int]) -> tf.Tensor:
    """int32 [V']: every id of the vocabulary except the special ones, for random replacement."""
    special = set(int(i) for i in special_ids)
    return tf.constant([i for i in range(vocab_size) if i not in special], tf.int32)


def mask_batch(
    features: Mapping[str, tf.Tensor],
    scheme: str,
    key_Bx2: tf.Tensor,
    *,
    mask_id: int,
    regular_ids_V: tf.Tensor,
) -> dict[str, tf.Tensor]:
    """Mask a batch of prepared sequences (padded to a static length L) under `scheme`.

    `features` holds `input_ids` (0 on padding), `word_ids` and, for the PMI family, the
    scheme's `units_<name>` (-1 on special tokens and padding), all [B, L]; `key_Bx2` are
    the rows' keys (`example_keys`). Returns `inputs` (int32, corrupted), `targets` (int32,
    original), `weights` (float32, 1 on every selected token, 0 elsewhere) and `units`
    (int32, the scheme's unit index per token, -1 on special tokens and padding), [B, L].
    """
    input_ids = tf.cast(features["input_ids"], tf.int32)
    unit_ids = scheme_units(scheme, features, key_Bx2)
    num_tokens_B = tf.reduce_sum(tf.cast(tf.cast(features["word_ids"], tf.int32) >= 0, tf.int32), axis=-1)
    selected = select_units(unit_ids, masking_budget(num_tokens_B), key_Bx2)
    corrupted = corrupt(input_ids, unit_ids, selected, key_Bx2, mask_id=mask_id, regular_ids_V=regular_ids_V)
    return {"inputs": corrupted, "targets": input_ids, "weights": tf.cast(selected, tf.float32), "units": unit_ids}
