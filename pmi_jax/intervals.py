"""95% intervals for mean NLLs over scored text, and for differences between masking schemes.

Two sources of uncertainty: the scored text (a paired bootstrap over whole sequences, the same
resamples for every run) and the training seed (a t interval from the pooled within-scheme
variance of per-seed means, added to the bootstrap's variance, Welch-Satterthwaite degrees of
freedom; a bootstrap over two or three seeds cannot represent that spread). Deterministic: the
bootstrap's generator is seeded. Why: docs/experiments.md, "Intervals".
"""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0


@dataclasses.dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def per_sequence(sequence_N: np.ndarray, nll_N: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sequence ids [S], NLL sums [S], token counts [S]) of per-token scores."""
    ids_S, inverse_N = np.unique(sequence_N, return_inverse=True)
    return (ids_S, np.bincount(inverse_N, weights=nll_N, minlength=len(ids_S)),
            np.bincount(inverse_N, minlength=len(ids_S)).astype(np.float64))


def resample_weights(num_sequences: int, samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """[B, S]: how often each sequence is drawn in each bootstrap resample (S draws with replacement)."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(num_sequences, np.full(num_sequences, 1.0 / num_sequences), size=samples).astype(np.float64)


def _percentile(values_B: np.ndarray, estimate: float) -> Interval:
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(values_B, [tail, 100 - tail])
    return Interval(float(estimate), float(low), float(high))


def mean_interval(sums_S: np.ndarray, counts_S: np.ndarray, *, samples: int = BOOTSTRAP_SAMPLES,
                  seed: int = BOOTSTRAP_SEED) -> Interval:
    """Mean NLL per token of one run, with a percentile bootstrap interval over its sequences."""
    weights_BxS = resample_weights(len(sums_S), samples, seed)
    return _percentile(weights_BxS @ sums_S / (weights_BxS @ counts_S), sums_S.sum() / counts_S.sum())


@dataclasses.dataclass(frozen=True)
class SchemeValue:
    scheme: str
    interval: Interval  # mean NLL over the scheme's seeds
    seed_means: tuple[float, ...]  # one per training seed, in the order given


@dataclasses.dataclass(frozen=True)
class Difference:
    first: str
    second: str
    interval: Interval  # first minus second, mean NLL; seed-aware where the comparison is
    text_interval: Interval  # the same difference, text resampled only (paired bootstrap)
    seed_spread: float  # the larger within-scheme range of per-seed means of the two schemes (0 for one seed)


@dataclasses.dataclass(frozen=True)
class Comparison:
    values: list[SchemeValue]
    differences: list[Difference]
    seed_sd: float | None  # pooled within-scheme standard deviation of per-seed means; None: no scheme has 2 seeds
    seed_df: int  # its degrees of freedom (0: the intervals cover the scored text only)
    best: str | None  # lowest, and separated from every other scheme by a seed-aware interval
    num_sequences: int
    num_tokens: int

    @property
    def seed_aware(self) -> bool:
        return self.seed_df > 0


def compare_schemes(sums: dict[str, np.ndarray], counts_S: np.ndarray, *, samples: int = BOOTSTRAP_SAMPLES,
                    seed: int = BOOTSTRAP_SEED) -> Comparison:
    """Mean NLLs of schemes, and every pairwise difference, from runs scored on the same tokens.

    `sums[scheme]` is [R, S]: per training seed (R of them), the NLL sum of each of the S
    scored sequences; `counts_S` the scored tokens per sequence, the same for every run.
    """
    weights_BxS = resample_weights(len(counts_S), samples, seed)
    tokens_B = weights_BxS @ counts_S
    means, boot = {}, {}
    for scheme, sums_RxS in sums.items():
        sums_RxS = np.atleast_2d(np.asarray(sums_RxS, np.float64))
        means[scheme] = sums_RxS.sum(axis=1) / counts_S.sum()  # [R]
        boot[scheme] = (weights_BxS @ sums_RxS.T / tokens_B[:, None]).mean(axis=1)  # [B] seed-averaged
    seed_df = sum(len(m) - 1 for m in means.values())
    seed_var = (sum(float(np.sum((m - m.mean()) ** 2)) for m in means.values()) / seed_df) if seed_df else None

    def interval(estimate: float, boot_B: np.ndarray, seed_factor: float) -> Interval:
        if not seed_df:
            return _percentile(boot_B, estimate)
        text, seed = float(np.var(boot_B, ddof=1)), seed_var * seed_factor
        # Welch-Satterthwaite: the text part's variance is known to many degrees of freedom, the
        # seed part's to seed_df; the sum's effective df lies between seed_df and infinity.
        df = seed_df * ((text + seed) / seed) ** 2 if seed > 0 else np.inf
        half = stats.t.ppf((1 + CONFIDENCE) / 2, df) * np.sqrt(text + seed)
        return Interval(estimate, estimate - half, estimate + half)

    values = [SchemeValue(s, interval(float(m.mean()), boot[s], 1 / len(m)), tuple(float(x) for x in m))
              for s, m in means.items()]
    differences = []
    for a, b in itertools.permutations(means, 2):
        estimate = float(means[a].mean() - means[b].mean())
        delta_B = boot[a] - boot[b]
        spread = max(float(np.ptp(means[a])), float(np.ptp(means[b])))
        differences.append(Difference(a, b, interval(estimate, delta_B, 1 / len(means[a]) + 1 / len(means[b])),
                                      _percentile(delta_B, estimate), spread))
    best = None
    if seed_df and len(means) > 1:
        lowest = min(means, key=lambda s: means[s].mean())
        if all(d.interval.high < 0 for d in differences if d.first == lowest):
            best = lowest
    return Comparison(values, differences, float(np.sqrt(seed_var)) if seed_var is not None else None, seed_df,
                      best, len(counts_S), int(counts_S.sum()))
