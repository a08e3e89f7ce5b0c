"""`pmi-jax export hf` and `train --init-from`, checked against transformers itself, offline.

One tiny model is trained through the real pipeline on real English (the first documents of
the demo corpus, prepared with a WordPiece vocabulary trained on them), evaluated, exported,
and loaded by transformers' Flax BERT classes, which read the PyTorch-named safetensors
without PyTorch. Every command runs in-process through `pmi_jax.cli.main`.
"""
import itertools
import json
import os
import shutil

import jax
import numpy as np
import pytest

from pmi_jax import checkpoints, huggingface
from pmi_jax.cli import main
from pmi_jax.errors import UserInputError
from pmi_jax.formats import hf_checkpoint, prepared_corpus
from pmi_jax.model import BertForMaskedLM
from tests import prepared_data

pytestmark = pytest.mark.usefixtures("xla_compilation_cache")

transformers = pytest.importorskip("transformers")  # the bench extra pins it

SIZE = ["model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64",
        "model.max_position_embeddings=64"]
# Warmup of one step and a high rate: four steps move the weights away from their initialisation.
TRAIN = ["train.batch_size=8", "optimizer.warmup_steps=1", "optimizer.peak_learning_rate=1e-2",
         "checkpoint.every_steps=2", "train.log_every_steps=1"]
TOLERANCE = 1e-4  # float32 logits of two implementations of the same network


def _sets(*overrides):
    return [arg for o in overrides for arg in ("--set", o)]


def _train_args(data_dir, workdir, *overrides):
    return ["train", "--config", "tiny", "--data", data_dir, "--scheme", "whole_word", "--workdir", workdir,
            *_sets(*overrides)]


@pytest.fixture(scope="module")
def english(tmp_path_factory):
    """(prepared corpus dir, its documents): 200 documents of the demo corpus, no validation split,
    one shard, so that the train split holds every document in corpus order."""
    from pmi_jax.preprocess.text.demo_corpus import iter_demo_documents
    from pmi_jax.preprocess.corpus.prepare import PrepareConfig, prepare

    root = tmp_path_factory.mktemp("english")
    documents = list(itertools.islice(iter_demo_documents(), 200))
    text = root / "text.txt"
    text.write_text("\n\n".join(documents))
    data_dir = str(root / "data")
    prepare(PrepareConfig(inputs=(str(text),), output=data_dir, seq_len=64, validation_fraction=0.0,
                          wordpiece_size=2000, shards=1, seed=0))
    return data_dir, documents


@pytest.fixture(scope="module")
def run(english, tmp_path_factory):
    """A 4-step run with checkpoints at steps 2 and 4."""
    workdir = str(tmp_path_factory.mktemp("run") / "run")
    assert main(_train_args(english[0], workdir, *SIZE, *TRAIN, "train.num_steps=4")) == 0
    return workdir


@pytest.fixture(scope="module")
def perplexity_json(run, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ppl") / "perplexity.json")
    assert main(["eval", "perplexity", "--checkpoint", run, "--split", "train", "--max-sequences", "4",
                 "--positions", "3", "--output", path]) == 0
    return path


@pytest.fixture(scope="module")
def exported(run, perplexity_json, tmp_path_factory):
    output = str(tmp_path_factory.mktemp("export") / "hf")
    assert main(["export", "hf", "--checkpoint", run, "--output", output, "--perplexity", perplexity_json]) == 0
    return output


def _prepared_batch(data_dir, count=6):
    """The first `count` prepared sequences as padded [B, 64] ids and mask: real text, real ids."""
    sequences = prepared_data.read_prepared_split(data_dir, "train")[:count]
    ids = np.zeros((count, 64), np.int32)
    for row, features in zip(ids, sequences):
        row[:len(features["input_ids"])] = features["input_ids"]
    ids[0, -8:] = 0  # and one row with padding
    return ids, (ids != 0).astype(np.int32)


def _assert_same_real_rows(a_tree, b_tree, vocab_size):
    """Parameter trees equal on every row a checkpoint carries: vocabulary rows past vocab.txt's
    are the model's padding (not exported, zeros on import)."""
    def real_rows(x):
        x = np.asarray(x)
        return x[:vocab_size] if x.ndim and x.shape[0] % 128 == 0 and x.shape[0] > vocab_size else x

    jax.tree.map(lambda a, b: np.testing.assert_array_equal(real_rows(a), real_rows(b)), a_tree, b_tree)


def _our_logits(workdir_or_step, ids, mask):
    config, params, _ = checkpoints.restore_for_eval(workdir_or_step)
    logits = np.asarray(BertForMaskedLM(config).apply({"params": params}, ids, mask, deterministic=True))
    assert np.all(logits[..., config.vocab_size:] == -np.inf)  # the padded rows take no probability
    return logits[..., :config.vocab_size], params


def test_transformers_flax_bert_gives_our_logits(english, run, exported):
    ids, mask = _prepared_batch(english[0])
    ours, _ = _our_logits(run, ids, mask)
    model = transformers.FlaxBertForMaskedLM.from_pretrained(exported)
    theirs = np.asarray(model(ids, attention_mask=mask, token_type_ids=np.zeros_like(ids)).logits)
    assert theirs.shape == ours.shape
    real = mask.astype(bool)  # padding positions' outputs are not part of the contract
    assert np.abs(theirs[real] - ours[real]).max() < TOLERANCE
    assert ours[real].std(axis=-1).min() > 100 * TOLERANCE  # agreement is far from trivial
    config = transformers.AutoConfig.from_pretrained(exported)
    assert (config.architectures, config.hidden_act, config.vocab_size) == (
        ["BertForMaskedLM"], huggingface.hidden_act(), len(open(prepared_corpus.vocab_path(english[0])).readlines()))


def test_transformers_pytorch_bert_gives_our_logits(english, run, exported):
    """The PyTorch class the export is meant for (runs where torch is installed; the dev extras
    leave it out, see docs/huggingface.md): every tensor found, none left over, decoder tied."""
    torch = pytest.importorskip("torch")
    ids, mask = _prepared_batch(english[0])
    ours, _ = _our_logits(run, ids, mask)
    model, info = transformers.AutoModelForMaskedLM.from_pretrained(exported, output_loading_info=True)
    assert not any(info.values()), info
    assert model.cls.predictions.decoder.weight.data_ptr() == model.bert.embeddings.word_embeddings.weight.data_ptr()
    with torch.no_grad():
        theirs = model.eval()(input_ids=torch.from_numpy(ids).long(),
                              attention_mask=torch.from_numpy(mask).long()).logits.numpy()
    real = mask.astype(bool)
    assert np.abs(theirs[real] - ours[real]).max() < TOLERANCE


def test_exported_tokenizer_gives_the_ids_corpus_prepare_wrote(english, exported):
    data_dir, documents = english
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    special = prepared_corpus.read_metadata(data_dir)["special_ids"]
    assert {name: getattr(tokenizer, f"{name}_token_id") for name in special} == special
    prepared = np.concatenate([s["input_ids"] for s in prepared_data.read_prepared_split(data_dir, "train")])
    prepared = prepared[~np.isin(prepared, [special["cls"], special["sep"]])]
    theirs = np.concatenate([tokenizer(d, add_special_tokens=False)["input_ids"] for d in documents])
    assert len(theirs) == len(prepared) > 10_000
    assert np.array_equal(theirs, prepared)
    encoded = tokenizer("Hello, World!")["input_ids"]
    assert (encoded[0], encoded[-1]) == (special["cls"], special["sep"])


# Where NFKC_Casefold (our word splitter's normalisation) differs from BERT's lower-casing, and
# control, format, default-ignorable, full-width, ligature, CJK and accented characters.
TRICKY = ("Straße STRASSE … ﬁne ＡＢＣ１２ ᾳ ᾼ x\u00ady a\x07b é ς ΣΟΦΟΣ İstanbul a\u200bb a\u200db a\ufeffb ½ ² ㎏ "
          "Ⅻ 中文字 ｶﾀｶﾅ \ufffd a\u0085b a\u3000b a\u00a0b naïve Ǆ ǅ ǆ ꭰ Ꭰ ﬀ ŉ (hello)!world?\"x\" 'y' — «z» ‘q’ "
          "3.14 a_b a-b @home #tag $5 %p ^c &d *e +f =g |h \\i /j ~k `l")


def test_exported_tokenizer_splits_words_as_our_splitter(exported):
    from pmi_jax.preprocess.text.words import split_words

    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    backend = tokenizer.backend_tokenizer
    words = [w for w, _ in backend.pre_tokenizer.pre_tokenize_str(backend.normalizer.normalize_str(TRICKY))]
    assert words == split_words([TRICKY])[0]


def test_export_directory_and_model_card(exported, perplexity_json):
    assert sorted(os.listdir(exported)) == sorted([
        hf_checkpoint.CONFIG_FILE, hf_checkpoint.WEIGHTS_FILE, hf_checkpoint.VOCAB_FILE,
        hf_checkpoint.TOKENIZER_FILE, hf_checkpoint.TOKENIZER_CONFIG_FILE, hf_checkpoint.SPECIAL_TOKENS_FILE, hf_checkpoint.MODEL_CARD_FILE])
    tensors = hf_checkpoint.read_tensors(exported)
    np.testing.assert_array_equal(tensors["cls.predictions.decoder.weight"],
                                  tensors["bert.embeddings.word_embeddings.weight"])
    np.testing.assert_array_equal(tensors["cls.predictions.decoder.bias"], tensors["cls.predictions.bias"])
    assert tensors["bert.encoder.layer.1.intermediate.dense.weight"].shape == (64, 32)  # [out, in]
    card = open(os.path.join(exported, hf_checkpoint.MODEL_CARD_FILE)).read()
    with open(perplexity_json) as f:
        perplexity = json.load(f)["perplexity"]
    assert f"**{perplexity:.3f}**" in card and "| steps | 4 |" in card and "whole_word" in card


def test_init_from_the_export_starts_with_identical_params(english, run, exported, tmp_path):
    """Export -> --init-from: the new run's step-1 checkpoint holds the exported weights exactly
    (the learning rate of step 0 is 0 after warmup's start, so its update is zero)."""
    workdir = str(tmp_path / "continued")
    assert main(_train_args(english[0], workdir, *SIZE, "train.batch_size=8", "optimizer.warmup_steps=5",
                            "train.num_steps=1", "checkpoint.every_steps=1")
                + ["--init-from", exported]) == 0
    ids, mask = _prepared_batch(english[0])
    before, params_before = _our_logits(run, ids, mask)
    after, params_after = _our_logits(workdir, ids, mask)
    _assert_same_real_rows(params_after, params_before, len(open(prepared_corpus.vocab_path(english[0])).readlines()))
    np.testing.assert_array_equal(after, before)


def test_import_pads_and_export_slices_vocabulary_rows(run, exported):
    """A model whose embedding table has more rows than the vocabulary (padded for the
    accelerator): import pads with zeros, export keeps the real rows, so the round trip is exact."""
    pretrained = huggingface.read_pretrained(exported)
    config, params, _ = checkpoints.restore_for_eval(run)
    vocab_size = pretrained.fields["vocab_size"]
    padded = -(-vocab_size // 128) * 128
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                            checkpoints.abstract_model_params(BertForMaskedLM(config)))
    abstract["encoder"]["embed"]["word"]["embedding"] = jax.ShapeDtypeStruct((padded, 32), np.float32)
    abstract["output_bias"] = jax.ShapeDtypeStruct((padded,), np.float32)
    tensors = hf_checkpoint.read_tensors(exported)
    imported = huggingface.from_transformers(tensors, config, abstract, exported)
    word = imported["encoder"]["embed"]["word"]["embedding"]
    assert word.shape == (padded, 32) and not word[vocab_size:].any()
    np.testing.assert_array_equal(word[:vocab_size], params["encoder"]["embed"]["word"]["embedding"][:vocab_size])
    again = huggingface.to_transformers(imported, config, vocab_size)
    assert again.keys() == tensors.keys()
    for name in tensors:
        np.testing.assert_array_equal(again[name], tensors[name])


def test_import_reads_original_bert_names(run, exported):
    """Checkpoints like bert-base-uncased: LayerNorm gamma/beta, a pooler and a next-sentence head
    (not used), no separate decoder tensors (tied). They load to the same parameters."""
    config, params, _ = checkpoints.restore_for_eval(run)
    tensors = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in hf_checkpoint.read_tensors(exported).items() if not k.startswith("cls.predictions.decoder")}
    tensors["bert.pooler.dense.weight"] = np.zeros((32, 32), np.float32)
    tensors["cls.seq_relationship.weight"] = np.zeros((2, 32), np.float32)
    abstract = checkpoints.abstract_model_params(BertForMaskedLM(config))
    imported = huggingface.from_transformers(tensors, config, abstract, exported)
    _assert_same_real_rows(imported, jax.device_get(params), config.vocab_size)
    del tensors["bert.encoder.layer.1.output.dense.bias"]
    with pytest.raises(UserInputError, match="no tensor bert.encoder.layer.1.output.dense.bias"):
        huggingface.from_transformers(tensors, config, abstract, exported)


def _one_line_error(capsys):
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_export_errors(run, exported, tmp_path, capsys):
    output = str(tmp_path / "out")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["export", "hf", "--checkpoint", str(empty), "--output", output]) == 2
    assert "no checkpoints/ directory" in _one_line_error(capsys)
    assert main(["export", "hf", "--checkpoint", run, "--step", "3", "--output", output]) == 2
    assert "--step 3" in (err := _one_line_error(capsys)) and "(steps: 2, 4)" in err
    assert not os.path.exists(output)
    assert main(["export", "hf", "--checkpoint", run, "--output", exported]) == 2
    assert "--overwrite" in _one_line_error(capsys)
    assert main(["export", "hf", "--checkpoint", run, "--step", "2", "--output", output]) == 0
    step2 = hf_checkpoint.read_tensors(output)["cls.predictions.bias"]
    assert not np.array_equal(step2, hf_checkpoint.read_tensors(exported)["cls.predictions.bias"])
    assert main(["export", "hf", "--checkpoint", run, "--output", output, "--overwrite"]) == 0
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []  # no temporary left behind


def test_init_from_errors(english, exported, tmp_path, capsys):
    data_dir = english[0]
    workdir = str(tmp_path / "run")
    args = _train_args(data_dir, workdir, *SIZE, "train.num_steps=1") + ["--init-from", exported]
    assert main(args + ["--set", "model.hidden_size=64"]) == 2
    assert "--set model.hidden_size=64" in (err := _one_line_error(capsys)) and "has 32" in err
    assert main(_train_args(data_dir, workdir, "train.num_steps=1") + ["--init-from", exported]) == 2
    assert "--config tiny has model.hidden_size=64" in _one_line_error(capsys)

    toy = str(tmp_path / "toy")
    prepared_data.write_prepared_corpus(toy, sequences={"train": 4, "validation": 2},
                                        shards={"train": 1, "validation": 1}, seq_len=32)
    assert main(_train_args(toy, workdir, *SIZE, "train.num_steps=1") + ["--init-from", exported]) == 2
    err = _one_line_error(capsys)
    assert os.path.join(exported, "vocab.txt") in err and os.path.join(toy, "vocab.txt") in err

    torch_only = str(tmp_path / "torch_only")
    shutil.copytree(exported, torch_only)
    os.rename(os.path.join(torch_only, hf_checkpoint.WEIGHTS_FILE),
              os.path.join(torch_only, hf_checkpoint.TORCH_WEIGHTS_FILE))
    assert main(_train_args(data_dir, workdir, *SIZE, "train.num_steps=1") + ["--init-from", torch_only]) == 2
    assert "needs PyTorch" in _one_line_error(capsys)
    assert not os.path.exists(workdir)


def test_scanned_layers_map_to_the_same_transformers_tensors():
    """A scanned model exports BERT's per-layer tensors, and importing them rebuilds its stacked params."""
    import flax.linen as nn
    import jax

    from pmi_jax import huggingface
    from pmi_jax.checkpoints import abstract_model_params
    from pmi_jax.config import ModelConfig
    from pmi_jax.model import SCANNED_LAYERS, BertForMaskedLM, unstack_layers

    config = ModelConfig(vocab_size=300, hidden_size=32, num_layers=3, num_heads=2, intermediate_size=64,
                         max_position_embeddings=64, scan_layers=True)
    model = BertForMaskedLM(config)
    ids = jax.numpy.zeros((1, 8), jax.numpy.int32)
    params = nn.unbox(model.init(jax.random.key(1), ids, ids, deterministic=True))["params"]
    assert SCANNED_LAYERS in params["encoder"]
    tensors = huggingface.to_transformers(params, config, vocab_size=300)
    assert tensors["bert.encoder.layer.2.output.dense.weight"].shape == (32, 64)
    flat = huggingface.to_transformers(unstack_layers(params), config, vocab_size=300)
    assert tensors.keys() == flat.keys() and all(np.array_equal(tensors[k], flat[k]) for k in tensors)
    back = huggingface.from_transformers(tensors, config, abstract_model_params(model), "test")
    assert SCANNED_LAYERS in back["encoder"]
    for path, value in jax.tree_util.tree_leaves_with_path(params):
        restored = back
        for key in path:
            restored = restored[key.key]
        rows = 300 if value.shape[0] == config.padded_vocab_size else None  # padded rows are not exported
        np.testing.assert_array_equal(np.asarray(restored)[:rows], np.asarray(value)[:rows])
