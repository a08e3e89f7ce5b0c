"""Every command's inputs against its outputs, from the parsers themselves (issue 33, part 1).

The first test walks every command's flags, so a new flag that takes a string must be marked
as a path (pmi_jax/cli/io_flags.py) or named here as not one; the second puts each output flag
of each command on, and inside, each of its input flags and expects the one-line refusal. The
rest are the cases of the sweep, run through `main` with the files' hashes compared.
"""
import argparse
import hashlib
import pathlib

import pytest

from pmi_jax.cli import build_parser, io_flags, main
from pmi_jax.errors import UserInputError
from tests.damage import one_line_error

# String-valued flags that name no file, each with what it names instead.
NOT_PATHS = {
    "--batch-sizes": "numbers", "--learning-rates": "numbers", "--positions": "a number", "--steps": "steps",
    "--beam-option": "a Beam flag", "--coordinator-address": "host:port", "--job_name": "a Dataflow name",
    "--machine_type": "a machine type", "--max_num_workers": "a count", "--num_workers": "a count",
    "--project": "a GCP project", "--region": "a GCP region", "--sdk_container_image": "an image name",
    "--scheme": "a scheme", "--set": "FIELD=VALUE", "FIELD=VALUE": "FIELD=VALUE", "--split": "a split name",
    "--task": "a task name", "--text-field": "a field name", "--tfds": "a TFDS name", "--topology": "a TPU slice",
    "--unit": "a unit kind", "--units": "a unit set name (corpus show)", "--allow-changed": "a setting name",
}
SKIPPED = (argparse._HelpAction, argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._SubParsersAction)


def _commands():
    return list(io_flags.leaf_parsers(build_parser()))


def _digest(root) -> dict[str, str]:
    root = pathlib.Path(root)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_every_flag_that_takes_a_string_is_marked_as_a_path_or_is_known_not_to_be_one():
    unmarked = sorted({f"{command}: {io_flags.option_name(action)}" for command, parser in _commands()
                       for action in parser._actions
                       if not isinstance(action, SKIPPED) and not hasattr(action, io_flags.ROLE)
                       and action.type in (None, str) and not action.choices
                       and io_flags.option_name(action) not in NOT_PATHS})
    assert not unmarked, ("mark these with io_flags.reads/writes/run_directory/scratch, or add them to NOT_PATHS: "
                          + ", ".join(unmarked))
    marked = {command: [role for _, _, role in parser.get_default("io_flags")] for command, parser in _commands()}
    writers = [c for c, roles in marked.items() if set(roles) & {*io_flags.OUTPUTS, io_flags.RUN}]
    assert sorted(writers) == ["compare", "corpus prepare", "data dump", "demo-corpus", "eval finetune",
                               "eval perplexity", "export hf", "train", "vocab build", "vocab select"]


def _namespace(parser, **values):
    args = argparse.Namespace(**{a.dest: a.default for a in parser._actions if a.dest != argparse.SUPPRESS})
    args.io_flags = parser.get_default("io_flags")
    for dest, value in values.items():
        setattr(args, dest, value)
    return args


def _value(parser, dest, path):
    action = next(a for a in parser._actions if a.dest == dest)
    text = f"name={path}" if getattr(action, io_flags.ROLE) == io_flags.INPUT_NAMED else str(path)
    return [text] if action.nargs in ("+", "*") or isinstance(action, argparse._AppendAction) else text


def test_every_output_flag_is_refused_on_and_inside_every_input_flag(tmp_path):
    source = tmp_path / "input"
    source.mkdir()
    (source / "file.txt").write_text("the user's\n")
    before = _digest(tmp_path)
    pairs = 0
    for command, parser in _commands():
        flags = parser.get_default("io_flags")
        inputs = [(dest, option) for dest, option, role in flags if role in (io_flags.INPUT, io_flags.INPUT_NAMED)]
        outputs = [(dest, option, role) for dest, option, role in flags if role in (*io_flags.OUTPUTS, io_flags.RUN)]
        for out_dest, out_option, role in outputs:
            for in_dest, in_option in inputs:
                targets = [source / "file.txt", source / "new"] if role != io_flags.RUN else [source, source / "run"]
                if role == io_flags.OUTPUT_DIR:
                    targets.append(tmp_path)  # holds the input
                for target in targets:
                    args = _namespace(parser, **{in_dest: _value(parser, in_dest, source), out_dest: str(target)})
                    with pytest.raises(UserInputError) as error:
                        io_flags.check_apart(args)
                    message = str(error.value)
                    assert message.startswith(f"{out_option} ") and f"input {in_option} " in message, (command,
                                                                                                      message)
                    assert "\n" not in message
                    pairs += 1
                # Apart, the same flags pass.
                elsewhere = tmp_path / "elsewhere" if role != io_flags.OUTPUT_FILE else tmp_path / "out.json"
                io_flags.check_apart(_namespace(parser, **{in_dest: _value(parser, in_dest, source),
                                                           out_dest: str(elsewhere)}))
    assert pairs >= 60
    assert _digest(tmp_path) == before


def test_a_file_output_into_a_missing_directory_is_one_line(tmp_path):
    for command, parser in _commands():
        for dest, option, role in parser.get_default("io_flags"):
            if role == io_flags.OUTPUT_FILE:
                with pytest.raises(UserInputError, match=rf"^{option} \S+/missing/x: the directory \S+/missing does "
                                                         "not exist; create it or name another$"):
                    io_flags.check_apart(_namespace(parser, **{dest: str(tmp_path / "missing" / "x")}))
    assert not (tmp_path / "missing").exists()


# ---------------------------------------------------------------------------------------------
# The sweep's cases, end to end.

@pytest.fixture
def vocabulary(tmp_path):
    """A masking vocabulary directory as `vocab build` writes it, and hand labels beside it."""
    from pmi_jax.preprocess.text.demo_corpus import iter_demo_documents
    from pmi_jax.preprocess.vocab.build_vocab import VocabOptions, build_vocabulary
    import itertools

    text = tmp_path / "text.txt"
    text.write_text("\n\n".join(itertools.islice(iter_demo_documents(), 300)))
    vocab = tmp_path / "vocab"
    build_vocabulary([str(text)], str(vocab), VocabOptions(measure="pmi", size=200, min_count=2, workers=1))
    labels = tmp_path / "labels.tsv"
    ngrams = (vocab / "masking_vocab.txt").read_text().splitlines()
    labels.write_text("".join(f"{g}\t1\n" for g in ngrams[:5]) + "red apple\t0\nthe of\t0\n")
    return vocab, labels


def test_vocab_select_plot_may_not_replace_the_vocabulary_or_the_labels(vocabulary, tmp_path, capsys):
    vocab, labels = vocabulary
    before = _digest(tmp_path)
    cases = [
        (vocab / "masking_vocab.txt", f"--plot {vocab / 'masking_vocab.txt'}: lies inside the input VOCAB_DIR {vocab}"),
        (labels, f"--plot {labels}: is the input --labels {labels}"),
        (tmp_path / "missing" / "plot.png", f"--plot {tmp_path / 'missing' / 'plot.png'}: the directory "
                                            f"{tmp_path / 'missing'} does not exist"),
    ]
    for plot, message in cases:
        one_line_error(capsys, main(["vocab", "select", str(vocab), "--labels", str(labels), "--step", "50",
                                     "--plot", str(plot)]), message)
    assert _digest(tmp_path) == before
    assert main(["vocab", "select", str(vocab), "--labels", str(labels), "--step", "50", "--plot",
                 str(tmp_path / "plot.png")]) == 0
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_finetune_output_may_not_replace_the_hf_model(tmp_path, capsys):
    model = tmp_path / "bert"
    model.mkdir()
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"):
        (model / name).write_bytes(name.encode() * 10)
    before = _digest(tmp_path)
    for output in (model, model / "results"):
        one_line_error(capsys, main(["eval", "finetune", "--hf-model", str(model), "--task", "glue/rte", "--data",
                                     str(tmp_path / "glue"), "--output", str(output), "--overwrite"]),
                       f"--output {output}: ", f"the input --hf-model {model}")
    assert _digest(tmp_path) == before


def test_data_dump_into_a_prepared_corpus_is_refused(tmp_path, capsys):
    from tests import prepared_data

    corpus = tmp_path / "corpus"
    prepared_data.write_prepared_corpus(str(corpus), sequences={"train": 4, "validation": 2},
                                        shards={"train": 1, "validation": 1}, seq_len=32)
    before = _digest(tmp_path)
    one_line_error(capsys, main(["data", "dump", "--data", str(corpus), "--scheme", "whole_word", "--num", "1",
                                 "--output", str(corpus / "dump.jsonl")]),
                   f"--output {corpus / 'dump.jsonl'}: lies inside the input --data {corpus}")
    assert _digest(tmp_path) == before


def test_a_path_error_is_worded_by_the_flag_that_gave_the_path(tmp_path, monkeypatch):
    """The library raises PathError with the path alone; the command names the flag that gave it:
    an output first, then any flag with that value, then the output a derived path lies under."""
    import pickle

    from pmi_jax.errors import OutputExists, PathError

    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["eval", "finetune", "--checkpoint", "run", "--task", "glue/rte",
                                      "--data", "glue", "--output", "out/", "--overwrite"])
    assert io_flags.worded(OutputExists("out"), args) == "--output out: already exists (pass --overwrite to replace it)"
    absolute = str(tmp_path / "out")
    assert io_flags.worded(PathError(absolute, "is a file"), args) == f"--output {absolute}: is a file"
    assert io_flags.worded(PathError("out/step2", "cannot write"), args) == "--output out/step2: cannot write"
    assert io_flags.worded(PathError("glue", "is empty"), args) == "--data glue: is empty"
    assert io_flags.worded(PathError("elsewhere", "is odd"), args) == "elsewhere: is odd"  # no flag gave it
    assert io_flags.worded(PathError("run/eval", "cannot write", "--checkpoint run: its results folder"), args) == \
        "--checkpoint run: its results folder run/eval: cannot write"  # a caller's own name wins
    assert io_flags.worded(UserInputError("--seed x: bad"), args) == "--seed x: bad"
    train = build_parser().parse_args(["train", "--config", "tiny", "--data", "synthetic", "--workdir", "w"])
    assert io_flags.worded(PathError("w", "cannot write in w (Read-only file system)"), train) == \
        "--workdir w: cannot write in w (Read-only file system)"
    assert io_flags.worded(OutputExists("w"), train) == "--workdir w: already exists"  # train has no --overwrite
    again = pickle.loads(pickle.dumps(OutputExists("out")))  # as from a worker process
    assert type(again) is OutputExists and io_flags.worded(again, args).startswith("--output out: already exists (")
