"""Comparing masking schemes the way the paper does (`pmi-jax compare`).

    runs     what a training run directory holds: its config, training metrics, eval results
    report   the comparison tables (the paper's Table 4 and Table 2 shapes) and report.md
    plots    the PNG figures (MLM loss, single-token perplexity, downstream score vs step)
    write    the whole comparison as one call (`write_report`), what the command runs
"""
