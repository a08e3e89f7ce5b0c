"""A masking vocabulary's n-grams checked against the word splitting: `vocab check` and `corpus
prepare --units` both need it, so it lives below both stages."""
from __future__ import annotations

import collections
from typing import Sequence

from pmi_jax.formats.masking_vocab import MAX_N, MIN_N


def check_ngrams(ngrams: Sequence[tuple[str, ...]], max_examples: int = 3, normalisation: bool = True) -> list[str]:
    """Problems of a masking vocabulary, one line each; empty if it can be used as is.

    An entry is valid iff splitting its text into words (preprocess/text/words.py) gives back exactly
    its words: upper case, accents, or punctuation attached to a word mean the list was made in
    another normalisation and would never match the corpus. Lengths outside 2..5 and duplicate
    entries are reported with their counts. `normalisation=False` skips the word check, for words
    of another tokenizer (preprocess/text/hf_tokenizer.py), which need not survive being re-split.
    """
    from pmi_jax.preprocess.text.words import split_words

    problems = []
    lengths = collections.Counter(len(ngram) for ngram in ngrams)
    for n in sorted(lengths):
        if not MIN_N <= n <= MAX_N:
            problems.append(f"{lengths[n]} entries have {n} words (expected {MIN_N} to {MAX_N})")
    texts = [" ".join(ngram) for ngram in ngrams]
    normalised = split_words(texts) if texts and normalisation else [list(g) for g in ngrams]
    wrong = [(t, " ".join(words)) for t, ngram, words in zip(texts, ngrams, normalised) if list(ngram) != words]
    if wrong:
        examples = ", ".join(f"{t!r} (as words: {w!r})" for t, w in wrong[:max_examples])
        problems.append(f"{len(wrong)} entries are not in the uncased BERT word normalisation, e.g. {examples}")
    duplicates = [t for t, c in collections.Counter(texts).items() if c > 1]
    if duplicates:
        problems.append(f"{len(duplicates)} entries appear more than once, e.g. "
                        + ", ".join(repr(t) for t in duplicates[:max_examples]))
    return problems
