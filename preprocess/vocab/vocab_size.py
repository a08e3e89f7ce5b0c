"""Choosing the masking vocabulary's size from hand-labelled n-grams (the paper's Appendix A).

Levine et al. 2021 label 1,000 n-grams as collocation or not and score lists of the top M
n-grams (Appendix A, Figure 3): recall r of the positives, complement recall c of the negatives,
f = 2·r·c / (r + c); the recommended size has the highest f (smallest on ties: our rule; the
paper read 800K off its plot). `order` picks which n-grams make the list: `shares` (what
`vocab build --size M` writes, the default) or `score` (the paper's wording: the M best scores
over all lengths). Both read one built vocabulary: build it larger than the sizes you try.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from pmi_jax.errors import UserInputError
from pmi_jax.formats import masking_vocab
from pmi_jax.storage import atomic_file, gfile
from pmi_jax.preprocess.vocab import vocab_selection

PAPER_STEP = 50_000  # Appendix A: "we increased a list size M in steps of 50K"
ORDERS = ("shares", "score")


@dataclasses.dataclass(frozen=True)
class ListScore:
    size: int
    recall: float  # r, percent
    complement_recall: float  # c, percent
    f: float


@dataclasses.dataclass(frozen=True)
class Selection:
    scores: list[ListScore]
    recommended: ListScore
    positives: int
    negatives: int
    skipped_sizes: list[int]  # sizes this vocabulary directory cannot tell (see `_lists`)


def read_labels(path: str) -> dict[str, bool]:
    """`n-gram<TAB>1|0` per line -> {n-gram in the vocabulary's word normalisation: is collocation}.

    N-grams are split into words as the vocabulary's are (preprocess/words.py: uncased BERT basic
    tokenizer), so "New York" matches `new york`. Blank lines are skipped; anything else that is
    not a 2..5-word n-gram with a 0/1 label, and an n-gram labelled twice, is an error naming
    its line.
    """
    from pmi_jax.preprocess.text.words import split_words

    if not gfile.exists(path):
        raise UserInputError(f"--labels {path}: no such file")
    with gfile.GFile(path, "rb") as f:
        try:
            lines = f.read().decode("utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise UserInputError(f"--labels {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    entries = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        text, tab, label = line.rpartition("\t")
        if not tab or label.strip() not in ("0", "1") or not text.strip():
            raise UserInputError(f"{path}:{number}: expected `n-gram<TAB>1` (collocation) or `n-gram<TAB>0` "
                                 f"(not), got {line[:60]!r}")
        entries.append((number, text, label.strip() == "1"))
    words = split_words([text for _, text, _ in entries]) if entries else []
    labels: dict[str, bool] = {}
    first_line: dict[str, int] = {}
    for (number, text, label), ngram_words in zip(entries, words):
        if not masking_vocab.MIN_N <= len(ngram_words) <= masking_vocab.MAX_N:
            raise UserInputError(f"{path}:{number}: {text!r} is {len(ngram_words)} word(s); a masking vocabulary "
                                 f"holds {masking_vocab.MIN_N} to {masking_vocab.MAX_N}-grams")
        ngram = " ".join(ngram_words)
        if ngram in labels:
            raise UserInputError(f"{path}:{number}: {ngram!r} is labelled again (first on line {first_line[ngram]})")
        labels[ngram], first_line[ngram] = label, number
    positives = sum(labels.values())
    if not positives or positives == len(labels):
        raise UserInputError(f"--labels {path}: needs n-grams labelled 1 and n-grams labelled 0 "
                             f"(has {positives} of 1 and {len(labels) - positives} of 0)")
    return labels


def list_sizes(total: int, step: int) -> list[int]:
    """step, 2·step, ... up to `total`, and `total` itself."""
    if step < 1:
        raise UserInputError(f"--step {step}: must be at least 1")
    if step > total:
        raise UserInputError(f"--step {step}: larger than the vocabulary ({total} n-grams); choose a smaller step "
                             "or build the vocabulary larger")
    sizes = list(range(step, total + 1, step))
    return sizes if sizes[-1] == total else sizes + [total]


def _lists(directory: str, rows: Sequence[tuple], sizes: Sequence[int], order: str, labelled: Sequence[str]):
    """(size, the labelled n-grams in the list of that size) for each size this directory determines.

    Each labelled n-gram's rank is looked up once; membership at a size is then a comparison, so
    a vocabulary of a million n-grams and thirty sizes cost one pass over the table.
    With `shares`, length n holds min(quota_n(M), what the vocabulary held); a length that held
    its full quota at build time says nothing beyond it, so a size whose quota for that length
    is larger (possible for bigrams, which take the rounding remainder) is skipped.
    """
    if order == "score":
        ranked = sorted(range(len(rows)), key=lambda i: (-rows[i][3], -rows[i][2], rows[i][0]))
        rank = {rows[i][0]: position for position, i in enumerate(ranked)}
        for size in sizes:
            yield size, {g for g in labelled if rank.get(g, size) < size}
        return
    stats = masking_vocab.read_stats(directory)
    try:
        shares = [float(s) for s in stats["options"]["shares"]]
        built_quota = {int(n): int(q) for n, q in stats["quota"].items()}
    except (KeyError, TypeError, ValueError):
        raise UserInputError(f"{directory}: stats.json lacks options.shares or quota (not made by `vocab "
                             "build`?); use --order score") from None
    held: dict[int, int] = {}
    rank = {}  # n-gram -> (n, rank within its length); the table is ordered by n, then rank
    for ngram, n, _, _ in rows:
        rank[ngram] = (n, held.get(n, 0))
        held[n] = held.get(n, 0) + 1
    for size in sizes:
        quota = vocab_selection.quotas(size, shares)
        if any(q > held.get(n, 0) >= built_quota.get(n, 0) for n, q in quota.items()):
            yield size, None
            continue
        yield size, {g for g in labelled if g in rank and rank[g][1] < quota.get(rank[g][0], 0)}


def score_list(listed: set, labels: dict[str, bool]) -> tuple[float, float, float]:
    """(r, c, f) in percent of one list on the labels (Appendix A's definitions)."""
    positives = [g for g, is_collocation in labels.items() if is_collocation]
    negatives = [g for g, is_collocation in labels.items() if not is_collocation]
    r = 100.0 * sum(g in listed for g in positives) / len(positives)
    c = 100.0 * sum(g not in listed for g in negatives) / len(negatives)
    f = 2 * r * c / (r + c) if r + c else 0.0
    return r, c, f


def select_size(directory: str, labels_path: str, step: int = PAPER_STEP, order: str = "shares",
                plot: str | None = None) -> Selection:
    """r, c and f of every list size of the vocabulary in `directory`, the recommended size, and
    (with `plot`) Figure 3's plot written there as PNG."""
    if order not in ORDERS:
        raise UserInputError(f"--order {order}: expected one of {', '.join(ORDERS)}")
    labels = read_labels(labels_path)
    rows = masking_vocab.read_table(directory)
    scores, skipped = [], []
    for size, listed in _lists(directory, rows, list_sizes(len(rows), step), order, list(labels)):
        if listed is None:
            skipped.append(size)
            continue
        scores.append(ListScore(size, *score_list(listed, labels)))
    if not scores:
        raise UserInputError(f"{directory}: no list size can be read off this vocabulary with --order {order}")
    best = max(scores, key=lambda s: (s.f, -s.size))
    positives = sum(labels.values())
    selection = Selection(scores, best, positives, len(labels) - positives, skipped)
    if plot:
        write_plot(selection, plot, title=f"{directory} ({order} order)")
    return selection


def write_plot(selection: Selection, path: str, title: str) -> None:
    """Figure 3's shape: r, c and f against list size, the recommended size marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [s.size for s in selection.scores]
    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    axes.plot(sizes, [s.recall for s in selection.scores], marker="o", label="r (recall of collocations)")
    axes.plot(sizes, [s.complement_recall for s in selection.scores], marker="o",
              label="c (complement recall of non-collocations)")
    axes.plot(sizes, [s.f for s in selection.scores], marker="o", label="f = 2rc / (r + c)")
    axes.axvline(selection.recommended.size, color="grey", linestyle="--",
                 label=f"recommended: {selection.recommended.size:,}")
    axes.xaxis.set_major_formatter(lambda x, _: f"{x / 1000:g}K" if x >= 1000 else f"{x:g}")
    axes.set_xlabel("masking vocabulary size (top-ranked n-grams)")
    axes.set_ylabel("percent of labelled n-grams")
    axes.set_title(title, fontsize=9)
    axes.set_ylim(0, 102)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    with atomic_file(path, "wb") as f:
        figure.savefig(f, format="png", dpi=110, bbox_inches="tight")
    plt.close(figure)
