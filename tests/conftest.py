"""Shared test setup: 8 virtual CPU devices for mesh tests, quiet TensorFlow, a persistent XLA cache on request."""
import os

# Must precede any jax import: lets sharding tests build (data=4, model=2) meshes on one CPU.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


import itertools

import pytest


@pytest.fixture(scope="module")
def xla_compilation_cache(tmp_path_factory):
    """A persistent XLA cache for a module's runs and their subprocesses, shared by the modules
    that use it (`pytestmark`): their runs compile the same small programs again and again, and
    compiling takes far longer than running. Reset after each module, so that no other sees it."""
    import jax
    from jax._src import compilation_cache as cache

    path = str(tmp_path_factory.getbasetemp() / "xla_cache")
    previous = jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    cache.reset_cache()
    with pytest.MonkeyPatch.context() as env:  # for the subprocesses; restores what was set before
        env.setenv("JAX_COMPILATION_CACHE_DIR", path)
        env.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        yield
    jax.config.update("jax_compilation_cache_dir", previous[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", previous[1])
    cache.reset_cache()


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
