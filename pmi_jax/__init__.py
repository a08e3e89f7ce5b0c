"""pmi-jax: PMI-Masking for BERT-style masked language model pretraining.

Pipeline, one package or module per stage:
    preprocess/            masking vocabulary (n-gram counts, PMI_n) and prepared corpus (TFRecords)
    pmi_jax.tasks          seqio tasks applying each masking scheme inside tf.data
    pmi_jax.model          Flax BERT
    pmi_jax.train          sharded pretraining loop
    pmi_jax.eval           perplexity and fine-tuning
"""

__version__ = "0.1.0"
