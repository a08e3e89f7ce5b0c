"""tensorflow_text's WordPiece learner, computed in time linear in the word lengths: the same vocabulary.

The library's passes count every substring from a piece boundary (O(L²) per word), then subtract
from each the counts of its extensions; what is left of a substring t is the total count of the
words whose suffix from a piece boundary is t. This module counts those suffixes directly and
calls the library's own functions for everything else; the first iteration, the same for every
threshold, is counted once. With workers > 1 each iteration's counting is split over processes
holding disjoint slices of the words; the sums are the same (same vocabulary). Same tokens, same
order (tests/test_wordpiece.py). Details: docs/design.md, "Module notes", wordpiece_learner.py;
figures: benchmarks/README.md.
"""
from __future__ import annotations

import multiprocessing
from typing import Iterable, Sequence

import numpy as np

# Fewer distinct words than this: counted in this process, as starting workers would cost more.
MIN_PARALLEL_WORDS = 50_000


class WordPieceLearner:
    """The library's `learn` over fixed word counts, with what every pass shares computed once."""

    def __init__(self, word_counts: Iterable[tuple[str, int]], vocab_size: int, reserved_tokens: Sequence[str],
                 num_iterations: int = 4, max_input_tokens: int | None = int(5e6), max_token_length: int = 50,
                 max_unique_chars: int = 1000, slack_ratio: float = 0.05, include_joiner_token: bool = True,
                 joiner: str = "##", workers: int = 1, min_parallel_words: int = MIN_PARALLEL_WORDS):
        library = _library()
        self.word_counts = list(word_counts)
        self.params = library.Params(None, None, num_iterations, max_input_tokens, max_token_length,
                                     max_unique_chars, vocab_size, slack_ratio, include_joiner_token, joiner,
                                     list(reserved_tokens))
        all_counts = library.get_input_words(self.word_counts, self.params.reserved_tokens, max_token_length)
        allowed_chars = library.get_allowed_chars(all_counts, max_unique_chars)
        self.filtered = library.filter_input_words(all_counts, allowed_chars, max_input_tokens)
        self.char_tokens = library.extract_char_tokens(self.filtered)
        self._positive = all(count > 0 for _, count in self.filtered)
        self._vocabs: dict[int, list[str]] = {}  # threshold -> vocabulary
        self._first: tuple[int, list[dict[str, int]]] | None = None  # (floor, iteration 0's counts >= floor)
        self._first_sorted: tuple[int, np.ndarray] | None = None  # (floor, those counts sorted)
        self.skipped: list[int] = []  # thresholds whose passes `learn` proved it need not run (size_bound)
        self.workers = max(1, min(workers, len(self.filtered))) if len(self.filtered) >= min_parallel_words else 1
        self._pool: _Workers | None = None

    def close(self) -> None:
        """Stops the worker processes (started at the first pass that counts in parallel)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> "WordPieceLearner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def learn(self, upper_thresh: int | None = int(1e7), lower_thresh: int | None = 10) -> list[str]:
        """`library.learn(word_counts, vocab_size, reserved_tokens, upper_thresh, lower_thresh, ...)`."""
        library = _library()
        upper, lower = library.get_search_threshs(self.word_counts, upper_thresh, lower_thresh)
        slack = max(self.params.slack_ratio * self.params.vocab_size, 0)
        while True:  # library.learn_binary_search, as a loop
            thresh = (upper + lower) // 2
            if lower < upper and thresh > 1 and self.params.vocab_size - self.size_bound(thresh) > slack:
                # The pass would end under the target by more than the slack, and not be the last:
                # the search goes on below it whatever its tokens, so they need not be learned.
                self.skipped.append(thresh)
                upper = thresh - 1
                continue
            vocab = self.learn_with_thresh(thresh)
            size = len(vocab)
            if (size <= self.params.vocab_size and self.params.vocab_size - size <= slack) or lower >= upper \
                    or thresh <= 1:
                return vocab
            if size > self.params.vocab_size:
                lower = thresh + 1
            else:
                upper = thresh - 1

    def size_bound(self, thresh: int) -> float:
        """An upper bound on len(learn_with_thresh(thresh)) from iteration 0's counts, or inf.

        Every pass's tokens are the reserved ones, the characters (plain and joiner-prefixed) and
        the suffixes chosen in its last iteration: those counted at least `thresh` times. An
        iteration after the first counts a suffix at a subset of the positions iteration 0
        counts it at (its piece boundaries, against every letter), so no suffix is counted more
        often than in iteration 0: the chosen ones are at most the suffixes whose iteration-0
        count reaches `thresh`. Known once iteration 0 was counted down to `thresh` (the floor
        pass that `train_vocab` runs first does it), and only where the suffix counts apply.
        """
        if self._first is None or self._first[0] > thresh or not self._positive or thresh <= 0:
            return float("inf")
        if self._first_sorted is None or self._first_sorted[0] != self._first[0]:
            counts = np.fromiter((c for table in self._first[1] for c in table.values()), np.int64)
            self._first_sorted = (self._first[0], np.sort(counts))
        counts = self._first_sorted[1]
        reached = len(counts) - int(np.searchsorted(counts, thresh, side="left"))
        chars = len(self.char_tokens) * (2 if self.params.include_joiner_token else 1)
        return len(self.params.reserved_tokens) + chars + reached

    def learn_with_thresh(self, thresh: int) -> list[str]:
        """`library.learn_with_thresh(self.filtered, thresh, params)`."""
        if thresh in self._vocabs:
            return self._vocabs[thresh]
        library, p = _library(), self.params
        if thresh <= 0 or not self._positive:  # outside what the suffix argument covers: the library's own pass
            vocab = library.learn_with_thresh(self.filtered, thresh, p)
        else:
            tokens = library.ensure_all_tokens_exist(self.char_tokens, {}, p.include_joiner_token, p.joiner)
            for iteration in range(p.num_iterations):
                counts = self._first_counts(thresh) if iteration == 0 else self._suffix_counts(tokens, thresh)
                chosen = {}
                for length in range(p.max_token_length, 0, -1):  # longest first: a later equal string wins, as there
                    for token, count in counts[length].items():
                        if count >= thresh:
                            chosen[token] = count
                tokens = library.ensure_all_tokens_exist(self.char_tokens, chosen, p.include_joiner_token, p.joiner)
            vocab = library.generate_final_vocabulary(p.reserved_tokens, self.char_tokens, tokens)
        self._vocabs[thresh] = vocab
        return vocab

    def _first_counts(self, thresh: int) -> list[dict[str, int]]:
        """Iteration 0 (every letter a piece boundary), kept for every pass down to the lowest
        threshold asked so far: only counts >= that threshold are kept, as no pass reads others."""
        if self._first is None or self._first[0] > thresh:
            self._first = (thresh, self._counts(None, thresh))
        return self._first[1]

    def _suffix_counts(self, tokens: dict[str, int], thresh: int) -> list[dict[str, int]]:
        """Iterations after the first: piece boundaries where the greedy longest-match split by the
        current tokens puts them (library.get_split_indices); words it cannot split are left out.
        Only counts >= thresh (the only ones read)."""
        return self._counts(tokens, thresh)

    def _counts(self, tokens: dict[str, int] | None, thresh: int) -> list[dict[str, int]]:
        """`count_suffixes` over all words (tokens None: iteration 0), counts >= thresh only."""
        p = self.params
        if self.workers == 1:
            counts = count_suffixes(self.filtered, tokens, p.max_token_length, p.include_joiner_token, p.joiner)
            return [{t: c for t, c in d.items() if c >= thresh} for d in counts]
        if self._pool is None:
            self._pool = _Workers(self.filtered, self.workers, p.max_token_length, p.include_joiner_token, p.joiner)
        return self._pool.counts(tokens, thresh)


def _library():
    """tensorflow_text's learner module, imported when first used (not in worker processes: it loads TensorFlow)."""
    from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib
    return wordpiece_tokenizer_learner_lib


def split_indices(word: str, tokens: dict[str, int], include_joiner_token: bool, joiner: str) -> list[int] | None:
    """`library.get_split_indices` (the same code; a copy so worker processes need not import TensorFlow)."""
    indices, start, n = [], 0, len(word)
    while start < n:
        end = n
        while end > start:
            piece = word[start:end]
            if include_joiner_token and start > 0:
                piece = joiner + piece
            if piece in tokens:
                indices.append(end)
                break
            end -= 1
        if end == start:
            return None
        start = end
    return indices


def count_suffixes(words: Sequence[tuple[str, int]], tokens: dict[str, int] | None, max_token_length: int,
                   include_joiner_token: bool, joiner: str) -> list[dict[str, int]]:
    """[length] -> {suffix from a piece boundary (joiner-prefixed after the first letter): total count}.
    Boundaries: every letter when tokens is None (iteration 0), else `split_indices` by tokens."""
    counts: list[dict[str, int]] = [dict() for _ in range(max_token_length + 1)]
    prefix = joiner if include_joiner_token else ""
    for word, count in words:
        n = len(word)
        boundaries = range(1, n + 1) if tokens is None else split_indices(word, tokens, include_joiner_token, joiner)
        if not boundaries:
            continue
        start = 0
        for boundary in boundaries:  # suffixes start at 0 and at every boundary but the last (the word's end)
            suffix = word[start:] if start == 0 else prefix + word[start:]
            table = counts[n - start]
            table[suffix] = table.get(suffix, 0) + count
            start = boundary
    return counts


class _Workers:
    """Processes each holding one contiguous slice of the words and its last counts. A total >= thresh
    has a slice count >= ceil(thresh / workers), so: every slice sends those (candidates), then every
    slice sends its counts of all candidates, summed here in slice order; totals >= thresh are kept."""

    def __init__(self, words: list[tuple[str, int]], workers: int, *args):
        context = multiprocessing.get_context("spawn")
        size = -(-len(words) // workers)
        self._conns, self._procs = [], []
        try:
            for i in range(workers):
                parent, child = context.Pipe()
                proc = context.Process(target=_serve, args=(child, words[i * size:(i + 1) * size]) + args,
                                       daemon=True)
                proc.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(proc)
        except BaseException:
            self.close()
            raise

    def counts(self, tokens: dict[str, int] | None, thresh: int) -> list[dict[str, int]]:
        floor = -(-thresh // len(self._conns))
        for conn in self._conns:
            conn.send(("count", tokens, floor))
        candidates: list[dict[str, None]] = []
        for conn in self._conns:  # slice order: the same keys in the same order on every run
            part = self._recv(conn)
            if not candidates:
                candidates = [dict() for _ in part]
            for table, keys in zip(candidates, part):
                table.update(dict.fromkeys(keys))
        keys = [list(table) for table in candidates]
        for conn in self._conns:
            conn.send(("lookup", keys))
        totals = [[0] * len(k) for k in keys]
        for conn in self._conns:
            for total, part in zip(totals, self._recv(conn)):
                for i, c in enumerate(part):
                    total[i] += c
        return [{t: c for t, c in zip(k, total) if c >= thresh} for k, total in zip(keys, totals)]

    @staticmethod
    def _recv(conn):
        reply = conn.recv()
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(("stop",))
            except OSError:
                pass
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []


def _serve(conn, words: list[tuple[str, int]], *args) -> None:
    """A worker: ("count", tokens, floor) -> keys with slice count >= floor per length (counts kept);
    ("lookup", keys per length) -> the kept counts of those keys; ("stop",) ends it."""
    counts: list[dict[str, int]] = []
    while True:
        message = conn.recv()
        try:
            if message[0] == "stop":
                return
            if message[0] == "count":
                _, tokens, floor = message
                counts = count_suffixes(words, tokens, *args)
                conn.send([[t for t, c in d.items() if c >= floor] for d in counts])
            else:
                conn.send([[d.get(t, 0) for t in keys] for d, keys in zip(counts, message[1])])
        except Exception as error:  # noqa: BLE001 - handed to the parent, which raises it
            conn.send(error)
