"""Fine-tuning a model pretrained with `corpus prepare --tokenizer`: task text is encoded with the
corpus's own tokenizer.json (pmi_jax/vocabularies.py, `TokenizerVocabulary`), not BERT's uncased
WordPiece.

A cased WordPiece and a SentencePiece-style Unigram (Metaspace) tokenizer are trained here with
`tokenizers` on real English (the demo corpus) plus text with capitals, accents and runs of white
space; a corpus is prepared with each. What fine-tuning encodes is checked against `tokenizers`
itself: GLUE and RACE inputs id for id ([CLS] A [SEP] B [SEP] with the tokenizer's own special
ids), SQuAD contexts id for id with each gold answer cut back out of the context by the token
offsets. Then `eval finetune` runs end to end on a checkpoint of such a corpus and on its
`export hf` directory (`--hf-model`).
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os

import numpy as np
import pytest
from tokenizers import Tokenizer, trainers

from pmi_jax import vocabularies
from pmi_jax.cli import main
from pmi_jax.errors import UserInputError
from pmi_jax.eval import finetune, glue, race, squad
from pmi_jax.formats import hf_checkpoint, prepared_corpus, run_dir
from pmi_jax.storage import file_sha256
from pmi_jax.preprocess.corpus.prepare import PrepareConfig, prepare
from pmi_jax.preprocess.text.demo_corpus import iter_demo_documents
from tests import eval_data, hf_tokenizers

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CITIES = ["Paris", "Zürich", "Oslo", "São Paulo"]
EXTRA = ["The United States Air Force and the united states air force.", "Naïve café in Zürich, ÉCOLE normale.",
         "Two  spaces,\ttab and   more in Oslo.", "São Paulo is a city; Paris is one too."]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict:
    """{kind: (data directory, tokenizer.json path)} for a cased WordPiece and a Unigram tokenizer."""
    root = tmp_path_factory.mktemp("tok")
    docs = list(itertools.islice(iter_demo_documents(), 300)) + EXTRA * 12
    text = root / "a.txt"
    text.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    cased = hf_tokenizers.cased_wordpiece()
    unigram = hf_tokenizers.unigram()
    out = {}
    for kind, tokenizer, trainer in (
            ("wordpiece_cased", cased, trainers.WordPieceTrainer(vocab_size=1200, special_tokens=SPECIAL)),
            ("unigram", unigram, trainers.UnigramTrainer(vocab_size=1000, special_tokens=SPECIAL, unk_token="[UNK]"))):
        tokenizer.train_from_iterator(docs, trainer)
        path = root / f"{kind}.json"
        tokenizer.save(str(path))
        data = root / f"data_{kind}"
        prepare(PrepareConfig(inputs=(str(text),), output=str(data), tokenizer=str(path), seq_len=64,
                              validation_fraction=0.0, shards=1, progress=False))
        out[kind] = (str(data), path)
    return out


def _reference(path) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.encode_special_tokens = True  # "[SEP]" in task text is text, as in pretraining
    return tokenizer


def _vocabulary(data_dir: str):
    metadata = prepared_corpus.read_metadata(data_dir)
    text = prepared_corpus.read_tokenizer(data_dir, metadata)
    return vocabularies.model_vocabulary(prepared_corpus.vocab_path(data_dir), text), metadata["special_ids"]


@pytest.mark.parametrize("kind", ["wordpiece_cased", "unigram"])
def test_glue_and_race_inputs_are_the_tokenizers_own_ids(prepared, kind):
    data_dir, path = prepared[kind]
    vocabulary, special = _vocabulary(data_dir)
    reference = _reference(path)
    assert isinstance(vocabulary, vocabularies.TokenizerVocabulary)
    assert (vocabulary.cls_id, vocabulary.sep_id, vocabulary.pad_id) == (special["cls"], special["sep"], 0)
    texts = EXTRA + ["A literal [SEP] inside.", "PARIS paris Paris"]
    assert vocabulary.encode_batch(texts) == [reference.encode(t, add_special_tokens=False).ids for t in texts]

    examples = [glue.GlueExample(a, b, 0) for i, (a, b) in enumerate(zip(texts, reversed(texts)))]
    encoded = finetune.get_task("glue/rte").encode(examples, vocabulary, 64)
    for row, e in enumerate(examples):
        a, b = (reference.encode(t, add_special_tokens=False).ids for t in (e.text_a, e.text_b))
        expected = [special["cls"], *a, special["sep"], *b, special["sep"]]
        ids = encoded.arrays["input_ids"][row]
        assert ids[:len(expected)].tolist() == expected and not ids[len(expected):].any()
        assert encoded.arrays["token_type_ids"][row].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1) + \
            [0] * (64 - len(expected))

    record = {"article": EXTRA[1], "questions": ["Where is the café?"], "options": [["Zürich", "Oslo", "Rome", "Lima"]],
              "answers": ["A"], "id": "1.txt"}
    examples = race.examples_from_record(record, "high", "1.txt")
    encoded = finetune.get_task("race").encode(examples, vocabulary, 64)
    article = reference.encode(EXTRA[1], add_special_tokens=False).ids
    for option, ids in zip(record["options"][0], encoded.arrays["input_ids"][0]):
        answer = reference.encode(race.question_with_option(record["questions"][0], option),
                                  add_special_tokens=False).ids
        expected = [special["cls"], *article, special["sep"], *answer, special["sep"]]
        assert ids[:len(expected)].tolist() == expected


@pytest.mark.parametrize("kind", ["wordpiece_cased", "unigram"])
def test_squad_contexts_are_the_tokenizers_ids_and_answers_map_back(prepared, kind):
    data_dir, path = prepared[kind]
    vocabulary, _ = _vocabulary(data_dir)
    reference = _reference(path)
    contexts = [f"In  {city}, the café ÉCOLE (founded 1871) met the Air Force." for city in CITIES] + EXTRA
    tokens = squad.tokenize_contexts(vocabulary, contexts)
    for context, t in zip(contexts, tokens):
        assert t.ids.tolist() == reference.encode(context, add_special_tokens=False).ids
        assert (t.char_start <= t.char_end).all() and (t.char_end <= len(context)).all()
    answers = ["Paris", "Zürich", "Oslo", "São Paulo", "café", "ÉCOLE", "1871", "Air Force", "United States",
               "Naïve café", "tab", "Paris"]
    checked = 0
    for context, t in zip(contexts, tokens):
        for answer in answers:
            start = context.find(answer)
            if start < 0:
                continue
            example = squad.SquadExample("q", "where?", context, (answer,), (start,))
            first, last = squad._answer_tokens(example, t)
            assert context[t.char_start[first]:t.char_end[last]] == answer, (kind, context, answer)
            checked += 1
    assert checked >= 12


def test_an_uncased_corpus_keeps_bert_uncased_wordpiece(tmp_path):
    vocab = eval_data.write_vocab(str(tmp_path / "vocab.txt"))
    vocabulary = vocabularies.model_vocabulary(vocab, None)
    assert type(vocabulary) is vocabularies.WordPieceVocabulary
    assert vocabulary.encode_batch(["The CAT sat"]) == [[vocabulary.tokens.index(w) for w in ("the", "cat", "sat")]]


def test_a_tokenizer_of_another_vocabulary_is_refused(prepared, tmp_path):
    data_dir, _ = prepared["unigram"]
    text = prepared_corpus.read_tokenizer(data_dir, prepared_corpus.read_metadata(data_dir))
    vocab = eval_data.write_vocab(str(tmp_path / "vocab.txt"))
    with pytest.raises(UserInputError, match="does not hold the tokens of .* id for id"):
        vocabularies.model_vocabulary(vocab, text, "its tokenizer.json")


def _checkpoint(workdir: str, data_dir: str) -> str:
    tokens = prepared_corpus.vocab_path(data_dir)
    size = len(open(tokens, encoding="utf-8").read().split("\n")) - 1
    config = dataclasses.replace(eval_data.tiny_config(), vocab_size=size)
    return eval_data.save_checkpoint(workdir, config, eval_data.mlm_params(config), data_dir=data_dir,
                                     vocab_sha256=file_sha256(tokens))


def test_finetune_end_to_end_on_a_tokenizer_checkpoint_and_its_export(prepared, tmp_path, capsys):
    data_dir, _ = prepared["unigram"]
    run = _checkpoint(str(tmp_path / "run"), data_dir)
    paragraphs = eval_data.city_questions(12)
    squad_dir = eval_data.write_squad(str(tmp_path / "squad"), paragraphs, paragraphs[:4])
    settings = ["--batch-sizes", "8", "--learning-rates", "1e-4", "--seeds", "1", "--epochs", "1",
                "--max-seq-len", "32"]
    assert main(["eval", "finetune", "--checkpoint", run, "--task", "squad/v2.0", "--data", squad_dir, *settings,
                 "--output", str(tmp_path / "squad_out")]) == 0
    with open(tmp_path / "squad_out" / "results.json") as f:
        assert json.load(f)["task"] == "squad/v2.0"
    metadata = run_dir.CheckpointMetadata(step=7, data_dir=data_dir)
    assert run_dir.corpus_tokenizer_for(metadata) == (prepared["unigram"][1]).read_text(encoding="utf-8")

    exported = str(tmp_path / "hf")
    assert main(["export", "hf", "--checkpoint", run, "--output", exported]) == 0
    assert hf_checkpoint.own_tokenizer(exported) is not None
    rows = [(a.capitalize(), "It was", y) for a, y in eval_data.sentiment(16)]
    rte = eval_data.write_rte(str(tmp_path / "RTE"), rows, rows[:4])
    assert main(["eval", "finetune", "--hf-model", exported, "--task", "glue/rte", "--data", rte, *settings,
                 "--output", str(tmp_path / "rte_out")]) == 0
    with open(tmp_path / "rte_out" / "results.json") as f:
        assert json.load(f)["hf_model"] == exported
    capsys.readouterr()


def test_a_cased_released_model_without_tokenizer_json_is_refused(tmp_path, capsys):
    (tmp_path / hf_checkpoint.TOKENIZER_CONFIG_FILE).write_text(json.dumps({"do_lower_case": False}))
    with pytest.raises(UserInputError, match="names a cased tokenizer but there is no tokenizer.json"):
        hf_checkpoint.own_tokenizer(str(tmp_path))
    (tmp_path / hf_checkpoint.TOKENIZER_CONFIG_FILE).write_text(json.dumps({"do_lower_case": True}))
    assert hf_checkpoint.own_tokenizer(str(tmp_path)) is None
    os.remove(tmp_path / hf_checkpoint.TOKENIZER_CONFIG_FILE)
    assert hf_checkpoint.own_tokenizer(str(tmp_path)) is None  # bert-base-uncased as released
