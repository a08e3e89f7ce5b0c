"""The commands' defaults are the library's: parsed without a flag, a command gets the dataclass field."""
import dataclasses

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
    from pmi_jax.preprocess.corpus.prepare import PrepareConfig

    args = _parsed("corpus", "prepare", "--input", "x.txt", "--output", "out")
    fields = {f.name: f.default for f in dataclasses.fields(PrepareConfig)}
    for flag in ("wordpiece_size", "seq_len", "validation_fraction"):
        assert value_of(getattr(args, flag)) == fields[flag], flag


def test_help_shows_the_library_value():
    from pmi_jax.formats.wordpiece_vocab import DEFAULT_SIZE

    default = LibraryDefault("pmi_jax.preprocess.corpus.prepare", "PrepareConfig", "wordpiece_size")
    assert str(default) == str(DEFAULT_SIZE)
    assert LibraryDefault("pmi_jax.config", "PAPER_SCHEMES").value()[-1] == "pmi"
    help_text = build_parser()._subparsers._group_actions[0].choices["corpus"]._subparsers._group_actions[0] \
        .choices["prepare"].format_help()
    assert f"(default {DEFAULT_SIZE};" in " ".join(help_text.split())
