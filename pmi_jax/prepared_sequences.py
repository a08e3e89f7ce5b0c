"""The sequences of a prepared corpus decoded to words, each multi-word masking unit in brackets.

What `pmi-jax corpus show` prints, e.g. `[CLS] [the united states] [air force] was ... [SEP]`, to
see what will be masked together; callable without argparse.
"""
from __future__ import annotations

from typing import Iterator

from pmi_jax.errors import UserInputError


def shown_sequences(data_dir: str, split: str = "train", num: int = 3,
                    units: str | None = None) -> Iterator[tuple[int, int, list[tuple[str, str]]]]:
    """(index, tokens, [(unit set or "words", rendering)]) of the first `num` sequences of `split`.

    Every shard's digest is checked first, so damage anywhere is named, not only in what shows;
    `units` picks one unit set (default: every one, one line each; "words" without any).
    """
    import tensorflow as tf

    from pmi_jax.formats import prepared_corpus

    if num < 1:
        raise UserInputError(f"--num {num}: must be at least 1")
    corpus = prepared_corpus.PreparedCorpus(data_dir, digests=True)
    names = list(corpus.unit_names)
    if units is not None and units not in names:
        raise UserInputError(f"--units {units}: {data_dir} has units for {', '.join(names) or 'no vocabulary'}")
    names = [units] if units else names
    paths = corpus.files(split)
    vocab = corpus.tokens
    records = tf.data.TFRecordDataset(paths).take(num)
    try:
        with prepared_corpus.reading(data_dir):  # a shard whose bytes changed is named
            for i, record in enumerate(records.as_numpy_iterator()):
                features = prepared_corpus.decode_example(record)
                tokens = [vocab[t] for t in features[prepared_corpus.INPUT_IDS]]
                word_ids = features[prepared_corpus.WORD_IDS]
                yield i, len(tokens), [
                    (name or "words", render_sequence(tokens, word_ids, features[prepared_corpus.units_feature(name)]
                                                      if name else word_ids)) for name in names or [None]]
    except (IndexError, KeyError) as e:
        raise UserInputError(f"{data_dir}: a {split} shard is damaged ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:200]}); rerun the same `pmi-jax corpus prepare`") from None


def _escape(word: str) -> str:
    from pmi_jax.formats.wordpiece_vocab import SPECIAL_TOKENS

    if word in SPECIAL_TOKENS:
        return word  # [UNK]: a vocabulary entry, not brackets of the text
    return word.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")


def render_sequence(tokens: list[str], word_ids, unit_ids) -> str:
    """Tokens -> text with WordPieces joined into words and each multi-word unit in brackets.

    Special tokens (word id -1) print as themselves; single-word units print bare; a bracket or
    backslash inside a word is escaped with a backslash, so the rendering is unambiguous.
    """
    groups: list[tuple[int, list[str]]] = []  # (unit, words of the unit)
    previous_word = None
    for token, word, unit in zip(tokens, word_ids, unit_ids):
        if word < 0:
            groups.append((-1, [token]))
            previous_word = None
            continue
        if groups and groups[-1][0] == unit and unit >= 0:
            if word == previous_word:
                groups[-1][1][-1] += token[2:] if token.startswith("##") else token
            else:
                groups[-1][1].append(token)
        else:
            groups.append((unit, [token]))
        previous_word = word
    shown = []
    for unit, words in groups:
        if unit < 0:
            shown.append(words[0])
        elif len(words) > 1:
            shown.append("[" + " ".join(map(_escape, words)) + "]")
        else:
            shown.append(_escape(words[0]))
    return " ".join(shown)
