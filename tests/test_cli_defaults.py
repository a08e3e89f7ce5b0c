"""The commands' defaults are the library's: parsed without a flag, a command gets the dataclass field."""
import dataclasses

import pytest

from pmi_jax.cli import build_parser
from pmi_jax.cli.defaults import LibraryDefault, value_of


def _parsed(*argv):
    return build_parser().parse_args(list(argv))


def test_vocab_build_defaults_are_vocab_options_fields():
    from pmi_jax.preprocess.vocab.build_vocab import VocabOptions

    args = _parsed("vocab", "build", "--input", "x.txt", "--output", "out")
    library = VocabOptions()
    for flag in ("measure", "size", "min_count", "max_n", "workers", "memory_mb"):
        assert value_of(getattr(args, flag)) == getattr(library, flag), flag
    assert value_of(_parsed("vocab", "build", "--input", "x", "--output", "o", "--size", "7").size) == 7


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
