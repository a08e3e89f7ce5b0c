"""The paper's comparison of masking schemes as experiment configs (docs/experiments.md).

One config per scale; every scheme is trained with the same config and seed, chosen with
`--scheme`:
    demo        a tiny BERT on the demo corpus, CPU, minutes (`python3 dev.py demo` runs two schemes)
    paper       BERT-base with the paper's Table 5 hyper-parameters, 1M steps, six schemes on one corpus
    paper_2_4m  the same for 2.4M steps (§5.1, Figure 2, Tables 2, 6-8), its own learning-rate decay
    rate30      `demo` at a 30% masking rate (data.mask_rate=0.3), validated at 15%
"""
from pmi_jax.config import PAPER_SCHEMES

# The schemes of the paper's comparison (Levine et al. 2021, §3 and §4), in its order:
# pmi_jax.config.PAPER_SCHEMES, the first six of SCHEMES (informask, after the paper, is the
# seventh). Tables 6-7 and Figure 1 hold all six; Table 2 four of them (random_token,
# random_span, naive_pmi, pmi).
__all__ = ["PAPER_SCHEMES"]
