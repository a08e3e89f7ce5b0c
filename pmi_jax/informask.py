"""`pmi-jax corpus informask` as a function: a prepared corpus -> InforMask's token-specific masking rates.

Method, source (Sadeq et al. 2022) and our choices: docs/design.md, "InforMask". Two passes over
the train split in file order: (1) each token id's occurrences and the pairs of tokens at most
`window` apart inside one document; (2) per sequence, `candidates` uniformly random masks of the
15% budget, each scored by its informative relevance (the PMI of every masked token with every
unmasked token in its window); the best one's tokens count as masked. rate(t) = masked(t) /
occurrences(t); an id the split never holds gets the overall share. The output is a function of
the split and the options: the candidates of the sequence at (shard, position) come from a
generator seeded with (seed, shard, position) alone.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Iterator

import numpy as np
import tensorflow as tf

from pmi_jax import storage
from pmi_jax.config import MASK_RATE, mask_rate_units
from pmi_jax.errors import UserInputError
from pmi_jax.formats import informask_rates, prepared_corpus, run_dir
from pmi_jax.masking import masking_budget

_FLUSH_PAIRS = 1 << 23  # pair keys gathered before they are merged into the running counts
_READ_BATCH = 256  # records parsed at once
_SHOWN = 10  # tokens listed in the summary at each end of the rates
_SHOWN_MIN_OCCURRENCES = 20  # ... among those seen at least this often (rarer rates are noisy)


def _progress_bar(desc: str, total: int | None, enabled: bool):
    import sys

    import tqdm

    return tqdm.tqdm(desc=desc, total=total, unit="seq", file=sys.stderr, disable=not enabled, leave=False)


@dataclasses.dataclass(frozen=True)
class InformaskOptions:
    """The offline step's settings. Every default is our choice: the paper's values are not in
    the parts of it we could read (docs/design.md, "InforMask")."""

    window: int = 10  # tokens on each side that count as a token's context
    candidates: int = 10  # random masks scored per sequence
    min_pair_count: int = 5  # pairs seen fewer times have PMI 0 (too rare to estimate)
    seed: int = 0

    def validated(self) -> "InformaskOptions":
        for flag, value, least in (("--window", self.window, 1), ("--candidates", self.candidates, 1),
                                   ("--min-pair-count", self.min_pair_count, 1), ("--seed", self.seed, 0)):
            if value < least:
                raise UserInputError(f"{flag} {value}: must be at least {least}")
        return self


@dataclasses.dataclass(frozen=True)
class Sequence:
    """The content tokens of one prepared sequence: ids, and the document each belongs to."""

    shard: int
    position: int
    ids: np.ndarray  # int64 [n], special tokens removed
    documents: np.ndarray  # int64 [n]: tokens of one document share a number


def content_of(shard: int, position: int, input_ids: np.ndarray, word_ids: np.ndarray) -> Sequence:
    """The special tokens ([CLS], [SEP]: word id -1) dropped; each one starts a new document."""
    special = word_ids < 0
    return Sequence(shard, position, input_ids[~special], np.cumsum(special)[~special])


def read_train(corpus: prepared_corpus.PreparedCorpus) -> Iterator[Sequence]:
    """The train split's sequences in file order."""
    spec = prepared_corpus.feature_spec([])
    with prepared_corpus.reading(corpus.data_dir):
        for shard, file in enumerate(corpus.files("train")):
            position = 0
            records = tf.data.TFRecordDataset(file).batch(_READ_BATCH)
            for batch in records.map(lambda r: tf.io.parse_example(r, spec)).as_numpy_iterator():
                ids, words = batch[prepared_corpus.INPUT_IDS], batch[prepared_corpus.WORD_IDS]
                for row_ids, row_words in zip(ids, words):
                    yield content_of(shard, position, np.asarray(row_ids, np.int64), np.asarray(row_words, np.int64))
                    position += 1


def window_pairs(sequence: Sequence, window: int) -> tuple[np.ndarray, np.ndarray]:
    """(i, j): every pair of content positions i < j at most `window` apart in one document.
    (Inside a document content tokens are contiguous, so position differences are distances.)"""
    n = len(sequence.ids)
    firsts, seconds = [], []
    for d in range(1, min(window, n - 1) + 1):
        i = np.arange(n - d)
        same = sequence.documents[i] == sequence.documents[i + d]
        firsts.append(i[same])
        seconds.append(i[same] + d)
    if not firsts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(firsts), np.concatenate(seconds)


def pair_keys(a: np.ndarray, b: np.ndarray, vocab_size: int) -> np.ndarray:
    """One int64 key per unordered pair of ids."""
    return np.minimum(a, b) * vocab_size + np.maximum(a, b)


@dataclasses.dataclass(frozen=True)
class Counts:
    """Pass 1's counts. `keys` (sorted) and `pairs` count each unordered pair of ids once per
    occurrence of the two within a window; `tokens` counts each id's occurrences."""

    vocab_size: int
    tokens: np.ndarray  # int64 [V]
    keys: np.ndarray  # int64 [P], sorted
    pairs: np.ndarray  # int64 [P]

    def pmi(self, a: np.ndarray, b: np.ndarray, min_pair_count: int) -> np.ndarray:
        """float64: PMI(a, b) = log p(a, b) / (p(a) p(b)), 0 for pairs seen under `min_pair_count` times.

        p(a) = occurrences of a / content tokens; p(a, b) = the share of ordered window pairs
        (x, y), both orders of every pair counted, with x = a and y = b: n{a,b} / (2 N_pairs) for
        a != b and n{a,a} / N_pairs for a = b, where n counts unordered pairs.
        """
        keys = pair_keys(a, b, self.vocab_size)
        n_ab = np.zeros(len(keys), np.int64)
        if len(self.keys):
            at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
            n_ab = np.where(self.keys[at] == keys, self.pairs[at], 0)
        total_tokens, total_pairs = self.tokens.sum(), self.pairs.sum()
        ordered = n_ab / np.where(a == b, 1.0, 2.0) / max(total_pairs, 1)
        expected = self.tokens[a] * self.tokens[b] / float(total_tokens) ** 2
        with np.errstate(divide="ignore", invalid="ignore"):
            value = np.log(ordered / expected)
        return np.where(n_ab >= min_pair_count, value, 0.0)


def count(sequences, vocab_size: int, window: int) -> Counts:
    """Pass 1 over `sequences` (an iterable of `Sequence`)."""
    tokens = np.zeros(vocab_size, np.int64)
    keys, counts, pending, size = np.zeros(0, np.int64), np.zeros(0, np.int64), [], 0

    def merge(keys, counts, pending):
        new = np.concatenate(pending)
        unique, inverse = np.unique(np.concatenate([keys, new]), return_inverse=True)
        weights = np.concatenate([counts, np.ones(len(new), np.int64)])
        return unique, np.bincount(inverse, weights=weights, minlength=len(unique)).astype(np.int64)

    for sequence in sequences:
        tokens += np.bincount(sequence.ids, minlength=vocab_size)
        i, j = window_pairs(sequence, window)
        pending.append(pair_keys(sequence.ids[i], sequence.ids[j], vocab_size))
        size += len(i)
        if size >= _FLUSH_PAIRS:
            keys, counts = merge(keys, counts, pending)
            pending, size = [], 0
    if pending:
        keys, counts = merge(keys, counts, pending)
    return Counts(vocab_size, tokens, keys, counts)


def informative_relevance(masks: np.ndarray, i: np.ndarray, j: np.ndarray, pmi: np.ndarray) -> np.ndarray:
    """float64 [K]: per mask (bool [K, n]), the sum over the window pairs (i, j) with exactly one
    token masked of the pair's PMI: each masked token's PMI with each unmasked token near it."""
    return (masks[:, i] != masks[:, j]).astype(np.float64) @ pmi


def best_mask(sequence: Sequence, counts: Counts, options: InformaskOptions) -> tuple[np.ndarray, float, float]:
    """(bool [n]: the best of the candidate masks, its informative relevance, the candidates' mean).

    A candidate masks the scheme's 15% budget of content tokens (`masking_budget`), chosen
    uniformly at random. The first best candidate wins ties.
    """
    n = len(sequence.ids)
    k = min(masking_budget(n, mask_rate_units(MASK_RATE)), n)
    rng = np.random.default_rng([options.seed, sequence.shard, sequence.position])
    chosen = np.argpartition(rng.random((options.candidates, n)), k - 1, axis=1)[:, :k]
    masks = np.zeros((options.candidates, n), bool)
    np.put_along_axis(masks, chosen, True, axis=1)
    i, j = window_pairs(sequence, options.window)
    pmi = counts.pmi(sequence.ids[i], sequence.ids[j], options.min_pair_count)
    relevance = informative_relevance(masks, i, j, pmi)
    best = int(np.argmax(relevance))
    return masks[best], float(relevance[best]), float(relevance.mean())


def measure_rates(corpus: prepared_corpus.PreparedCorpus, options: InformaskOptions,
                  progress: bool = False) -> dict:
    """The content of informask_rates.json for `corpus` (both passes)."""
    vocab_size = corpus.vocab_size
    total = int(corpus.metadata["splits"]["train"].get("sequences", 0)) or None
    with _progress_bar("pair counts", total, progress) as bar:
        def counted():
            for sequence in read_train(corpus):
                bar.update(1)
                yield sequence

        counts = count(counted(), vocab_size, options.window)
    masked = np.zeros(vocab_size, np.int64)
    chosen_relevance = candidate_relevance = 0.0
    sequences = 0
    with _progress_bar("sample and score", total, progress) as bar:
        for sequence in read_train(corpus):
            bar.update(1)
            if len(sequence.ids) == 0:
                continue
            mask, best, mean = best_mask(sequence, counts, options)
            masked += np.bincount(sequence.ids[mask], minlength=vocab_size)
            chosen_relevance += best
            candidate_relevance += mean
            sequences += 1
    if counts.tokens.sum() == 0:
        raise UserInputError(f"{corpus.data_dir}: the train split holds no tokens to measure rates on")
    overall = masked.sum() / counts.tokens.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        rates = np.where(counts.tokens > 0, masked / np.maximum(counts.tokens, 1), overall)
    # Never content, never masked; [UNK] is content (part of words) and keeps its measured rate.
    rates[[i for name, i in corpus.special_ids.items() if name != "unk"]] = 0.0
    return {
        "source": informask_rates.corpus_source(corpus),
        "options": dataclasses.asdict(options),
        "totals": {"sequences": sequences, "tokens": int(counts.tokens.sum()), "masked": int(masked.sum()),
                   "pairs": int(counts.pairs.sum()), "distinct_pairs": int(len(counts.keys)),
                   "overall_rate": float(overall),
                   "mean_relevance_chosen": chosen_relevance / max(sequences, 1),
                   "mean_relevance_candidates": candidate_relevance / max(sequences, 1)},
        "occurrences": counts.tokens.tolist(),
        "masked": masked.tolist(),
        "rates": [float(r) for r in rates],
    }


def build_rates(data_dir: str, options: InformaskOptions = InformaskOptions(), overwrite: bool = False,
                progress: bool = False) -> dict:
    """Measure the rates of the prepared corpus `data_dir` and write DATA/informask_rates.json
    atomically; return the totals, the options and the tokens with the highest and lowest rates."""
    started = time.time()
    options = options.validated()
    corpus = prepared_corpus.PreparedCorpus(data_dir)
    corpus.files("train")
    output = informask_rates.path(data_dir)
    if storage.gfile.exists(output) and not overwrite:
        raise UserInputError(f"{output} exists; add --overwrite to measure the rates again")
    run_dir.check_new_output(output, overwrite=True)
    content = measure_rates(corpus, options, progress)
    informask_rates.write_rates(data_dir, content)
    occurrences, rates = np.asarray(content["occurrences"]), np.asarray(content["rates"])
    frequent = [t for t in np.flatnonzero(occurrences >= _SHOWN_MIN_OCCURRENCES)]
    ranked = sorted(frequent, key=lambda t: (-rates[t], t))
    shown = lambda ids: [(corpus.tokens[t], float(rates[t]), int(occurrences[t])) for t in ids]
    return {"path": output, "options": content["options"], **content["totals"],
            "highest": shown(ranked[:_SHOWN]), "lowest": shown(ranked[::-1][:_SHOWN]),
            "elapsed_seconds": time.time() - started, "rates_of": int((occurrences > 0).sum()),
            "shown_min_occurrences": _SHOWN_MIN_OCCURRENCES}
