"""The input pipeline's randomness: keys, random bits, and the one list of random streams.

Masks and the reading order are stateless functions of the run seed (docs/design.md,
"Determinism"). Every draw starts from a key, a hash of integer ids: an example's
(seed, shard, position, epoch) (`example_keys`), the order's (seed, stream tag, epoch)
(`order_key`, `window_key`). `random_bits` hashes (key, stream tag, position) into 32 bits, so
the streams of `Stream` are independent and every op stays batched. Why this hash:
docs/design.md, "Module notes", randomness.py.
"""
from __future__ import annotations

import enum

import tensorflow as tf


class Stream(enum.Enum):
    """Every random stream of the pipeline, as (what it orders or draws from, tag).

    Tags keep the streams of one kind apart; the kinds cannot meet, since an example's key
    hashes four ids and an order key three. The numbers are part of the data contract: changing
    one changes every mask or every order drawn from a seed.
    """

    # Drawn with `random_bits` from a masked example's key (pmi_jax/masking.py).
    UNIT_ORDER = ("example", 0)  # the order in which units are offered to the budget
    UNIT_FATE = ("example", 1)  # per selected unit (random_span: merged span): [MASK], random ids or unchanged
    REPLACEMENT_IDS = ("example", 2)  # per token: the id a randomised unit's token gets (random_span: 2 per token)
    SPAN_LENGTHS = ("example", 3)  # random_span: the length of each span
    WEIGHTED_ORDER = ("example", 4)  # informask: the random order of the systematic sample
    WEIGHTED_START = ("example", 5)  # informask: the systematic sample's random start
    SPAN_ANCHORS = ("example", 6)  # random_span: each span's anchor token
    # Hashed into an order key with `order_key` (pmi_jax/tasks.py).
    FILE_ORDER = ("order", 1)  # the order of a host's files in an epoch
    WINDOW_ORDER = ("order", 2)  # the permutation inside each shuffle window

    @property
    def tag(self) -> int:
        return self.value[1]


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


def hash_keys(*ids_B: tf.Tensor) -> tf.Tensor:
    """uint32 [B, 2] (or [2] for scalar ids): the key of each row, a hash of its non-negative int ids."""
    words = [w for ids in ids_B for w in _words32(ids)]
    lanes = []
    for lane in _LANES:
        h = tf.fill(tf.shape(words[0]), tf.constant(lane, tf.uint32))
        for w in words:
            h = _mix32(tf.bitwise.bitwise_xor(h, w))
        lanes.append(h)
    return tf.stack(lanes, axis=-1)


def example_keys(seed_B: tf.Tensor, shard_B: tf.Tensor, position_B: tf.Tensor, epoch_B: tf.Tensor) -> tf.Tensor:
    """uint32 [B, 2]: the key of each masked example, from the run seed, its place in the
    prepared files (shard, record position) and the epoch, and nothing else."""
    return hash_keys(seed_B, shard_B, position_B, epoch_B)


def order_key(seed: int, stream: Stream, epoch: tf.Tensor) -> tf.Tensor:
    """uint32 [2]: the key of one reading-order stream in one epoch."""
    if stream.value[0] != "order":
        raise ValueError(f"{stream}: not a reading-order stream")
    return hash_keys(tf.constant(seed, tf.int64), tf.constant(stream.tag, tf.int64), epoch)


def window_key(order_key_2: tf.Tensor, window: tf.Tensor) -> tf.Tensor:
    """uint32 [2]: the key of shuffle window `window` under an order key."""
    return hash_keys(order_key_2[0], order_key_2[1], window)


def permute(values_N: tf.Tensor, key_2: tf.Tensor) -> tf.Tensor:
    """`values_N` in the random order given by the key (stateless)."""
    return tf.random.experimental.stateless_shuffle(values_N, tf.cast(key_2, tf.int64))


def random_bits(key_Bx2: tf.Tensor, stream: Stream, length: int, offset: tf.Tensor | int = 0) -> tf.Tensor:
    """uint32 [B, length]: 32 random bits per (row key, stream, position), at positions
    offset, offset + 1, ..., offset + length - 1."""
    if stream.value[0] != "example":
        raise ValueError(f"{stream}: not drawn from an example's key")
    salt = tf.constant(0x9E3779B9 * (stream.tag + 1) % 2**32, tf.uint32)
    row_B1 = _mix32(tf.bitwise.bitwise_xor(key_Bx2[:, :1], salt))
    position_1xN = tf.cast(tf.range(length)[None, :] + offset, tf.uint32) * tf.constant(0x9E3779B9, tf.uint32)
    return _mix32(tf.bitwise.bitwise_xor(_mix32(row_B1 + position_1xN), key_Bx2[:, 1:]))


def random_uniform(key_Bx2: tf.Tensor, stream: Stream, length: int, offset: tf.Tensor | int = 0) -> tf.Tensor:
    """float32 [B, length] in [0, 1), 24 random bits each."""
    bits = tf.bitwise.right_shift(random_bits(key_Bx2, stream, length, offset), 8)
    return tf.cast(bits, tf.float32) * (1.0 / (1 << 24))


def random_below(
    key_Bx2: tf.Tensor, stream: Stream, length: int, n: tf.Tensor | int, offset: tf.Tensor | int = 0
) -> tf.Tensor:
    """int32 [B, length] uniform on [0, n): floor(bits * n / 2^32), bias below n / 2^32.

    `n` is one bound for every row (an int) or a bound per row ([B], each below 2^16). Below
    2^16 the product is taken in 16-bit halves, bits = 2^16 h + l:
    floor(bits n / 2^32) = (h n + (l n >> 16)) >> 16 exactly, in uint32 arithmetic, which
    XLA's CPU code runs faster than the 64-bit product used for larger n.
    """
    bits = random_bits(key_Bx2, stream, length, offset)
    if isinstance(n, int) and n >= 1 << 16:
        return tf.cast(tf.bitwise.right_shift(tf.cast(bits, tf.int64) * n, 32), tf.int32)
    n = tf.cast(n, tf.uint32)
    n = n[:, None] if n.shape.rank == 1 else n
    high = tf.bitwise.right_shift(bits, 16) * n
    low = tf.bitwise.right_shift(tf.bitwise.bitwise_and(bits, 0xFFFF) * n, 16)
    return tf.cast(tf.bitwise.right_shift(high + low, 16), tf.int32)
