"""Perplexity tables with intervals: one per unit kind (token, word, a unit set such as pmi).

For each step every run was scored at, the runs are grouped by scheme (several training seeds
of a scheme are one group) and `pmi_jax.intervals.compare_schemes` gives each scheme's value
and every pairwise difference with a 95% interval, paired over the same scored tokens. A scheme
is in bold only where its difference from every other scheme excludes 0 in the seed-aware
interval; otherwise the table says in words that this scale does not separate them. With one
seed per scheme the intervals cover the scored text only, and the table says so.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from pmi_jax import intervals
from pmi_jax.compare.runs import Run
from pmi_jax.config import SCHEMES

UNIT_TITLES = {"token": "Single-token perplexity", "word": "Whole-word perplexity"}
MULTI_TITLES = {"word": "Whole-word perplexity, words of two or more WordPieces only"}


def scheme_order(runs: list[Run]) -> list[str]:
    """Schemes in the project's order (SCHEMES), unknown ones after, alphabetically."""
    names = {r.scheme for r in runs}
    return [s for s in SCHEMES if s in names] + sorted(names - set(SCHEMES))


def _title(unit: str, multi: bool) -> str:
    if multi:
        return MULTI_TITLES.get(unit, f"Perplexity with `{unit}` units masked whole, units of two or more tokens only")
    return UNIT_TITLES.get(unit, f"Perplexity with `{unit}` units masked whole")


@dataclasses.dataclass
class StepResult:
    step: int
    comparison: intervals.Comparison | None  # None: some run has no per-token scores, or other scored tokens
    perplexity: dict[str, list[float]]  # scheme -> per-seed perplexity (always available)
    problem: str | None = None


def _comparison(results: dict[str, list[dict]], multi: bool) -> tuple[intervals.Comparison | None, str | None]:
    """Pairs the per-token scores of every run; None with the reason where they cannot be paired."""
    everything = [r for rs in results.values() for r in rs]
    if any(r.get("scores") is None for r in everything):
        return None, ("some runs' results hold no per-token scores (written before `eval perplexity` kept "
                      "them): rerun `pmi-jax eval perplexity` for intervals")
    if len({r.get("scored_set") for r in everything}) != 1:
        return None, ("the runs were scored on different tokens (another --seed, --positions, --max-sequences, "
                      "split or corpus): no paired interval")
    first = everything[0]["scores"]
    keep_N = np.ones(len(first["nll"]), bool)
    if multi:
        from pmi_jax.eval.perplexity import ScoredTokens, multi_token_subset

        keep_N = multi_token_subset(ScoredTokens(first["sequence"], first["position"], first["unit"], first["nll"]))
        if not keep_N.any():
            return None, "no scored unit has two or more tokens"
    ids_S, _, counts_S = intervals.per_sequence(first["sequence"][keep_N], first["nll"][keep_N])
    sums = {}
    for scheme, rs in results.items():
        rows = []
        for r in rs:
            _, sums_S, _ = intervals.per_sequence(r["scores"]["sequence"][keep_N], r["scores"]["nll"][keep_N])
            rows.append(sums_S)
        sums[scheme] = np.stack(rows)
    return intervals.compare_schemes(sums, counts_S), None


def _steps(runs: list[Run], key) -> list[int]:
    steps = None
    for r in runs:
        have = set(r.perplexity.get(key, {}))
        steps = have if steps is None else steps & have
    return sorted(steps or ())


def _fmt_ppl(nll: float) -> str:
    return f"{math.exp(nll):.2f}"


def _fmt_interval(i: intervals.Interval, digits: int = 3) -> str:
    return f"{i.estimate:+.{digits}f} [{i.low:+.{digits}f}, {i.high:+.{digits}f}]"


def _multiplicity(pairs: int, steps: int) -> str:
    """How many intervals a table holds: each is 95% on its own, none is corrected for the others."""
    total = pairs * steps
    return (f"This table makes {pairs} pairwise comparison{'s' * (pairs != 1)} per step, {total} in all, each a "
            "95% interval not corrected for multiplicity: with no true difference anywhere, about "
            f"{0.05 * total:.1f} of them would exclude 0 by chance.")


@dataclasses.dataclass
class PerplexityTable:
    title: str
    note: str
    unit: str
    multi: bool
    schemes: list[str]
    seeds: dict[str, list]  # scheme -> training seeds of its runs
    steps: list[StepResult]

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", self.note, ""]
        header = "| scheme | seeds | " + " | ".join(f"step {s.step}" for s in self.steps) + " |"
        lines += [header, "|---|---|" + "---:|" * len(self.steps)]
        for scheme in self.schemes:
            cells = []
            for s in self.steps:
                c = s.comparison
                if c is None:
                    per_seed = s.perplexity[scheme]
                    cells.append(f"{np.exp(np.mean(np.log(per_seed))):.2f}")
                    continue
                v = next(v for v in c.values if v.scheme == scheme)
                text = f"{_fmt_ppl(v.interval.estimate)} [{_fmt_ppl(v.interval.low)}, {_fmt_ppl(v.interval.high)}]"
                if len(v.seed_means) > 1:
                    text += f" (seeds {min(map(math.exp, v.seed_means)):.2f}–{max(map(math.exp, v.seed_means)):.2f})"
                cells.append(f"**{text}**" if c.best == scheme else text)
            lines.append(f"| {scheme} | {len(self.seeds[scheme])} | " + " | ".join(cells) + " |")
        lines.append("")
        pairs = [(a, b) for i, a in enumerate(self.schemes) for b in self.schemes[i + 1:]]
        if pairs and any(s.comparison for s in self.steps):
            aware = any(s.comparison and s.comparison.seed_aware for s in self.steps)
            lines += ["Differences in mean NLL (nats per token; negative: the first scheme is lower), 95% interval"
                      + (" (seed-aware), and the larger within-scheme range of per-seed means:" if aware
                         else " over the scored text only:"), "",
                      "| difference | " + " | ".join(f"step {s.step}" for s in self.steps) + " |",
                      "|---|" + "---:|" * len(self.steps)]
            for a, b in pairs:
                cells = []
                for s in self.steps:
                    if s.comparison is None:
                        cells.append("–")
                        continue
                    d = next(d for d in s.comparison.differences if (d.first, d.second) == (a, b))
                    mark = " ✓" if d.interval.excludes_zero else ""
                    seeds = (f"; seeds {d.seed_spread:.3f}" if d.seed_aware else
                             "; text only (a scheme with one seed)" if s.comparison.seed_aware else "")
                    cells.append(f"{_fmt_interval(d.interval)}{mark}{seeds}")
                lines.append(f"| {a} − {b} | " + " | ".join(cells) + " |")
            lines += ["", "✓: the interval excludes 0. " + _multiplicity(len(pairs), len(self.steps)), ""]
        lines += [self.verdict(), ""]
        return "\n".join(lines)

    def verdict(self) -> str:
        """What the last step's intervals show, in words."""
        last = self.steps[-1]
        c = last.comparison
        if c is None:
            return f"At step {last.step} no interval could be computed: {last.problem}. No scheme is marked best."
        separated = [d for d in c.differences if d.interval.excludes_zero and d.interval.estimate < 0]
        pairs = "; ".join(f"{d.first} below {d.second} by {-d.interval.estimate:.3f} nats" for d in separated)
        scale = f"{c.num_tokens} scored tokens in {c.num_sequences} sequences"
        if not c.seed_aware:
            return (f"At step {last.step}: each scheme has one training seed, so these intervals cover the scored "
                    f"text only ({scale}), not the training seed: two runs of one scheme can differ as much as two "
                    "schemes do, so no scheme is marked best. "
                    + (f"On this text, with this seed: {pairs}." if pairs else
                       "On this text no difference excludes 0 either."))
        seeds = ", ".join(f"{s} {len(self.seeds[s])}" for s in self.schemes)
        spread = "seed-to-seed s.d. of per-seed means " + ", ".join(
            f"{v.scheme} {v.seed_sd:.3f}" for v in c.values if v.seed_sd is not None) + " nats"
        aware = [d.df for d in c.differences if d.seed_aware]
        spread += f"; Welch df {min(aware):.1f}–{max(aware):.1f}"
        if c.best:
            return (f"At step {last.step}, **{c.best}** is lowest and its difference from every other scheme "
                    f"excludes 0 in the seed-aware interval (training seeds: {seeds}; {spread}; {scale}).")
        return (f"At step {last.step}, this scale does not separate the schemes: no scheme's difference from every "
                f"other excludes 0 once training seeds are accounted for (training seeds: {seeds}; {spread}; "
                f"{scale}). " + (f"Separated pairs: {pairs}." if pairs else "No pair is separated."))


def perplexity_tables(runs: list[Run], split: str | None = None) -> list[PerplexityTable]:
    """One table per unit kind every run was scored with on `split` (default: validation where every
    run has it), token first; for units other than token a second table on the units of two or
    more tokens (for word: multi-piece words)."""
    keys = set.intersection(*(set(r.perplexity) for r in runs)) if runs else set()
    if split is None:
        split = "validation" if any(k[0] == "validation" for k in keys) else (min(keys)[0] if keys else None)
    units = sorted((k[1] for k in keys if k[0] == split), key=lambda u: (u != "token", u != "word", u))
    schemes = scheme_order(runs)
    by_scheme = {s: [r for r in runs if r.scheme == s] for s in schemes}
    tables = []
    for unit in units:
        steps = _steps(runs, (split, unit))
        if not steps:
            continue
        for multi in ([False, True] if unit != "token" else [False]):
            results = []
            for step in steps:
                per = {s: [r.perplexity[(split, unit)][step] for r in rs] for s, rs in by_scheme.items()}
                comparison, problem = _comparison(per, multi)
                if multi and comparison is None and problem == "no scored unit has two or more tokens":
                    break
                ppl = {s: [(rr.get("multi_token") or {}).get("perplexity", rr["perplexity"]) if multi
                           else rr["perplexity"] for rr in rs] for s, rs in per.items()}
                results.append(StepResult(step, comparison, ppl, problem))
            if not results:
                continue
            first = runs[0].perplexity[(split, unit)][steps[-1]]
            what = ("each scored token masked alone, nothing else corrupted; the paper's Table 4 measure"
                    if unit == "token" else
                    f"every token of one {'whole word' if unit == 'word' else f'`{unit}` unit'} masked at once, "
                    "nothing else corrupted; our own analysis, beyond the paper (docs/experiments.md)")
            # The test set by name (the paper's Table 4 scores 110K held-out OpenWebText tokens, §4.2).
            test_sets = sorted({str(r.perplexity[(split, unit)][steps[-1]].get("data")) for r in runs})
            note = (f"{_title(unit, multi)} on the {split} split of `{'`, `'.join(test_sets)}` ({what}; units "
                    f"drawn from seed {first.get('seed')}, positions {first.get('positions')}), per pretraining "
                    "step; lower is better. Each cell: perplexity of the scheme's runs (geometric mean over "
                    "training seeds) with its 95% interval, and the range over seeds where there are several."
                    + (" ⚠ The runs were scored on different corpora: their numbers do not compare."
                       if len(test_sets) > 1 else ""))
            tables.append(PerplexityTable(_title(unit, multi), note, unit, multi, schemes,
                                          {s: [r.seeds for r in rs] for s, rs in by_scheme.items()}, results))
    return tables
