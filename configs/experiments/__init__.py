"""The paper's comparison of masking schemes as experiment configs (docs/experiments.md).

One config per scale; every scheme is trained with the same config and seed, chosen with
`--scheme`:
    demo    a tiny BERT on the demo corpus, CPU, minutes (`python3 dev.py demo` runs two schemes)
    paper   BERT-base with the paper's Table 5 hyper-parameters, six schemes on one corpus
"""
from pmi_jax.config import SCHEMES

# The schemes of the paper's comparison (Levine et al. 2021, Tables 1-4), in its order: all of
# pmi_jax.config.SCHEMES, which lists them in that order.
PAPER_SCHEMES = SCHEMES
