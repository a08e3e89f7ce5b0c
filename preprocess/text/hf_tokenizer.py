"""Your own tokenizer (docs/tokenizers.md): a Hugging Face `tokenizer.json`, or a cased BERT vocab.txt.

The default (uncased BERT vocab.txt) path is tensorflow_text's (preprocess/text/words.py,
preprocess/corpus/wordpiece.py); any other tokenizer runs here through the `tokenizers` library,
so the ids written are the ids it produces: words are its normalizer's and pre-tokenizer's,
ids are `encode(document, add_special_tokens=False)` with special tokens encoded as text, and
`--cased` vocab.txt is BertTokenizer with do_lower_case=False. BERT's special-token names are
required. Details: docs/design.md, "Module notes", hf_tokenizer.py.
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
from typing import Sequence

import numpy as np

from pmi_jax import storage
from pmi_jax.errors import UserInputError
from pmi_jax.formats import wordpiece_vocab


_PROBE = "The United States Air Force was formed in 1947.\nIt flies."
_SPACE = re.compile(r"\s")


class HFTokenizer:
    """A `tokenizers.Tokenizer` with the settings corpus preparation needs, and its identity."""

    def __init__(self, json_text: str, source: str):
        import tokenizers

        try:
            self.tokenizer = tokenizers.Tokenizer.from_str(json_text)
        except Exception as e:  # tokenizers raises plain Exception subclasses on a bad file
            raise UserInputError(f"--tokenizer {source}: not a Hugging Face tokenizer.json ({e})") from None
        self.json_text, self.source = json_text, source
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.tokenizer.encode_special_tokens = True
        if self.tokenizer.pre_tokenizer is None:
            raise UserInputError(f"--tokenizer {source}: has no pre-tokenizer, so it has no words for masking "
                                 "units to align with")
        plain_added = [t.content for t in self.tokenizer.get_added_tokens_decoder().values() if not t.special]
        if plain_added:
            raise UserInputError(f"--tokenizer {source}: added tokens that are not special ({plain_added[0]!r}, ...) "
                                 "split words apart from the pre-tokenizer; not supported")
        self.tokens = self._tokens()
        self.words([_PROBE])  # a pre-tokenizer that keeps spaces inside words is refused before any input is read

    @property
    def model(self) -> str:
        return json.loads(self.json_text)["model"]["type"]

    @functools.cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.json_text.encode("utf-8")).hexdigest()

    @functools.cached_property
    def words_sha256(self) -> str:
        """Identity of the word splitting alone (normalizer and pre-tokenizer): a masking vocabulary
        built with one tokenizer fits a corpus prepared with any other that splits words alike."""
        spec = json.loads(self.json_text)
        parts = {"normalizer": spec.get("normalizer"), "pre_tokenizer": spec.get("pre_tokenizer")}
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode("utf-8")).hexdigest()

    def _tokens(self) -> list[str]:
        """The vocabulary by id, as vocab.txt holds it (the seqio vocabulary and training read that)."""
        vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        tokens = [""] * len(vocab)
        for token, i in vocab.items():
            if i >= len(tokens):
                raise UserInputError(f"--tokenizer {self.source}: token ids are not 0..{len(vocab) - 1}")
            tokens[i] = token
        lined = [t for t in tokens if "\n" in t or "\r" in t]
        if lined:
            raise UserInputError(f"--tokenizer {self.source}: token {lined[0]!r} holds a line break, which a "
                                 "vocab.txt cannot")
        try:
            wordpiece_vocab.check_bert_vocab(tokens, self.source)
        except UserInputError as e:
            raise UserInputError(str(e).replace("--wordpiece ", "--tokenizer ", 1)) from None
        return tokens

    def words(self, documents: Sequence[str]) -> list[list[str]]:
        """The words of each document: the normalizer, then the pre-tokenizer."""
        normalize = self.tokenizer.normalizer.normalize_str if self.tokenizer.normalizer else (lambda s: s)
        split = self.tokenizer.pre_tokenizer.pre_tokenize_str
        words = [[w for w, _ in split(normalize(doc))] for doc in documents]
        for document in words:
            if _SPACE.search("".join(document)):  # one search per document; the word only for the message
                spaced = next(w for w in document if _SPACE.search(w))
                raise UserInputError(f"--tokenizer {self.source}: its pre-tokenizer makes words holding white space "
                                     f"({spaced[:40]!r}); masking units need words without it (docs/tokenizers.md)")
        return words

    def words_flat(self, documents: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """As `pmi_jax.preprocess.text.words.split_words_flat`: (bytes per word, row_splits [documents + 1])."""
        per_document = self.words(documents)
        flat = np.array([w.encode("utf-8") for words in per_document for w in words] or [], dtype=object)
        row_splits = np.cumsum([0] + [len(words) for words in per_document]).astype(np.int64)
        return flat, row_splits

    def word_spans(self, documents: Sequence[str]):
        """As `pmi_jax.preprocess.text.words.split_words_spans`: the words as spans of one byte buffer."""
        from pmi_jax.preprocess.text.words import SPAN_PADDING, WordSpans

        flat, row_splits = self.words_flat(documents)
        lengths = np.fromiter(map(len, flat), np.int64, len(flat))
        starts = np.cumsum(lengths) - lengths
        buffer = np.frombuffer(b"".join(list(flat) + [bytes(SPAN_PADDING)]), np.uint8)
        return WordSpans(buffer=buffer, starts=starts, lengths=lengths, row_lengths=np.diff(row_splits))

    def encode(self, documents: Sequence[str]) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """(words [W], doc_word_splits [D + 1], ids [P] int64, word_token_splits [W + 1]).

        ids are `tokenizers`' own for each whole document, concatenated; word w owns
        ids[word_token_splits[w]:word_token_splits[w + 1]] (none for a word the model drops).
        """
        encodings = self.tokenizer.encode_batch(list(documents), add_special_tokens=False)
        per_document = self.words(documents)
        ids, counts = [], []
        for doc, words, encoding in zip(documents, per_document, encodings):
            word_ids = np.asarray([-1 if w is None else w for w in encoding.word_ids], np.int64)
            if len(word_ids) and (word_ids.min() < 0 or word_ids.max() >= len(words)
                                  or np.any(np.diff(word_ids) < 0)):
                raise UserInputError(f"--tokenizer {self.source}: its tokens do not follow its pre-tokenizer's words "
                                     f"in the document starting {doc[:60]!r}")
            ids.append(np.asarray(encoding.ids, np.int64))
            counts.append(np.bincount(word_ids, minlength=len(words)))
        flat_words = [w for words in per_document for w in words]
        doc_word_splits = np.cumsum([0] + [len(words) for words in per_document]).astype(np.int64)
        pieces = np.concatenate(counts) if counts else np.zeros([0], np.int64)
        word_token_splits = np.concatenate([[0], np.cumsum(pieces)]).astype(np.int64)
        return flat_words, doc_word_splits, (np.concatenate(ids) if ids else np.zeros([0], np.int64)), \
            word_token_splits


def cased_bert_json(tokens: Sequence[str]) -> str:
    """tokenizer.json of BERT's cased WordPiece over `tokens` (HF BertTokenizer, do_lower_case=False)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    specials = wordpiece_vocab.special_ids(tokens)
    tokenizer = Tokenizer(models.WordPiece({t: i for i, t in enumerate(tokens)}, unk_token="[UNK]",
                                           max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False,
                                                      lowercase=False)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    tokenizer.post_processor = processors.BertProcessing(("[SEP]", specials["sep"]), ("[CLS]", specials["cls"]))
    tokenizer.add_special_tokens(list(wordpiece_vocab.SPECIAL_TOKENS))
    return tokenizer.to_str()


def is_tokenizer_json(path: str) -> bool:
    return path.endswith(".json")


def select(path: str | None, cased: bool = False) -> HFTokenizer | None:
    """--tokenizer PATH [--cased] -> the tokenizer, or None for the default path (tensorflow_text's uncased
    BERT: no --tokenizer, or a vocab.txt without --cased)."""
    if path is None:
        if cased:
            raise UserInputError("--cased: give the cased vocab.txt with --tokenizer VOCAB_TXT")
        return None
    if not is_tokenizer_json(path) and not cased:
        return None
    return load_cached(path, cased)


def load(path: str, cased: bool = False) -> HFTokenizer:
    """A tokenizer.json (whose own normalizer says whether it is cased), or a vocab.txt as cased BERT."""
    if is_tokenizer_json(path):
        if not storage.gfile.exists(path):
            raise UserInputError(f"--tokenizer {path}: no such file")
        with storage.gfile.GFile(path, "rb") as f:
            return HFTokenizer(f.read().decode("utf-8", errors="strict"), path)
    return HFTokenizer(cased_bert_json(wordpiece_vocab.load_vocab(path)), path)


@functools.lru_cache(maxsize=4)
def load_cached(path: str, cased: bool = False) -> HFTokenizer:
    """`load`, once per process: Beam workers and thread pools share one tokenizer."""
    return load(path, cased)
