"""The paper's comparison of masking schemes as experiment configs (docs/experiments.md).

One config per scale; every scheme is trained with the same config and seed, chosen with
`--scheme`:
    demo        a tiny BERT on the demo corpus, CPU, minutes (`python3 dev.py demo` runs two schemes)
    paper       BERT-base with the paper's Table 5 hyper-parameters, 1M steps, six schemes on one corpus
    paper_2_4m  the same for 2.4M steps (§5.1, Figure 2, Tables 2, 6-8), its own learning-rate decay
"""
# The schemes of the paper's comparison (Levine et al. 2021, §3 and §4): Tables 6-7 and Figure 1 hold
# all six; Table 2 the four of random_token, random_span, naive_pmi, pmi. In the paper's order.
PAPER_SCHEMES = ("random_token", "whole_word", "random_span", "frequency", "naive_pmi", "pmi")
