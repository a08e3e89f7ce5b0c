"""What limits each scheme difference of a comparison, and how many seeds would separate it.

    python docs/cpu_effect/scale.py RUN [RUN ...]     # the run directories given to `pmi-jax compare`

For each table and step of `compare`'s report: the difference, its seed-aware half-width, the
standard errors of its text part (paired bootstrap; it still holds the run-to-run text noise
that the seed s.d.s hold too, so the projection leans conservative) and seed part (each
scheme's seed s.d., three seeds as run), and the seeds per scheme at which the half-width would fall below |difference| if the
difference and the seed spread stayed as measured (docs/experiments.md, "The comparison on CPU").
"""
import sys

import numpy as np
from scipy import stats

from pmi_jax.compare.perplexity_tables import perplexity_tables
from pmi_jax.compare.runs import read_run


def seeds_needed(estimate: float, text_var: float, var_a: float, var_b: float, most: int = 200) -> int | None:
    """var_a, var_b: each scheme's variance of per-seed means (Welch, as intervals.py)."""
    for n in range(2, most):
        seed_part = (var_a + var_b) / n
        df = (text_var + seed_part) ** 2 / ((var_a / n) ** 2 / (n - 1) + (var_b / n) ** 2 / (n - 1))
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
            sd = {v.scheme: v.seed_sd for v in c.values}
            var_a, var_b = sd[d.first] ** 2, sd[d.second] ** 2
            seeds = len(table.seeds[d.first])
            print(f"{table.title}, step {step.step}, {d.first} - {d.second}: {d.interval.estimate:+.3f}, "
                  f"half-width {(d.interval.high - d.interval.low) / 2:.3f}; s.e. text {np.sqrt(text_var):.4f}, "
                  f"seed {np.sqrt((var_a + var_b) / seeds):.4f} (s.d.s {sd[d.first]:.4f}, {sd[d.second]:.4f}); "
                  "seeds per scheme to separate: "
                  f"{seeds_needed(d.interval.estimate, text_var, var_a, var_b) or 'over 200'}")
