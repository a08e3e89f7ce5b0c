"""seqio registration, the WordPiece vocabulary, the feature converter and the trainer's
input pipeline (ordering, sharding across hosts, exact resume)."""
from __future__ import annotations

import os

import numpy as np
import pytest
import seqio
import tensorflow as tf

from pmi_jax import tasks
from pmi_jax.errors import UserInputError
from pmi_jax.feature_converters import MlmFeatureConverter
from pmi_jax.vocabularies import WordPieceVocabulary
from tests.prepared_data import MASK, PAD, read_prepared_split, vocabulary, write_prepared_corpus


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("prepared"))
    write_prepared_corpus(data_dir, sequences={"train": 60, "validation": 40}, shards={"train": 3, "validation": 1},
                          seq_len=64, seed=2)
    return data_dir


def _examples(ds: tf.data.Dataset) -> list[dict]:
    return list(ds.as_numpy_iterator())


def _identity(ex) -> tuple[int, int, int]:
    return int(ex["shard"]), int(ex["position"]), int(ex["epoch"])


def test_register_corpus_registers_every_scheme_the_data_supports(corpus_dir):
    names = tasks.register_corpus("toy", corpus_dir)
    assert names == [f"toy_{s}" for s in ("random_token", "whole_word", "random_span", "frequency", "naive_pmi", "pmi")]
    assert set(names) <= set(seqio.TaskRegistry.names())
    assert tasks.register_corpus("toy", corpus_dir, ["pmi"]) == ["toy_pmi"]  # registering again replaces

    task = seqio.get_mixture_or_task("toy_pmi")
    ex = next(task.get_dataset({"inputs": 64}, "validation", shuffle=False).as_numpy_iterator())
    assert {k: v.dtype for k, v in ex.items() if k in task.output_features} == {
        "inputs": np.int32, "targets": np.int32, "weights": np.float32, "units": np.int32}
    vocab = task.output_features["targets"].vocabulary
    tokens = vocabulary()
    first = read_prepared_split(corpus_dir, "validation")[0]["input_ids"]
    words = " ".join(tokens[i] for i in first).replace(" ##", "")
    assert vocab.decode(ex["targets"]) == words  # padding dropped, pieces joined
    assert vocab.decode_tf(tf.constant(ex["targets"])).numpy().decode() == words


def test_a_scheme_the_data_lacks_is_a_clear_error(tmp_path):
    data_dir = str(tmp_path / "pmi_only")
    write_prepared_corpus(data_dir, sequences={"train": 4, "validation": 2}, seq_len=32, unit_names=("pmi",))
    assert tasks.register_corpus("lean", data_dir) == [
        "lean_random_token", "lean_whole_word", "lean_random_span", "lean_pmi"]
    with pytest.raises(UserInputError, match="units_frequency"):
        tasks.register_corpus("lean", data_dir, ["frequency"])
    with pytest.raises(UserInputError, match="scheme 'bpe_dropout': not a masking scheme"):
        tasks.register_corpus("lean", data_dir, ["bpe_dropout"])
    with pytest.raises(UserInputError, match="task name"):
        tasks.register_corpus("bad name!", data_dir)
    with pytest.raises(UserInputError, match="not a prepared corpus"):
        tasks.register_corpus("none", str(tmp_path / "missing"))


def test_vocabulary_round_trip_and_errors(corpus_dir, tmp_path):
    vocab = WordPieceVocabulary(os.path.join(corpus_dir, "vocab.txt"))
    tokens = vocabulary()
    assert vocab.vocab_size == len(tokens) and vocab.pad_id == PAD and vocab.mask_id == MASK and vocab.eos_id is None
    text = f"{tokens[20]} {tokens[30]}{tokens[-1][2:]}"
    ids = vocab.encode(text)
    assert ids == [20, 30, len(tokens) - 1]
    np.testing.assert_array_equal(vocab.encode_tf(tf.constant(text)).numpy(), ids)
    assert vocab.decode(ids + [PAD, PAD]) == text
    assert vocab.decode([2, MASK, 3]) == "[CLS] [MASK] [SEP]"

    bad = tmp_path / "vocab.txt"
    bad.write_text("[UNK]\n[PAD]\n[CLS]\n[SEP]\n[MASK]\nword\n")
    with pytest.raises(UserInputError, match=r"\[PAD\] must be id 0"):
        WordPieceVocabulary(str(bad))
    bad.write_text("[PAD]\n[UNK]\nword\n")
    with pytest.raises(UserInputError, match=r"\[CLS\]"):
        WordPieceVocabulary(str(bad))


def test_feature_converter_keeps_every_selected_weight_and_pads(corpus_dir):
    task = tasks.make_task("convert", tasks.TaskCorpus(corpus_dir), "random_token")
    examples = _examples(task.get_dataset(None, "validation", shuffle=False))
    converted = _examples(MlmFeatureConverter()(task.get_dataset(None, "validation", shuffle=False),
                                                tasks.task_feature_lengths(80)))
    kinds = set()
    for ex, model in zip(examples, converted, strict=True):
        assert set(model) == {"inputs", "targets", "weights", "input_mask"}
        length = int((ex["targets"] != PAD).sum())
        np.testing.assert_array_equal(model["input_mask"], np.arange(80) < length)
        for k in ("inputs", "targets", "weights"):
            np.testing.assert_array_equal(model[k][:64], ex[k])
            assert not model[k][64:].any()
        selected = model["weights"] > 0
        kinds |= {"mask" if i == MASK else "same" if i == t else "random"
                  for i, t in zip(model["inputs"][selected], model["targets"][selected])}
    assert kinds == {"mask", "same", "random"}  # random and unchanged positions keep weight 1
    with pytest.raises(ValueError, match="pack"):
        MlmFeatureConverter(pack=True)


def test_get_dataset_batches(corpus_dir):
    batch = next(tasks.get_dataset(corpus_dir, "pmi", "train", None, 5, 0).as_numpy_iterator())
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
        "inputs": ((5, 64), np.int32), "targets": ((5, 64), np.int32),
        "weights": ((5, 64), np.float32), "input_mask": ((5, 64), np.int32)}
    np.testing.assert_array_equal(batch["input_mask"], batch["targets"] != PAD)
    with pytest.raises(UserInputError, match="seq-len 32"):
        tasks.get_dataset(corpus_dir, "pmi", "train", 32, 5, 0)
    with pytest.raises(UserInputError, match="--split test"):
        tasks.get_dataset(corpus_dir, "pmi", "test", None, 5, 0)


def test_get_dataset_is_the_task_through_the_converter(corpus_dir):
    task = tasks.make_task("same", tasks.TaskCorpus(corpus_dir), "whole_word")
    lengths = tasks.task_feature_lengths(64)
    expected = _examples(MlmFeatureConverter()(
        task.get_dataset(lengths, "train", shuffle=True, seed=4, num_epochs=1), lengths).batch(6))
    actual = _examples(tasks.get_dataset(corpus_dir, "whole_word", "train", 64, 6, 4, num_epochs=1,
                                         drop_remainder=False))
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        for k in e:
            np.testing.assert_array_equal(a[k], e[k])


def test_order_is_a_function_of_the_seed_and_each_epoch_is_a_permutation(corpus_dir):
    task = tasks.make_task("order", tasks.TaskCorpus(corpus_dir), "pmi", shuffle_buffer_size=16)
    def order(seed):
        return [_identity(ex) for ex in task.get_dataset(None, "train", seed=seed, num_epochs=2).as_numpy_iterator()]

    first = order(0)
    assert first == order(0)
    assert first != order(1)
    n = len(read_prepared_split(corpus_dir, "train"))
    epoch0, epoch1 = first[:n], first[n:]
    assert sorted(i[:2] for i in epoch0) == sorted(i[:2] for i in epoch1) and len(set(epoch0)) == n
    assert [i[:2] for i in epoch0] != [i[:2] for i in epoch1]  # each epoch in its own order


@pytest.mark.parametrize("num_shards", [2, 4])  # 3 files: by file for 2 hosts, by record for 4
def test_hosts_partition_each_epoch_and_agree_on_every_mask(corpus_dir, num_shards):
    task = tasks.make_task("hosts", tasks.TaskCorpus(corpus_dir), "random_span", shuffle_buffer_size=8)
    single = {_identity(ex): ex for ex in task.get_dataset(None, "train", shuffle=False, seed=3).as_numpy_iterator()}
    seen = []
    for index in range(num_shards):
        for ex in task.get_dataset(None, "train", seed=3, shard_info=seqio.ShardInfo(index, num_shards))\
                .as_numpy_iterator():
            seen.append(_identity(ex))
            for k in ("inputs", "weights", "units"):
                np.testing.assert_array_equal(ex[k], single[_identity(ex)][k])
    assert sorted(seen) == sorted(single)  # every example exactly once


@pytest.mark.parametrize("start_step", [3, 7, 12])  # ~40 sequences, 6 a batch: resume in epoch 0, 1, 1
def test_resume_continues_exactly(corpus_dir, start_step):
    def batches(start):
        ds = tasks.get_dataset(corpus_dir, "naive_pmi", "validation", None, 6, 9, start_step=start,
                               shuffle_buffer_size=16)
        return _examples(ds.take(16 - start))

    full, resumed = batches(0), batches(start_step)
    assert len(resumed) == 16 - start_step
    for a, b in zip(full[start_step:], resumed):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def test_rate_schedules_reach_their_end_rate_at_num_steps():
    from pmi_jax import masking

    linear = masking.MaskRate(0.3, 0.15, "linear", num_steps=10)
    assert [linear.rate_at(s) for s in (0, 1, 5, 10, 11, 1000)] == [0.3, 0.285, 0.225, 0.15, 0.15, 0.15]
    cosine = masking.MaskRate(0.3, 0.15, "cosine", num_steps=10)
    rates = [cosine.rate_at(s) for s in range(12)]
    assert rates[0] == 0.3 and rates[5] == 0.225 and rates[10:] == [0.15, 0.15]
    assert all(a >= b for a, b in zip(rates, rates[1:])) and rates[1] > linear.rate_at(1)  # flat at the start
    rising = masking.MaskRate(0.1, 0.4, "linear", num_steps=3)
    assert [rising.rate_at(s) for s in range(4)] == [0.1, 0.2, 0.3, 0.4] and rising.highest == 0.4
    assert masking.MaskRate(0.3).rate_at(10**9) == 0.3


SCHEDULE = dict(start=0.4, end=0.1, schedule="linear", num_steps=6)


def test_each_batch_is_masked_at_its_steps_rate(corpus_dir):
    """Batch s of a schedule holds exactly the masks a constant rate of r(s) gives the same
    examples: the key of an example does not depend on the rate, only its budget does."""
    from pmi_jax import masking

    rate = masking.MaskRate(**SCHEDULE)
    scheduled = _examples(tasks.get_dataset(corpus_dir, "pmi", "train", None, 6, 5, mask_rate=rate).take(8))
    for step, batch in enumerate(scheduled):
        constant = masking.MaskRate(rate.rate_at(step))
        (same,) = _examples(tasks.get_dataset(corpus_dir, "pmi", "train", None, 6, 5, start_step=step,
                                              mask_rate=constant).take(1))
        for k in batch:
            np.testing.assert_array_equal(batch[k], same[k])
    shares = [b["weights"].sum() / (b["input_mask"].sum() - 2 * len(b["weights"])) for b in scheduled]
    assert shares[0] > 0.35 and shares[6] < 0.11 and shares[7] < 0.11, shares  # 40% -> 10%, flat after step 6


@pytest.mark.parametrize("start_step", [3, 7, 12])
def test_resume_under_a_rate_schedule_continues_exactly(corpus_dir, start_step):
    from pmi_jax import masking

    rate = masking.MaskRate(**{**SCHEDULE, "num_steps": 14})

    def batches(start):
        ds = tasks.get_dataset(corpus_dir, "random_span", "validation", None, 6, 9, start_step=start,
                               shuffle_buffer_size=16, mask_rate=rate)
        return _examples(ds.take(16 - start))

    full, resumed = batches(0), batches(start_step)
    assert len(resumed) == 16 - start_step
    for a, b in zip(full[start_step:], resumed):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
