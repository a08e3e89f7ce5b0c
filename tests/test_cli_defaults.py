"""The commands' defaults are the library's: parsed without a flag, a command gets the dataclass field."""
import dataclasses

import pytest

from pmi_jax.cli import build_parser
from pmi_jax.cli.defaults import LibraryDefault


def _parsed(*argv):
    return build_parser().parse_args(list(argv))


def test_vocab_build_defaults_are_vocab_options_fields():
    from pmi_jax.cli import config_flags
    from pmi_jax.preprocess.vocab.build_vocab import VocabOptions

    args = _parsed("vocab", "build", "--input", "x.txt", "--output", "out")
    fields = {f.name: f.default for f in dataclasses.fields(VocabOptions)}
    parsed = config_flags.values(args, VocabOptions)
    assert set(parsed) == set(fields)  # every field is a flag (--text-field, --tokenizer, --cased: text_input's)
    for name, value in parsed.items():
        assert value == fields[name] and type(value) is type(fields[name]), name


def test_vocab_build_flags_set_their_fields():
    """Each flag of a VocabOptions field, given, reaches that field with the field's type."""
    from pmi_jax.cli import config_flags
    from pmi_jax.preprocess.vocab.build_vocab import VocabOptions

    args = _parsed("vocab", "build", "--input", "x.txt", "--output", "out", "--measure", "naive-pmi", "--size", "7",
                   "--min-count", "3", "--max-n", "3", "--shares", "0.75,0.25", "--workers", "2", "--memory-mb", "64",
                   "--tmp-dir", "scratch", "--text-field", "body", "--cased", "--sample-words", "5000",
                   "--sample-seed", "4")
    assert VocabOptions(**config_flags.values(args, VocabOptions)) == VocabOptions(
        measure="naive-pmi", size=7, min_count=3, max_n=3, shares=(0.75, 0.25), workers=2, memory_mb=64,
        tmp_dir="scratch", text_field="body", tokenizer=None, cased=True, sample_words=5000, sample_seed=4)
    with pytest.raises(SystemExit):  # --shares parses as numbers
        _parsed("vocab", "build", "--input", "x", "--output", "o", "--shares", "0.5,half")
    with pytest.raises(SystemExit):  # --measure is one of the measures
        _parsed("vocab", "build", "--input", "x", "--output", "o", "--measure", "mutual-information")


def test_corpus_prepare_defaults_are_prepare_config_fields():
    from pmi_jax.cli import config_flags
    from pmi_jax.preprocess.corpus.prepare import PrepareConfig

    args = _parsed("corpus", "prepare", "--input", "x.txt", "--output", "out")
    fields = {f.name: f.default for f in dataclasses.fields(PrepareConfig)}
    parsed = config_flags.values(args, PrepareConfig)
    assert set(fields) - set(parsed) == {"inputs"}  # every other field is a flag (--input: text_input's)
    for name, value in parsed.items():
        if name not in ("output", "units"):
            assert value == fields[name] and type(value) is type(fields[name]), name
    assert parsed["units"] == [] and fields["units"] == ()


def test_corpus_prepare_flags_set_their_fields():
    """Each flag of a PrepareConfig field, given, reaches that field with the field's type."""
    from pmi_jax.cli import config_flags
    from pmi_jax.preprocess.corpus.prepare import PrepareConfig

    args = _parsed("corpus", "prepare", "--input", "x.txt", "--output", "out", "--wordpiece-size", "900",
                   "--units", "a=v1", "--units", "b=v2", "--seq-len", "64", "--validation-fraction", "0.5",
                   "--shards", "3", "--seed", "7", "--workers", "2", "--overwrite", "--no-progress",
                   "--text-field", "body", "--cased", "--wordpiece-sample-words", "5000", "--wordpiece-sample-seed", "4")
    assert config_flags.values(args, PrepareConfig) == {
        "output": "out", "wordpiece": None, "wordpiece_size": 900, "wordpiece_sample_words": 5000,
        "wordpiece_sample_seed": 4, "units": ["a=v1", "b=v2"], "seq_len": 64,
        "validation_fraction": 0.5, "shards": 3, "seed": 7, "workers": 2, "overwrite": True, "progress": False,
        "text_field": "body", "tokenizer": None, "cased": True}
    args = _parsed("corpus", "prepare", "--input", "x.txt", "--output", "out", "--wordpiece", "v.txt")
    assert config_flags.values(args, PrepareConfig)["wordpiece"] == "v.txt"
    with pytest.raises(SystemExit):  # --wordpiece, --wordpiece-size and --tokenizer exclude each other
        _parsed("corpus", "prepare", "--input", "x", "--output", "o", "--wordpiece", "v.txt", "--wordpiece-size", "9")


def test_help_shows_the_library_value():
    from pmi_jax.preprocess.corpus.prepare_config import WORDPIECE_SIZE as DEFAULT_SIZE

    default = LibraryDefault("pmi_jax.preprocess.corpus.prepare", "PrepareConfig", "wordpiece_size")
    assert str(default) == str(DEFAULT_SIZE)
    assert LibraryDefault("pmi_jax.config", "PAPER_SCHEMES").value()[-1] == "pmi"
    help_text = build_parser()._subparsers._group_actions[0].choices["corpus"]._subparsers._group_actions[0] \
        .choices["prepare"].format_help()
    assert f"(default {DEFAULT_SIZE};" in " ".join(help_text.split())
