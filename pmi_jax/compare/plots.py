"""The comparison's figures, as PNG files drawn by matplotlib's headless Agg backend.

One colour per masking scheme in every figure (`scheme_colour`), fixed by the scheme's place
in `pmi_jax.config.SCHEMES`, so that random_span is the same colour in the loss curves, the
perplexity plot and every downstream plot, and across reports.
"""
from __future__ import annotations

import matplotlib
import numpy as np

matplotlib.use("Agg")  # no display: CI, TPU VMs, laptops over SSH

import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
from matplotlib.ticker import MaxNLocator  # noqa: E402

from pmi_jax import storage  # noqa: E402
from pmi_jax.compare.perplexity_tables import PerplexityTable  # noqa: E402
from pmi_jax.compare.report import common_steps, labels  # noqa: E402
from pmi_jax.compare.runs import Run  # noqa: E402
from pmi_jax.config import SCHEMES  # noqa: E402

_PALETTE = plt.get_cmap("tab10").colors


def scheme_colour(scheme: str):
    index = SCHEMES.index(scheme) if scheme in SCHEMES else len(SCHEMES) + hash(scheme) % 4
    return _PALETTE[index % len(_PALETTE)]


def _save(figure, directory: str, name: str) -> str:
    with storage.atomic_file(storage.join(directory, name), "wb") as f:
        figure.savefig(f, format="png", dpi=110, bbox_inches="tight")
    plt.close(figure)
    return name


def _axes(title: str, ylabel: str):
    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    axes.set_title(title)
    axes.set_xlabel("pretraining step")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    return figure, axes


def mlm_loss(runs: list[Run], directory: str) -> str | None:
    if not any(r.training for r in runs):
        return None
    figure, axes = _axes("MLM training loss per masking scheme", "masked-LM loss (nats)")
    for label, run in zip(labels(runs), runs):
        steps = sorted(s for s in run.training if run.training[s].get("loss") is not None)
        axes.plot(steps, [run.training[s]["loss"] for s in steps], label=label, color=scheme_colour(run.scheme))
    axes.legend()
    return _save(figure, directory, "mlm_loss.png")


def validation_loss(runs: list[Run], directory: str) -> str | None:
    """Validation during training (`train.eval_every_steps`): the MLM loss on fixed held-out batches."""
    if not any(any("validation_loss" in row for row in r.training.values()) for r in runs):
        return None
    rates = {r.settings()["data.eval_mask_rate"] for r in runs}
    rate = f"masked at {100 * rates.pop():g}%" if len(rates) == 1 else "masked at different rates"
    figure, axes = _axes(f"MLM validation loss per masking scheme ({rate})", "masked-LM loss (nats)")
    for label, run in zip(labels(runs), runs):
        steps = sorted(s for s in run.training if run.training[s].get("validation_loss") is not None)
        axes.plot(steps, [run.training[s]["validation_loss"] for s in steps], marker="o", label=label,
                  color=scheme_colour(run.scheme))
    axes.legend()
    return _save(figure, directory, "validation_loss.png")


def perplexity(tables: list[PerplexityTable], directory: str) -> list[str]:
    """One figure per perplexity table: each scheme's perplexity against step, with its 95% interval."""
    names = []
    for table in tables:
        figure, axes = _axes(f"{table.title} per masking scheme", "perplexity (95% interval)")
        steps = [s.step for s in table.steps]
        for scheme in table.schemes:
            values = [next((v for v in s.comparison.values if v.scheme == scheme), None) if s.comparison else None
                      for s in table.steps]
            middle = [float(np.exp(v.interval.estimate)) if v else float(np.exp(np.mean(np.log(s.perplexity[scheme]))))
                      for v, s in zip(values, table.steps)]
            axes.plot(steps, middle, marker="o", label=scheme, color=scheme_colour(scheme))
            if all(values):
                axes.fill_between(steps, [np.exp(v.interval.low) for v in values],
                                  [np.exp(v.interval.high) for v in values], color=scheme_colour(scheme), alpha=0.2)
        axes.legend()
        suffix = "" if table.unit == "token" else f"-{table.unit}"
        names.append(_save(figure, directory, f"perplexity{suffix}{'-multi' if table.multi else ''}.png"))
    return names


def downstream(runs: list[Run], directory: str) -> list[str]:
    """One figure per (task, protocol) every run has: dev score against pretraining step."""
    keys = set.intersection(*(set(r.finetune) for r in runs)) if runs else set()
    names = []
    for task, protocol in sorted(keys):
        if not common_steps([r.finetune[(task, protocol)] for r in runs]):
            continue
        metric = next(iter(runs[0].finetune[(task, protocol)].values()))["metric"]
        figure, axes = _axes(f"{task} dev {metric} vs pretraining step ({protocol} protocol)", f"dev {metric} ×100")
        for label, run in zip(labels(runs), runs):
            results = run.finetune[(task, protocol)]
            steps = sorted(results)
            axes.plot(steps, [results[s]["best"]["aggregate"]["score"] for s in steps], marker="o", label=label,
                      color=scheme_colour(run.scheme))
        axes.legend()
        names.append(_save(figure, directory, f"{task.replace('/', '-')}-{protocol}.png"))
    return names
