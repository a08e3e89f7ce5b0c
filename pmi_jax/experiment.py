"""One training run assembled from its parts: config file, overrides, corpus, scheme, init weights.

`resolve_config` builds the ExperimentConfig a command line describes (every value checked
where it is set, the error naming that flag or file); `resolve_run` adds what reading the corpus
decides (vocabulary size, sequence length, the batch source); `pretrain` runs it. `pmi-jax
train` calls `pretrain`; Python code gets the same run without argparse.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Sequence

from pmi_jax import paths
from pmi_jax.config import SYNTHETIC, ExperimentConfig, apply_overrides, load_config
from pmi_jax.errors import UserInputError


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What the command line asks for, before any file but the config is read."""

    config: str  # a name in configs/ or a .py path
    overrides: Sequence[str] = ()  # FIELD=VALUE, in order
    data: str | None = None  # a prepared corpus, SYNTHETIC, or None: the config's data.data_dir
    scheme: str | None = None  # None: the config's data.scheme
    peak_flops: float | None = None
    init_from: str | None = None  # a transformers BERT directory
    allow_changed: tuple[str, ...] = ()  # settings a resumed run may change (config.RESUMED_SETTINGS)


@dataclasses.dataclass(frozen=True)
class ResolvedRun:
    config: ExperimentConfig
    source: Any  # a pmi_jax.batches.BatchSource
    corpus: Any  # pmi_jax.batches.CorpusInfo, None for synthetic batches
    pretrained: Any  # huggingface.Pretrained of --init-from, or None


def resolve_config(spec: RunSpec) -> tuple[ExperimentConfig, Any]:
    """(config, pretrained): the config file, then the overrides, then --init-from's model, then
    --data, --scheme and --peak-flops. Reads no corpus (enough for --compile-only)."""
    config = apply_overrides(load_config(spec.config), list(spec.overrides))
    pretrained = None
    if spec.init_from:
        from pmi_jax import huggingface

        pretrained = huggingface.read_pretrained(spec.init_from)
        config = dataclasses.replace(config, model=huggingface.resolve_model_config(
            config.model, pretrained.fields, list(spec.overrides), spec.config, spec.init_from))
    data_dir = spec.data if spec.data is not None else config.data.data_dir
    if data_dir and data_dir != SYNTHETIC:
        data_dir = paths.absolute(data_dir)  # recorded in the checkpoints, read by `eval` from anywhere
    try:
        data = dataclasses.replace(config.data, data_dir=data_dir, scheme=spec.scheme or config.data.scheme)
    except UserInputError as e:  # DataConfig checks the scheme: say it came from --scheme
        raise UserInputError(f"--scheme: {e}") from None
    train_config = config.train if spec.peak_flops is None else dataclasses.replace(
        config.train, peak_flops=spec.peak_flops)
    return dataclasses.replace(config, data=data, train=train_config), pretrained


def resolve_run(spec: RunSpec) -> ResolvedRun:
    """The run `spec` describes, with its corpus read and checked, ready for `train.train`."""
    from pmi_jax import batches

    config, pretrained = resolve_config(spec)
    if not config.data.data_dir:
        raise UserInputError("no corpus: pass --data DIR (or set data.data_dir in the config)")
    if config.data.data_dir == SYNTHETIC:
        if not (config.model.vocab_size and config.data.seq_len):
            raise UserInputError(f"--data {SYNTHETIC} needs model.vocab_size and data.seq_len set (via --set)")
        if config.data.mask_rate_schedule != "constant":
            raise UserInputError(f"--data {SYNTHETIC} masks at a constant rate: data.mask_rate_schedule="
                                 f"{config.data.mask_rate_schedule} needs a prepared corpus")
        corpus = None
        source = batches.SyntheticBatches(config.model.vocab_size, config.data.seq_len, config.train.batch_size,
                                          seed=config.data.seed, mask_rate=config.data.mask_rate)
    else:
        corpus = batches.read_corpus_info(config.data.data_dir, config.data.scheme, config.data.split)
        if config.train.eval_every_steps > 0 and not corpus.has_validation:
            logging.warning("--data %s has no validation split: no validation during training (prepare the corpus "
                            "with --validation-fraction above 0 to have it)", config.data.data_dir)
            config = dataclasses.replace(config, train=dataclasses.replace(config.train, eval_every_steps=0))
        if pretrained is not None:
            from pmi_jax import huggingface
            from pmi_jax.formats import prepared_corpus

            huggingface.check_corpus_vocabulary_is_pretrained(pretrained,
                                                              prepared_corpus.vocab_path(config.data.data_dir))
        config = batches.configure_for_corpus(config, corpus)
        source = batches.TaskBatches.from_config(config)
    return ResolvedRun(config, source, corpus, pretrained)


@dataclasses.dataclass(frozen=True)
class Distributed:
    """How this process joins a multi-process job; all None: from the environment (TPU, SLURM) or alone."""

    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None


def initialize_distributed(distributed: Distributed) -> None:
    import jax

    if distributed.coordinator_address or distributed.num_processes:
        if None in (distributed.coordinator_address, distributed.num_processes, distributed.process_id):
            raise UserInputError("--coordinator-address, --num-processes and --process-id go together")
        jax.distributed.initialize(distributed.coordinator_address, distributed.num_processes,
                                   distributed.process_id)
        return
    try:
        jax.distributed.initialize()  # TPU pod slices, SLURM, ... configure themselves
    except (ValueError, RuntimeError) as e:
        logging.info("single process (jax.distributed not initialised: %s)", str(e).splitlines()[0])


def pretrain(spec: RunSpec, workdir: str, distributed: Distributed = Distributed(), progress: bool = False):
    """Resolve the run, join the job, train (resuming from `workdir`): a `train.RunResult`.
    `progress`: draw the progress line on stderr (`pmi_jax.progress`).

    Raises `train.NonFiniteLoss` on a NaN/inf loss, UserInputError for bad input (before
    anything is written)."""
    from pmi_jax import train

    run = resolve_run(spec)
    initialize_distributed(distributed)  # before JAX touches a device
    initial_params = None
    if run.pretrained is not None:  # read and checked before anything is written, even when the run resumes
        from pmi_jax import huggingface

        initial_params = huggingface.initial_params(run.pretrained, run.config.model)
    return train.train(run.config, paths.absolute(workdir), run.source, run.corpus, initial_params=initial_params,
                       progress=progress, allow_changed=spec.allow_changed)
