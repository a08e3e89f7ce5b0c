"""95% intervals for mean NLLs over scored text, and for differences between masking schemes.

Two sources of uncertainty: the scored text (a paired bootstrap over whole sequences, the same
resamples for every run) and the training seed (each scheme's own variance of per-seed means,
Welch's t with Welch-Satterthwaite degrees of freedom: schemes may differ in how much their
seeds spread, and two or three seeds are too few for a bootstrap over seeds). A run's
per-seed mean already carries the text noise that is not shared by the scheme's other seeds,
so only the shared part of the bootstrap's variance is added to the seed part. Deterministic:
the bootstrap's generator is seeded. Why: docs/experiments.md, "Intervals".
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
    seed_sd: float | None  # standard deviation of seed_means; None: one seed


@dataclasses.dataclass(frozen=True)
class Difference:
    first: str
    second: str
    interval: Interval  # first minus second, mean NLL; seed-aware where both schemes have 2+ seeds
    text_interval: Interval  # the same difference, text resampled only (paired bootstrap)
    seed_spread: float  # the larger within-scheme range of per-seed means of the two schemes (0 for one seed)
    df: float  # the t quantile's degrees of freedom (Welch-Satterthwaite); 0: text bootstrap only

    @property
    def seed_aware(self) -> bool:
        return self.df > 0


@dataclasses.dataclass(frozen=True)
class Comparison:
    values: list[SchemeValue]
    differences: list[Difference]  # both orders of every pair
    best: str | None  # lowest, and separated from every other scheme by a seed-aware interval
    num_sequences: int
    num_tokens: int

    @property
    def seed_aware(self) -> bool:
        return any(d.seed_aware for d in self.differences)

    @property
    def num_pairs(self) -> int:
        """Comparisons the table makes, each at CONFIDENCE and not corrected for multiplicity."""
        return len(self.values) * (len(self.values) - 1) // 2


@dataclasses.dataclass(frozen=True)
class _Scheme:
    means_R: np.ndarray  # per-seed mean NLL
    boot_B: np.ndarray  # seed-averaged mean NLL of each text resample
    own_text_var: float  # text variance of one run's mean not shared with the scheme's other seeds

    @property
    def seeds(self) -> int:
        return len(self.means_R)

    @property
    def seed_var(self) -> float:
        """Variance of the seed-averaged mean over training seeds (it includes own_text_var / seeds)."""
        return float(np.var(self.means_R, ddof=1)) / self.seeds


def _scheme(sums_RxS: np.ndarray, counts_S: np.ndarray, weights_BxS: np.ndarray, tokens_B: np.ndarray) -> _Scheme:
    sums_RxS = np.atleast_2d(np.asarray(sums_RxS, np.float64))
    boot_BxR = weights_BxS @ sums_RxS.T / tokens_B[:, None]
    own = 0.0
    if len(sums_RxS) > 1:  # each run's deviation from its scheme's per-sequence mean, resampled
        residual_BxR = weights_BxS @ (sums_RxS - sums_RxS.mean(axis=0)).T / tokens_B[:, None]
        own = float(np.var(residual_BxR, axis=0, ddof=1).sum()) / (len(sums_RxS) - 1)
    return _Scheme(sums_RxS.sum(axis=1) / counts_S.sum(), boot_BxR.mean(axis=1), own)


def _welch(estimate: float, boot_B: np.ndarray, schemes: list[_Scheme]) -> tuple[Interval, float]:
    """t interval of a seed-averaged mean (one scheme) or difference (two, boot_B paired), and its df.

    The bootstrap's variance holds each scheme's own text variance / seeds, which its seed
    variance already holds: that part is taken out once, so the text noise is not counted twice.
    """
    seed_parts = [s.seed_var for s in schemes]
    shared = float(np.var(boot_B, ddof=1)) - sum(s.own_text_var / s.seeds for s in schemes)
    total = max(shared, 0.0) + sum(seed_parts)
    # Welch-Satterthwaite: the shared text part is known to as many df as there are sequences (~inf).
    denominator = sum(v ** 2 / (s.seeds - 1) for v, s in zip(seed_parts, schemes))
    df = total ** 2 / denominator if denominator > 0 else np.inf
    half = stats.t.ppf((1 + CONFIDENCE) / 2, df) * np.sqrt(total)
    return Interval(estimate, estimate - half, estimate + half), float(df)


def compare_schemes(sums: dict[str, np.ndarray], counts_S: np.ndarray, *, samples: int = BOOTSTRAP_SAMPLES,
                    seed: int = BOOTSTRAP_SEED) -> Comparison:
    """Mean NLLs of schemes, and every pairwise difference, from runs scored on the same tokens.

    `sums[scheme]` is [R, S]: per training seed (R of them), the NLL sum of each of the S
    scored sequences; `counts_S` the scored tokens per sequence, the same for every run. A
    scheme with one seed has no seed variance of its own: its intervals cover the text only.
    """
    weights_BxS = resample_weights(len(counts_S), samples, seed)
    tokens_B = weights_BxS @ counts_S
    schemes = {name: _scheme(sums_RxS, counts_S, weights_BxS, tokens_B) for name, sums_RxS in sums.items()}

    def interval(estimate: float, boot_B: np.ndarray, members: list[_Scheme]) -> tuple[Interval, float]:
        if any(s.seeds < 2 for s in members):
            return _percentile(boot_B, estimate), 0.0
        return _welch(estimate, boot_B, members)

    values = []
    for name, s in schemes.items():
        value, _ = interval(float(s.means_R.mean()), s.boot_B, [s])
        values.append(SchemeValue(name, value, tuple(float(x) for x in s.means_R),
                                  float(np.std(s.means_R, ddof=1)) if s.seeds > 1 else None))
    differences = []
    for a, b in itertools.permutations(schemes, 2):
        sa, sb = schemes[a], schemes[b]
        estimate = float(sa.means_R.mean() - sb.means_R.mean())
        delta_B = sa.boot_B - sb.boot_B
        d, df = interval(estimate, delta_B, [sa, sb])
        spread = max(float(np.ptp(sa.means_R)), float(np.ptp(sb.means_R)))
        differences.append(Difference(a, b, d, _percentile(delta_B, estimate), spread, df))
    best = None
    if len(schemes) > 1:
        lowest = min(schemes, key=lambda s: schemes[s].means_R.mean())
        if all(d.seed_aware and d.interval.high < 0 for d in differences if d.first == lowest):
            best = lowest
    return Comparison(values, differences, best, len(counts_S), int(counts_S.sum()))
