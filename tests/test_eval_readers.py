"""Readers of the tasks' distributed formats, TFDS conversion, SQuAD windows and decoding, packing.

The GLUE files below reproduce the layouts of GLUE's download (header names, column order,
CoLA's header-less rows, MRPC's byte-order mark, MNLI's two dev files, QQP's broken rows).
"""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from pmi_jax.errors import UserInputError
from pmi_jax.eval import glue, race, squad
from pmi_jax.eval.heads import Encoded
from pmi_jax.eval.bert_inputs import pack, truncate_pair
from pmi_jax.formats.wordpiece_vocab import check_matches_checkpoint
from pmi_jax.vocabularies import WordPieceVocabulary
from tests import eval_data

MNLI_TRAIN_HEADER = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                     "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"]
MNLI_DEV_HEADER = MNLI_TRAIN_HEADER[:11] + ["label2", "label3", "label4", "label5", "gold_label"]

# task -> (file name -> (header or None, rows)), expected [(text_a, text_b, label string, subset)] of dev.
GLUE_FILES = {
    "glue/cola": ({"train.tsv": (None, [["gj04", "1", "", "Our friends won't buy this analysis."]]),
                   "dev.tsv": (None, [["gj04", "0", "*", "They drank the pub."],
                                      ["cj99", "1", "", "The \"sailors\" rode the breeze."]])},
                  [("They drank the pub.", None, "0", ""), ('The "sailors" rode the breeze.', None, "1", "")]),
    "glue/sst2": ({"train.tsv": (["sentence", "label"], [["hide new secretions ", "0"]]),
                   "dev.tsv": (["sentence", "label"], [["it 's a charming journey . ", "1"]])},
                  [("it 's a charming journey . ", None, "1", "")]),
    "glue/mrpc": ({"train.tsv": (["\ufeffQuality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                                 [["1", "702876", "702977", "Amrozi accused his brother.", "Referring to him."]]),
                   "dev.tsv": (["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                               [["0", "1", "2", "He said the foodservice pie.", "The pie business."]])},
                  [("He said the foodservice pie.", "The pie business.", "0", "")]),
    "glue/stsb": ({"train.tsv": (["index", "genre", "filename", "year", "old_index", "source1", "source2",
                                  "sentence1", "sentence2", "score"],
                                 [["0", "main-captions", "MSRvid", "2012test", "1", "none", "none", "A plane.",
                                   "An air plane.", "5.000"]]),
                   "dev.tsv": (["index", "genre", "filename", "year", "old_index", "source1", "source2",
                                "sentence1", "sentence2", "score"],
                               [["0", "main-captions", "MSRvid", "2012test", "0", "none", "none", "A man.",
                                 "A man with a hat.", "3.800"]])},
                  [("A man.", "A man with a hat.", "3.800", "")]),
    "glue/qqp": ({"train.tsv": (["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                                [["1", "1", "2", "How?", "Why?", "0"], ["2", "3", "4", "broken row"]]),
                  "dev.tsv": (["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                              [["5", "9", "10", "Is it \"so\"?", "Is it so?", "1"]])},
                 [('Is it "so"?', "Is it so?", "1", "")]),
    "glue/mnli": ({"train.tsv": (MNLI_TRAIN_HEADER, [["0", "1", "1e", "gov", "( ( a b ) )", "( c )", "(ROOT)",
                                                     "(ROOT)", "A b.", "C.", "neutral", "neutral"]]),
                   "dev_matched.tsv": (MNLI_DEV_HEADER, [["0", "1", "1e", "tel", "x", "y", "(R)", "(R)", "P m.",
                                                        "H m.", "entailment", "neutral", "entailment",
                                                        "entailment", "entailment", "entailment"]]),
                   "dev_mismatched.tsv": (MNLI_DEV_HEADER, [["0", "1", "1c", "let", "x", "y", "(R)", "(R)",
                                                           "P mm.", "H mm.", "contradiction", "contradiction",
                                                           "neutral", "contradiction", "contradiction",
                                                           "contradiction"]])},
                  [("P m.", "H m.", "entailment", ""), ("P mm.", "H mm.", "contradiction", "mismatched")]),
    "glue/qnli": ({"train.tsv": (["index", "question", "sentence", "label"], [["0", "Q?", "S.", "entailment"]]),
                   "dev.tsv": (["index", "question", "sentence", "label"],
                               [["0", "What came?", "Nothing came.", "not_entailment"]])},
                  [("What came?", "Nothing came.", "not_entailment", "")]),
    "glue/rte": ({"train.tsv": (["index", "sentence1", "sentence2", "label"], [["0", "A.", "B.", "entailment"]]),
                  "dev.tsv": (["index", "sentence1", "sentence2", "label"],
                              [["0", "Dana Reeve died.", "Reeve is dead.", "entailment"]])},
                 [("Dana Reeve died.", "Reeve is dead.", "entailment", "")]),
    "glue/wnli": ({"train.tsv": (["index", "sentence1", "sentence2", "label"], [["0", "I stuck.", "It stuck.", "1"]]),
                   "dev.tsv": (["index", "sentence1", "sentence2", "label"], [["0", "The drain.", "It is.", "0"]])},
                  [("The drain.", "It is.", "0", "")]),
}


def _write_glue(root, task_name):
    task = glue.TASKS[task_name]
    files, _ = GLUE_FILES[task_name]
    for name, (header, rows) in files.items():
        eval_data.write_tsv(os.path.join(root, task.folder, name), header, rows)
    return os.path.join(root, task.folder)


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    return WordPieceVocabulary(eval_data.write_vocab(str(tmp_path_factory.mktemp("vocab") / "vocab.txt")))


# ---- GLUE ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("task_name", sorted(GLUE_FILES))
def test_glue_dev_files_read_as_distributed(tmp_path, task_name):
    task = glue.TASKS[task_name]
    folder = _write_glue(str(tmp_path), task_name)
    dev = task.read(folder, "dev")
    _, expected = GLUE_FILES[task_name]
    labels = [float(raw) if task.labels is None else float(task.labels.index(raw)) for _, _, raw, _ in expected]
    assert [(e.text_a, e.text_b, e.label, e.subset) for e in dev] == [
        (a, b, label, subset) for (a, b, _, subset), label in zip(expected, labels)]
    assert len(task.read(str(tmp_path), "train")) == 1  # the GLUE root works too; QQP's broken row is skipped


def test_glue_label_and_layout_errors_name_the_file(tmp_path):
    sst2 = _write_glue(str(tmp_path), "glue/sst2")
    with pytest.raises(UserInputError, match=r"header lacks column\(s\) sentence1, sentence2"):
        glue.TASKS["glue/rte"].read(sst2, "train")
    with pytest.raises(UserInputError, match="not a GLUE RTE folder"):
        glue.TASKS["glue/rte"].read(str(tmp_path / "nowhere"), "train")
    eval_data.write_tsv(str(tmp_path / "RTE" / "train.tsv"), ["index", "sentence1", "sentence2", "label"],
                        [["0", "A.", "B.", "maybe"]])
    with pytest.raises(UserInputError, match=r"train.tsv:2: label 'maybe' is not one of entailment"):
        glue.TASKS["glue/rte"].read(str(tmp_path / "RTE"), "train")
    eval_data.write_tsv(str(tmp_path / "RTE" / "train.tsv"), ["index", "sentence1", "sentence2", "label"],
                        [["0", "A.", "entailment"]])
    with pytest.raises(UserInputError, match=r"train.tsv:2: 3 tab-separated fields"):
        glue.TASKS["glue/rte"].read(str(tmp_path / "RTE"), "train")


def test_glue_tfds_examples_match_the_tsv_ones(tmp_path):
    """TFDS numbers MNLI's classes differently from the TSV's order; both must give the same labels."""
    task = glue.TASKS["glue/mnli"]
    dataset = tf.data.Dataset.from_tensor_slices({
        "premise": ["P m.", "A b."], "hypothesis": ["H m.", "C."], "label": np.array([0, 1], np.int64),
        "idx": np.array([0, 1], np.int32)})
    examples = task.from_tfds(dataset)
    assert [(e.text_a, e.text_b, task.labels[int(e.label)]) for e in examples] == [
        ("P m.", "H m.", "entailment"), ("A b.", "C.", "neutral")]
    stsb = glue.TASKS["glue/stsb"].from_tfds(tf.data.Dataset.from_tensor_slices({
        "sentence1": ["A man."], "sentence2": ["A man with a hat."], "label": np.array([3.8], np.float32),
        "idx": np.array([0], np.int32)}))
    assert stsb[0].label == pytest.approx(3.8)


def test_glue_scores_follow_the_leaderboard():
    task = glue.TASKS["glue/mrpc"]
    logits = np.array([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0]])  # predicts 1, 1, 0, 0
    encoded = Encoded({"label": np.array([1, 0, 0, 1])}, np.array([""] * 4))
    result = task.evaluate({"logits": logits}, encoded)
    # TP 1, FP 1, FN 1 -> F1 = 2/4; accuracy 2/4; score = their mean.
    assert result == pytest.approx({"f1": 50.0, "accuracy": 50.0, "score": 50.0})
    mnli = glue.TASKS["glue/mnli"]
    encoded = Encoded({"label": np.array([0, 1, 2, 2])}, np.array(["", "", "mismatched", "mismatched"]))
    result = mnli.evaluate({"logits": np.eye(3)[[0, 2, 2, 2]]}, encoded)
    assert result == pytest.approx({"accuracy": 50.0, "accuracy_mismatched": 100.0, "score": 50.0})


# ---- packing ---------------------------------------------------------------------------------------

def test_pairs_are_cut_longest_first_and_packed_as_bert(wordpiece):
    assert truncate_pair([1, 2, 3, 4, 5], [6, 7], 5) == ([1, 2, 3], [6, 7])
    assert truncate_pair([1, 2, 3], [6, 7, 8, 9], 4) == ([1, 2], [6, 7])
    ids = wordpiece.encode_batch(["the cat sat", "on the mat ."])
    packed = pack(wordpiece, [(ids[0], ids[1])], 8)
    cls, sep = wordpiece.cls_id, wordpiece.sep_id
    the, cat, sat, on = (wordpiece.tokens.index(w) for w in ("the", "cat", "sat", "on"))
    # 3 + 4 tokens into 8 - 3 = 5: the longer (second) side loses one, then on a tie the second again.
    assert packed.input_ids_NxL[0].tolist() == [cls, the, cat, sat, sep, on, the, sep]
    assert packed.token_type_ids_NxL[0].tolist() == [0, 0, 0, 0, 0, 1, 1, 1]
    single = pack(wordpiece, [(ids[0], None)], 8)
    assert single.input_ids_NxL[0].tolist() == [cls, the, cat, sat, sep] + [wordpiece.pad_id] * 3
    assert single.input_mask_NxL[0].tolist() == [1] * 5 + [0] * 3


def test_vocabulary_mismatch_is_refused(tmp_path, wordpiece):
    def check(expected_sha256, vocab_size):
        check_matches_checkpoint("--vocab v.txt", sha256=wordpiece.sha256, size=wordpiece.vocab_size,
                                 expected_sha256=expected_sha256, vocab_size=vocab_size, checkpoint="ck")

    check(wordpiece.sha256, wordpiece.vocab_size)
    check(None, wordpiece.vocab_size)  # a checkpoint that recorded no hash: the size still has to agree
    with pytest.raises(UserInputError, match="--vocab v.txt is not the vocabulary checkpoint ck was trained with "
                                             r"\(sha256 [0-9a-f]{12}, the checkpoint recorded 000000000000\)"):
        check("0" * 64, wordpiece.vocab_size)
    size = eval_data.vocab_size()
    with pytest.raises(UserInputError, match=f"--vocab v.txt has {size} tokens, checkpoint ck has vocab_size 99"):
        check(wordpiece.sha256, 99)
    (tmp_path / "v.txt").write_text("the\ncat\n")
    with pytest.raises(UserInputError, match=r"missing special token\(s\) \[PAD\] \[UNK\]"):
        WordPieceVocabulary(str(tmp_path / "v.txt"))


# ---- SQuAD 2.0 --------------------------------------------------------------------------------------

def test_squad_json_is_read_with_unanswerable_questions(tmp_path):
    paragraphs = eval_data.city_questions(4)
    eval_data.write_squad(str(tmp_path), paragraphs, paragraphs[:2])
    train = squad.SquadTask().read(str(tmp_path), "train")
    assert [e.answers for e in train][3] == () and len(train) == 4
    first = train[0]
    assert first.context[first.answer_starts[0]:].startswith(first.answers[0])
    (tmp_path / "dev-v2.0.json").write_text(json.dumps({"version": "v2.0", "articles": []}))
    with pytest.raises(UserInputError, match=r"not SQuAD JSON \(expected an object with a \"data\" list"):
        squad.SquadTask().read(str(tmp_path), "dev")
    with pytest.raises(UserInputError, match="expected a folder holding train-v2.0.json"):
        squad.SquadTask().read(str(tmp_path / "train-v2.0.json"), "train")


def test_squad_tfds_conversion():
    def generate():
        yield {"id": "a", "title": "t", "context": "Paris is big .", "question": "which city ?",
               "answers": {"text": ["Paris", "Paris"], "answer_start": [0, 0]}, "is_impossible": False}
        yield {"id": "b", "title": "t", "context": "nothing .", "question": "which city ?",
               "answers": {"text": np.zeros([0], str), "answer_start": np.zeros([0], np.int32)},
               "is_impossible": True}

    spec = {"id": tf.TensorSpec([], tf.string), "title": tf.TensorSpec([], tf.string),
            "context": tf.TensorSpec([], tf.string), "question": tf.TensorSpec([], tf.string),
            "answers": {"text": tf.TensorSpec([None], tf.string), "answer_start": tf.TensorSpec([None], tf.int32)},
            "is_impossible": tf.TensorSpec([], tf.bool)}
    examples = squad.from_tfds(tf.data.Dataset.from_generator(generate, output_signature=spec))
    assert examples == [squad.SquadExample("a", "which city ?", "Paris is big .", ("Paris", "Paris"), (0, 0)),
                        squad.SquadExample("b", "which city ?", "nothing .", (), ())]


def test_context_tokens_map_back_to_the_original_characters(wordpiece):
    context = "The Café (New York-based) cats, Oslo’s  Émile"
    tokens = squad.tokenize_contexts(wordpiece, [context])[0]
    pieces = [(wordpiece.tokens[i], context[s:e]) for i, s, e in zip(tokens.ids, tokens.char_start, tokens.char_end)]
    assert pieces == [("the", "The"), ("cafe", "Café"), ("(", "("), ("new", "New"), ("york", "York"), ("-", "-"),
                      ("based", "based"), (")", ")"), ("cat", "cat"), ("##s", "s"), (",", ","), ("oslo", "Oslo"),
                      ("[UNK]", "’"), ("[UNK]", "s"), ("[UNK]", "Émile")]


def _long_question(n_words=30):
    words = [eval_data.FILLER[i % 18] for i in range(n_words)]
    words[21] = "Lima"
    context = " ".join(words)
    start = context.index("Lima")
    return squad.SquadExample("q", "which city ?", context, ("Lima",), (start,))


def test_stride_windows_cover_the_context_as_bert_does(wordpiece):
    task = squad.SquadTask(doc_stride=5, max_query_len=8)
    example = _long_question()
    encoded = task.encode([example], wordpiece, 16)  # 16 - 3 - 3 question tokens = 10 context tokens a window
    info, arrays = encoded.info, encoded.arrays
    in_context = info.char_start >= 0
    assert in_context.sum(axis=1).tolist() == [10, 10, 10, 10, 10]  # starts 0, 5, 10, 15, 20 of 30 tokens
    starts = [int(info.char_start[w][in_context[w]][0]) for w in range(5)]
    token_starts = squad.tokenize_contexts(wordpiece, [example.context])[0].char_start.tolist()
    assert [token_starts.index(s) for s in starts] == [0, 5, 10, 15, 20]
    # every context token is "max context" in exactly one window: the one where it sits most centrally
    owner = {}
    for w in range(5):
        for p in np.nonzero(info.max_context[w])[0]:
            assert info.char_start[w][p] not in owner
            owner[int(info.char_start[w][p])] = w
    assert sorted(owner) == token_starts
    assert owner[token_starts[13]] == 2  # min(left, right) context: 1 in window 1, 3 in window 2
    assert owner[token_starts[12]] == 1  # 2 in both: the first window wins, as in BERT
    # the answer (token 21) is a target in the windows holding it, [CLS] elsewhere
    positions = list(zip(arrays["start_position"].tolist(), arrays["end_position"].tolist()))
    assert positions[0] == positions[1] == positions[2] == (0, 0)
    for w in (3, 4):
        s, e = positions[w]
        assert s == e and example.context[info.char_start[w][s]:info.char_end[w][e]] == "Lima"
    assert arrays["token_type_ids"][0].tolist() == [0] * 5 + [1] * 11  # [CLS] q q q [SEP] | 10 context [SEP]


def test_decoding_picks_the_best_span_or_no_answer(wordpiece):
    task = squad.SquadTask(doc_stride=5, max_query_len=8)
    example = _long_question()
    encoded = task.encode([example], wordpiece, 16)
    info = encoded.info
    start = np.full(info.char_start.shape, -5.0)
    end = np.full(info.char_start.shape, -5.0)
    lima = [(w, p) for w in range(5) for p in range(16) if info.char_start[w][p] == example.answer_starts[0]]
    w, p = next((w, p) for w, p in lima if info.max_context[w][p])
    start[w, p], end[w, p + 1] = 4.0, 3.0  # "Lima the": score 7
    start[:, 0], end[:, 0] = 2.0, 2.0  # null score 4 in every window
    spans, margins = task.decode({"start_logits": start, "end_logits": end}, info)
    assert spans == {"q": "Lima " + example.context.split()[22]} and margins["q"] == pytest.approx(4.0 - 7.0)
    assert task.evaluate({"start_logits": start, "end_logits": end}, encoded)["f1"] == pytest.approx(100 * 2 / 3)
    start[:, 0] = 6.0  # null score 8 > 7: answer ""
    result = task.evaluate({"start_logits": start, "end_logits": end}, encoded)
    assert result["exact"] == 0.0 and result["HasAns_total"] == 1
    lenient = squad.SquadTask(null_score_diff_threshold=1.5).evaluate(
        {"start_logits": start, "end_logits": end}, encoded)
    assert lenient["f1"] == pytest.approx(100 * 2 / 3)


# ---- RACE ---------------------------------------------------------------------------------------------

def test_race_folder_is_read_by_split_and_level(tmp_path):
    records = eval_data.choice_articles(3)
    records[0]["questions"] = ["The cat is _ today ."]
    eval_data.write_race(str(tmp_path), {"train": {"high": records[:2], "middle": records[2:]},
                                         "dev": {"high": records[:1], "middle": records[1:]}})
    train = race.TASKS["race"].read(str(tmp_path), "train")
    assert [e.level for e in train] == ["high", "high", "middle"]
    assert [e.label for e in train] == ["ABCD".index(r["answers"][0]) for r in records]
    assert len(race.TASKS["race/middle"].read(str(tmp_path), "dev")) == 2
    assert race.question_with_option("The cat is _ today .", "good") == "The cat is good today ."
    assert race.question_with_option("Which is good ?", "a dog") == "Which is good ? a dog"
    with pytest.raises(UserInputError, match="not a RACE folder"):
        race.TASKS["race"].read(str(tmp_path / "train"), "train")
    (tmp_path / "dev" / "high" / "9.txt").write_text("article: no json")
    with pytest.raises(UserInputError, match="9.txt: not a RACE file"):
        race.TASKS["race/high"].read(str(tmp_path), "dev")


def test_race_encoding_has_four_options_and_tfds_conversion_matches(wordpiece):
    records = eval_data.choice_articles(2)
    examples = [e for r in records for e in race.examples_from_record(r, "high", "x")]
    encoded = race.TASKS["race"].encode(examples, wordpiece, 12)
    assert encoded.arrays["input_ids"].shape == (2, 4, 12)
    assert (encoded.arrays["input_ids"][:, :, 0] == wordpiece.cls_id).all()
    dataset = tf.data.Dataset.from_generator(
        lambda: iter(records), output_signature={
            "article": tf.TensorSpec([], tf.string), "questions": tf.TensorSpec([None], tf.string),
            "options": tf.TensorSpec([None, 4], tf.string), "answers": tf.TensorSpec([None], tf.string),
            "id": tf.TensorSpec([], tf.string)})
    assert race.from_tfds(dataset, "high") == examples
