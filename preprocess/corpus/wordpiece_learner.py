"""tensorflow_text's WordPiece learner, computed in time linear in the word lengths: the same vocabulary.

The library's passes count every substring from a piece boundary (O(L²) per word), then subtract
from each the counts of its extensions; what is left of a substring t is the total count of the
words whose suffix from a piece boundary is t. This module counts those suffixes directly and
calls the library's own functions for everything else; the first iteration, the same for every
threshold, is counted once. Same tokens, same order (tests/test_wordpiece.py). Details:
docs/design.md, "Module notes", wordpiece_learner.py; figures: benchmarks/README.md.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as library


class WordPieceLearner:
    """The library's `learn` over fixed word counts, with what every pass shares computed once."""

    def __init__(self, word_counts: Iterable[tuple[str, int]], vocab_size: int, reserved_tokens: Sequence[str],
                 num_iterations: int = 4, max_input_tokens: int | None = int(5e6), max_token_length: int = 50,
                 max_unique_chars: int = 1000, slack_ratio: float = 0.05, include_joiner_token: bool = True,
                 joiner: str = "##"):
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

    def learn(self, upper_thresh: int | None = int(1e7), lower_thresh: int | None = 10) -> list[str]:
        """`library.learn(word_counts, vocab_size, reserved_tokens, upper_thresh, lower_thresh, ...)`."""
        upper, lower = library.get_search_threshs(self.word_counts, upper_thresh, lower_thresh)
        slack = max(self.params.slack_ratio * self.params.vocab_size, 0)
        while True:  # library.learn_binary_search, as a loop
            thresh = (upper + lower) // 2
            vocab = self.learn_with_thresh(thresh)
            size = len(vocab)
            if (size <= self.params.vocab_size and self.params.vocab_size - size <= slack) or lower >= upper \
                    or thresh <= 1:
                return vocab
            if size > self.params.vocab_size:
                lower = thresh + 1
            else:
                upper = thresh - 1

    def learn_with_thresh(self, thresh: int) -> list[str]:
        """`library.learn_with_thresh(self.filtered, thresh, params)`."""
        if thresh in self._vocabs:
            return self._vocabs[thresh]
        p = self.params
        if thresh <= 0 or not self._positive:  # outside what the suffix argument covers: the library's own pass
            vocab = library.learn_with_thresh(self.filtered, thresh, p)
        else:
            tokens = library.ensure_all_tokens_exist(self.char_tokens, {}, p.include_joiner_token, p.joiner)
            for iteration in range(p.num_iterations):
                counts = self._first_counts(thresh) if iteration == 0 else self._suffix_counts(tokens)
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
            every = [(word, count, range(1, len(word) + 1)) for word, count in self.filtered]
            counts = self._count_suffixes(every)
            self._first = (thresh, [{t: c for t, c in d.items() if c >= thresh} for d in counts])
        return self._first[1]

    def _suffix_counts(self, tokens: dict[str, int]) -> list[dict[str, int]]:
        """Iterations after the first: piece boundaries where the greedy longest-match split by the
        current tokens puts them (library.get_split_indices); words it cannot split are left out."""
        p = self.params
        split = library.get_split_indices
        return self._count_suffixes((word, count, split(word, tokens, p.include_joiner_token, p.joiner))
                                    for word, count in self.filtered)

    def _count_suffixes(self, words) -> list[dict[str, int]]:
        """[length] -> {suffix from a piece boundary (joiner-prefixed after the first letter): total count}."""
        p = self.params
        counts: list[dict[str, int]] = [dict() for _ in range(p.max_token_length + 1)]
        joiner = p.joiner if p.include_joiner_token else ""
        for word, count, boundaries in words:
            if not boundaries:
                continue
            n, start = len(word), 0
            for boundary in boundaries:  # suffixes start at 0 and at every boundary but the last (the word's end)
                suffix = word[start:] if start == 0 else joiner + word[start:]
                table = counts[n - start]
                table[suffix] = table.get(suffix, 0) + count
                start = boundary
        return counts
