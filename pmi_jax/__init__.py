"""pmi-jax: PMI-Masking for BERT-style masked language model pretraining.

Pipeline, one package or module per stage:
    pmi_jax.preprocess     masking vocabulary (n-gram counts, PMI_n) and prepared corpus (TFRecords)
    pmi_jax.tasks          seqio tasks applying each masking scheme inside tf.data
    pmi_jax.model          Flax BERT
    pmi_jax.train          sharded pretraining loop
    pmi_jax.eval           perplexity and fine-tuning
    pmi_jax.configs        experiment configs (`--config tiny`, `--config experiments/paper`)
The repository keeps preprocess/ and configs/ at its top; the wheel installs them in here
(setup.py), and `_source_tree` gives a checkout the same names.
"""
from pmi_jax import _source_tree

__version__ = "0.1.0"

_source_tree.install()
