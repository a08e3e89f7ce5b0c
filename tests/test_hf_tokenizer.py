"""Your own tokenizer (preprocess/text/hf_tokenizer.py): `vocab build` and `corpus prepare --tokenizer`.

Tokenizers are trained here with `tokenizers` on real English (the demo corpus) plus documents
with capitals, accents, CJK, runs of white space and literal special-token text: a cased
WordPiece (BERT's normalizer without lower-casing), a SentencePiece-style Unigram (Metaspace) and
a byte-level BPE. What a prepared corpus holds is checked against `tokenizers` itself: every
document's ids, and which ids form one word (the encoding's word_ids).
"""
from __future__ import annotations

import itertools
import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from pmi_jax.cli import main
from pmi_jax.errors import UserInputError
from pmi_jax.formats import prepared_corpus
from pmi_jax.preprocess.text import hf_tokenizer
from pmi_jax.preprocess.vocab import build_vocab
from pmi_jax.preprocess.vocab.build_vocab import VocabOptions
from pmi_jax.preprocess.text.demo_corpus import iter_demo_documents
from pmi_jax.preprocess.corpus.prepare import Assignment, PrepareConfig, in_shard_order, prepare
from tests import hf_tokenizers

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
EXTRA = ["The United States Air Force and the united states air force.", "Naïve café in Zürich, ÉCOLE normale.",
         "北京大学 is in 北京.", "Two  spaces,\ttab and   more.", "A literal [SEP] and [MASK] inside the text."]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("corpus")
    docs = list(itertools.islice(iter_demo_documents(), 400)) + EXTRA * 12
    (root / "a.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return {"path": root / "a.txt", "docs": docs, "root": root}


def _train(tokenizer: Tokenizer, trainer, docs, path: pathlib.Path) -> pathlib.Path:
    tokenizer.train_from_iterator(docs, trainer)
    tokenizer.save(str(path))
    return path


@pytest.fixture(scope="module")
def tokenizers_(corpus) -> dict[str, pathlib.Path]:
    root, docs = corpus["root"], corpus["docs"]
    cased = hf_tokenizers.cased_wordpiece()
    unigram = hf_tokenizers.unigram()
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    paths = {
        "wordpiece_cased": _train(cased, trainers.WordPieceTrainer(vocab_size=1500, special_tokens=SPECIAL), docs,
                                  root / "cased.json"),
        "unigram": _train(unigram, trainers.UnigramTrainer(vocab_size=1200, special_tokens=SPECIAL, unk_token="[UNK]"),
                          docs, root / "unigram.json"),
        "bpe": _train(bpe, trainers.BpeTrainer(vocab_size=1200, special_tokens=SPECIAL,
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
                      docs, root / "bpe.json"),
    }
    vocab = sorted(json.loads(paths["wordpiece_cased"].read_text())["model"]["vocab"].items(), key=lambda kv: kv[1])
    (root / "cased_vocab.txt").write_text("".join(t + "\n" for t, _ in vocab), encoding="utf-8")
    paths["vocab_txt"] = root / "cased_vocab.txt"
    return paths


def _reference(path: pathlib.Path) -> Tokenizer:
    """The tokenizer as a user loads it, with literal special-token text read as text."""
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.encode_special_tokens = True
    return tokenizer


def _sequences(data_dir: pathlib.Path) -> list[dict[str, np.ndarray]]:
    paths = prepared_corpus.PreparedCorpus(str(data_dir)).files("train")
    return [prepared_corpus.decode_example(r) for r in tf.data.TFRecordDataset(paths).as_numpy_iterator()]


def _prepare(corpus, tokenizer, out, units=(), cased=False, seq_len=128):
    return prepare(PrepareConfig(inputs=(str(corpus["path"]),), output=str(out), tokenizer=str(tokenizer), cased=cased,
                                 units=tuple(units), seq_len=seq_len, validation_fraction=0.0, shards=2,
                                 progress=False))


@pytest.mark.parametrize("kind", ["wordpiece_cased", "unigram", "bpe"])
def test_ids_and_words_are_the_tokenizers_own(corpus, tokenizers_, tmp_path, kind):
    metadata = _prepare(corpus, tokenizers_[kind], tmp_path / "data")
    special = metadata["special_ids"]
    reference = _reference(tokenizers_[kind])
    in_shards = in_shard_order(corpus["docs"], Assignment(0, 0.0, 2, 0))["train"]  # _prepare's seed and shards
    encodings = reference.encode_batch(in_shards, add_special_tokens=False)
    expected_ids = np.concatenate([e.ids for e in encodings])
    # a token starts a word where the encoding's word index changes (or a document begins)
    expected_start = np.concatenate([np.diff(np.asarray(e.word_ids), prepend=-1) != 0 for e in encodings])
    sequences = _sequences(tmp_path / "data")
    body = [s["word_ids"] >= 0 for s in sequences]
    ids = np.concatenate([s["input_ids"][b] for s, b in zip(sequences, body)])
    np.testing.assert_array_equal(ids, expected_ids)
    if kind != "unigram":  # (a Unigram model may pick its "[SEP]" piece for the text "[SEP]": docs/tokenizers.md)
        assert not np.isin(ids, [special["cls"], special["sep"], special["mask"]]).any()  # literal [SEP] is text
    starts, first = [], []
    for s, b in zip(sequences, body):
        word_ids = s["word_ids"][b]
        starts.append(np.diff(word_ids, prepend=-1) != 0)
        first.append(np.arange(len(word_ids)) == 0)  # a sequence cut inside a word restarts its numbering
    starts, first = np.concatenate(starts), np.concatenate(first)
    np.testing.assert_array_equal(starts[~first], expected_start[~first])
    assert expected_start.sum() > 10_000 and (~expected_start).sum() > 1_000  # many words, many in pieces
    written = (tmp_path / "data" / "tokenizer.json").read_bytes()
    assert written == tokenizers_[kind].read_bytes()
    assert (tmp_path / "data" / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1] == \
        [reference.id_to_token(i) for i in range(reference.get_vocab_size())]
    assert metadata["tokenizer"]["model"] == {"wordpiece_cased": "WordPiece", "unigram": "Unigram", "bpe": "BPE"}[kind]


def test_cased_vocab_txt_is_bert_cased(corpus, tokenizers_, tmp_path):
    """--tokenizer vocab.txt --cased gives transformers' cased BertTokenizerFast ids, and the shards of the
    tokenizer.json that vocabulary came from."""
    from transformers import BertTokenizerFast

    _prepare(corpus, tokenizers_["vocab_txt"], tmp_path / "txt", cased=True)
    _prepare(corpus, tokenizers_["wordpiece_cased"], tmp_path / "json")
    bert = BertTokenizerFast(vocab_file=str(tokenizers_["vocab_txt"]), do_lower_case=False, split_special_tokens=True)
    expected = np.concatenate([bert(d, add_special_tokens=False)["input_ids"] for d in
                               in_shard_order(corpus["docs"], Assignment(0, 0.0, 2, 0))["train"]])
    ids = np.concatenate([s["input_ids"][s["word_ids"] >= 0] for s in _sequences(tmp_path / "txt")])
    np.testing.assert_array_equal(ids, expected)
    for name in ("train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord", "vocab.txt"):
        assert (tmp_path / "txt" / name).read_bytes() == (tmp_path / "json" / name).read_bytes(), name


@pytest.mark.parametrize("kind", ["wordpiece_cased", "unigram"])
def test_vocab_build_counts_the_tokenizers_words_and_units_align(corpus, tokenizers_, tmp_path, kind):
    vocab_dir = tmp_path / "vocab"
    stats = build_vocab.build_vocabulary([str(corpus["path"])], str(vocab_dir),
                                         VocabOptions(size=200, min_count=5, workers=1,
                                                      tokenizer=str(tokenizers_[kind])))
    tokenizer = hf_tokenizer.load(str(tokenizers_[kind]))
    words = tokenizer.words(corpus["docs"])
    assert stats["words"] == sum(map(len, words))
    assert stats["tokenizer"]["words_sha256"] == tokenizer.words_sha256
    known = {w for doc in words for w in doc}
    entries = [line.split(" ") for line in (vocab_dir / "masking_vocab.txt").read_text("utf-8").splitlines()]
    assert all(w in known for entry in entries for w in entry)
    if kind == "wordpiece_cased":
        assert ["United", "States"] in entries or ["States", "Air", "Force"] in entries  # case kept
    else:
        assert all(w.startswith("▁") for entry in entries for w in entry if w.isalpha() or w[1:].isalpha())

    _prepare(corpus, tokenizers_[kind], tmp_path / "data", units=[("pmi", str(vocab_dir))])
    sequences = _sequences(tmp_path / "data")
    multiword = 0
    for s in sequences:
        b = s["word_ids"] >= 0
        word_ids, units = s["word_ids"][b], s["units_pmi"][b]
        unit_start = np.diff(units, prepend=-1) != 0
        word_start = np.diff(word_ids, prepend=-1) != 0
        assert not (unit_start & ~word_start).any()  # a unit never starts inside a word
        multiword += len(np.unique(units)) < len(np.unique(word_ids))
    assert multiword > 0


def test_a_masking_vocabulary_of_other_words_is_refused(corpus, tokenizers_, tmp_path):
    bert_words = tmp_path / "bert_vocab"
    build_vocab.build_vocabulary([str(corpus["path"])], str(bert_words), VocabOptions(size=100, min_count=5, workers=1))
    with pytest.raises(UserInputError, match="built on BERT's uncased words, but this corpus is split into the words "
                                             "of --tokenizer"):
        _prepare(corpus, tokenizers_["unigram"], tmp_path / "data", units=[("pmi", str(bert_words))])
    assert not (tmp_path / "data").exists()


def test_cli_tokenizer_errors(corpus, tokenizers_, tmp_path, capsys):
    no_mask = tmp_path / "no_mask.json"
    spec = json.loads(tokenizers_["bpe"].read_text())
    for token in spec["added_tokens"]:
        token["content"] = token["content"].replace("[MASK]", "<mask>")
    spec["model"]["vocab"]["<mask>"] = spec["model"]["vocab"].pop("[MASK]")
    no_mask.write_text(json.dumps(spec))
    cases = [
        (["--tokenizer", str(no_mask)], "no_mask.json: special token(s) [MASK] missing"),
        (["--tokenizer", str(tmp_path / "absent.json")], "absent.json: no such file"),
        (["--cased"], "--cased: give the cased vocab.txt with --tokenizer VOCAB_TXT"),
    ]
    for extra, message in cases:
        status = main(["corpus", "prepare", "--input", str(corpus["path"]), "--output", str(tmp_path / "out"),
                       "--no-progress", *extra])
        assert status == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "out").exists()


def test_export_writes_the_corpus_tokenizer_for_transformers(corpus, tokenizers_, tmp_path):
    """`export hf` of a model trained on a --tokenizer corpus: transformers' AutoTokenizer gives
    [CLS] + the ids corpus prepare wrote + [SEP]."""
    import transformers

    from pmi_jax.formats import hf_checkpoint

    metadata = _prepare(corpus, tokenizers_["unigram"], tmp_path / "data")
    tokens = (tmp_path / "data" / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    text = prepared_corpus.read_tokenizer(str(tmp_path / "data"), metadata)
    out = tmp_path / "hf"
    out.mkdir()
    hf_checkpoint.write_checkpoint(str(out), {"model_type": "bert", "vocab_size": len(tokens)}, {}, tokens, 128,
                                   "card", corpus_tokenizer=text)
    loaded = transformers.AutoTokenizer.from_pretrained(str(out))
    special = metadata["special_ids"]
    reference = _reference(tokenizers_["unigram"])
    for doc in corpus["docs"][:50] + EXTRA[:4]:
        expected = [special["cls"]] + reference.encode(doc, add_special_tokens=False).ids + [special["sep"]]
        assert loaded(doc)["input_ids"] == expected
    assert loaded.mask_token_id == special["mask"] and loaded.pad_token_id == 0
    with pytest.raises(UserInputError, match="does not hold the model's vocabulary"):
        hf_checkpoint.write_checkpoint(str(tmp_path), {}, {}, tokens[:-1], 128, "card", corpus_tokenizer=text)


def test_beam_pipelines_take_the_tokenizer_too(corpus, tokenizers_, tmp_path):
    """vocab build and corpus prepare on Beam (DirectRunner) with --tokenizer: the local outputs, byte for byte."""
    tokenizer = str(tokenizers_["unigram"])
    local_vocab = tmp_path / "local_vocab"
    build_vocab.build_vocabulary([str(corpus["path"])], str(local_vocab),
                                 VocabOptions(size=200, min_count=5, workers=1, tokenizer=tokenizer))
    assert main(["vocab", "build", "--input", str(corpus["path"]), "--output", str(tmp_path / "beam_vocab"),
                 "--size", "200", "--min-count", "5", "--tokenizer", tokenizer, "--no-progress",
                 "--runner", "DirectRunner"]) == 0
    beam_rows = (tmp_path / "beam_vocab" / "masking_vocab.tsv").read_bytes()
    assert beam_rows == (local_vocab / "masking_vocab.tsv").read_bytes()
    local = _prepare(corpus, tokenizer, tmp_path / "local", units=[("pmi", str(local_vocab))])
    assert main(["corpus", "prepare", "--input", str(corpus["path"]), "--output", str(tmp_path / "beam"),
                 "--tokenizer", tokenizer, "--units", f"pmi={local_vocab}", "--seq-len", "128",
                 "--validation-fraction", "0", "--shards", "2", "--no-progress", "--runner", "DirectRunner"]) == 0
    assert json.loads((tmp_path / "beam" / "metadata.json").read_text()) == local
    for path in (tmp_path / "local").iterdir():
        assert (tmp_path / "beam" / path.name).read_bytes() == path.read_bytes(), path.name
