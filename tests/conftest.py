"""Shared test setup: 8 virtual CPU devices for mesh tests, quiet TensorFlow."""
import os

# Must precede any jax import: lets sharding tests build (data=4, model=2) meshes on one CPU.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


import itertools

import pytest


@pytest.fixture(scope="session")
def demo_prepared_corpus(tmp_path_factory):
    """Real English, through the real pipeline: the first 1,500 documents of the demo corpus
    (Python's own documentation), a PMI masking vocabulary built from them, and the corpus
    prepared with those units at 64 tokens per sequence. Returns the data directory."""
    from pmi_jax.preprocess.vocab.build_vocab import VocabOptions, build_vocabulary
    from pmi_jax.preprocess.text.demo_corpus import iter_demo_documents
    from pmi_jax.preprocess.corpus.prepare import PrepareConfig, prepare

    root = tmp_path_factory.mktemp("demo_prepared")
    text = root / "text.txt"
    text.write_text("\n\n".join(itertools.islice(iter_demo_documents(), 1500)))
    vocab = str(root / "vocab_pmi")
    build_vocabulary([str(text)], vocab, VocabOptions(measure="pmi", size=4000, min_count=3, workers=1))
    data = str(root / "data")
    prepare(PrepareConfig(inputs=(str(text),), output=data, units=(("pmi", vocab),), seq_len=64,
                          validation_fraction=0.05, wordpiece_size=4000, seed=0))
    return data
