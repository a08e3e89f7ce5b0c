"""What limits each scheme difference of a comparison, and how many seeds would separate it.

    python docs/cpu_effect/scale.py RUN [RUN ...]     # the run directories given to `pmi-jax compare`

For each table and step of `compare`'s report: the difference, its seed-aware half-width, the
standard errors of its text part (paired bootstrap) and seed part (pooled seed s.d., three seeds
as run), and the seeds per scheme at which the half-width would fall below |difference| if the
difference and the seed spread stayed as measured (docs/experiments.md, "The comparison on CPU").
"""
import sys

import numpy as np
from scipy import stats

from pmi_jax.compare.perplexity_tables import perplexity_tables
from pmi_jax.compare.runs import read_run


def seeds_needed(estimate: float, text_var: float, seed_var: float, most: int = 200) -> int | None:
    for n in range(2, most):
        seed_part = seed_var * 2 / n
        df = 2 * (n - 1) * ((text_var + seed_part) / seed_part) ** 2  # Welch-Satterthwaite, as intervals.py
        if stats.t.ppf(0.975, df) * np.sqrt(text_var + seed_part) < abs(estimate):
            return n
    return None


runs = [read_run(path) for path in sys.argv[1:]]
for table in perplexity_tables(runs):
    for step in table.steps:
        c = step.comparison
        if c is None or not c.seed_aware:
            print(f"{table.title}, step {step.step}: no seed-aware comparison")
            continue
        for d in c.differences:
            if table.schemes.index(d.first) > table.schemes.index(d.second):
                continue
            text_var = ((d.text_interval.high - d.text_interval.low) / (2 * stats.norm.ppf(0.975))) ** 2
            seeds = len(table.seeds[d.first])
            print(f"{table.title}, step {step.step}, {d.first} - {d.second}: {d.interval.estimate:+.3f}, "
                  f"half-width {(d.interval.high - d.interval.low) / 2:.3f}; s.e. text {np.sqrt(text_var):.4f}, "
                  f"seed {c.seed_sd * np.sqrt(2 / seeds):.4f} (s.d. {c.seed_sd:.4f}); seeds per scheme to "
                  f"separate: {seeds_needed(d.interval.estimate, text_var, c.seed_sd ** 2) or 'over 200'}")
