"""The training run directory: every name and record that `train`, `eval`, `export` and `compare`
share, so that no reader re-types a path or a metadata key (docs/design.md, "Run directory").

    RUN/checkpoints/<step>/state, metadata            pmi_jax.checkpoints (Orbax); metadata: CheckpointMetadata
    RUN/tensorboard/metrics.jsonl                     MetricWriter writes, read_metrics reads
    RUN/eval/perplexity-<split>[-<unit>]-step<N>.json perplexity_result_path (contents: perplexity_result)
    RUN/eval/<task>-<protocol>-step<N>/results.json   finetune_result_dir

From that layout, the rule every writer keeps: no output may hold or lie inside an input, a run
or a run's records (`check_output_apart`, `check_new_output`).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, Iterable

from pmi_jax import storage
from pmi_jax.errors import PathError, UserInputError

CHECKPOINT_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"
METRICS_FILE = "metrics.jsonl"
EVAL_DIR = "eval"
PERPLEXITY_PREFIX = "perplexity-"
FINETUNE_RESULTS = "results.json"


# --------------------------------------------------------------------------------------
# Checkpoint metadata
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CheckpointMetadata:
    """The JSON saved next to every checkpoint; its readers check the vocabulary hash with it.

    `model` and `config` are `pmi_jax.config.to_dict` of the run's ModelConfig and
    ExperimentConfig (plain JSON here: this module sits below the config). Checkpoints of
    older versions lack some fields; they read as None.
    """

    step: int
    data_position: int | None = None
    model: dict = dataclasses.field(default_factory=dict)
    config: dict = dataclasses.field(default_factory=dict)
    data_dir: str | None = None
    scheme: str | None = None
    seq_len: int | None = None
    vocab_size: int | None = None
    vocab_sha256: str | None = None  # None: trained on synthetic batches, no vocab.txt
    jax_version: str | None = None
    process_count: int | None = None
    # Settings changed when the run was resumed with `train --allow-changed`, oldest first:
    # {"setting": "data.mask_rate", "from": 0.15, "to": 0.3, "step": 30} (from that step on).
    changes: tuple = ()

    def to_json(self) -> dict:
        """The dict Orbax writes (keys in field order, as every version has written them; `changes`
        only where there are some, so that an unchanged run's metadata is byte-identical)."""
        record = dataclasses.asdict(self)
        if not self.changes:
            del record["changes"]
        return record

    @classmethod
    def from_json(cls, record: dict) -> "CheckpointMetadata":
        """Any version's metadata: missing fields read as None, unknown keys are ignored."""
        if isinstance(record, cls):
            return record
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in record.items() if k in names}
        values.setdefault("model", {})
        values["config"] = values.get("config") or {}
        values["changes"] = tuple(values.get("changes") or ())
        return cls(**values)

    @property
    def run_scheme(self) -> str:
        """The masking scheme, from the record or the saved config ("unknown" where neither says)."""
        return self.scheme or self.config.get("data", {}).get("scheme") or "unknown"

    # Read access by key, for code written against the dict of earlier versions.
    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def __contains__(self, key: str) -> bool:
        return key in {f.name for f in dataclasses.fields(self)}

    def get(self, key: str, default: Any = None) -> Any:
        value = getattr(self, key, None)
        return default if value is None else value


# --------------------------------------------------------------------------------------
# Directory names
# --------------------------------------------------------------------------------------


def run_dir_of(checkpoint: str) -> str:
    """The training workdir of a workdir or of one of its checkpoints/<step> directories."""
    parts = checkpoint.rstrip("/").rsplit("/", 2)
    if len(parts) == 3 and parts[1] == CHECKPOINT_DIR and parts[2].isdigit():
        return parts[0]
    return checkpoint.rstrip("/")


def logdir(run: str) -> str:
    return run.rstrip("/") + "/" + TENSORBOARD_DIR


def metrics_path(run: str) -> str:
    return storage.join(logdir(run), METRICS_FILE)


def eval_dir(run: str) -> str:
    return storage.join(run, EVAL_DIR)


def perplexity_result_path(run: str, split: str, step, unit: str = "token") -> str:
    """`--unit token` keeps the name it had before units existed; other units add theirs.
    The file's contents: `pmi_jax.formats.perplexity_result`."""
    name = f"{split}-step{step}" if unit == "token" else f"{split}-{unit}-step{step}"
    return storage.join(eval_dir(run), f"{PERPLEXITY_PREFIX}{name}.json")


def finetune_result_dir(run: str, task: str, protocol: str, step) -> str:
    """Task names with "/" are written with "-", e.g. eval/glue-rte-checkpoint-step2000."""
    return storage.join(eval_dir(run), f"{task.replace('/', '-')}-{protocol}-step{step}")


# --------------------------------------------------------------------------------------
# What no output may touch
# --------------------------------------------------------------------------------------

_RUN_SEARCH_LIMIT = 10_000  # directories looked at below an output before giving up the search


def is_run(directory: str) -> bool:
    """What makes a directory a training run: `train` writes its checkpoints or its metrics there."""
    return storage.gfile.isdir(storage.join(directory, CHECKPOINT_DIR)) or storage.gfile.exists(
        metrics_path(directory))


def _run_at_or_below(path: str) -> str | None:
    """A training run that `path` is or holds, if any (the first found; the search is bounded)."""
    if not storage.gfile.isdir(path):
        return None
    for count, (directory, _, _) in enumerate(storage.gfile.walk(path)):
        if is_run(directory):
            return directory.rstrip("/")
        if count >= _RUN_SEARCH_LIMIT:
            break
    return None


def _run_holding(path: str) -> str | None:
    """The run in whose records (checkpoints/, tensorboard/) `path` lies, if any."""
    path = path.rstrip("/") if not storage.is_local(path) else os.path.abspath(path)
    parent, name = os.path.split(path)
    while parent and parent != path:
        if name in (CHECKPOINT_DIR, TENSORBOARD_DIR) and is_run(parent):
            return parent
        path, (parent, name) = parent, os.path.split(parent)
    return None


def check_output_apart(output: str, inputs: Iterable[tuple[str, str | None]] = ()) -> None:
    """The library's rule for outputs: none may hold, or lie inside, an input or a training run.

    Writing an output replaces it (`overwrite`, or a resumed run's sweep), so an output
    directory that is or holds an input, or any run (its checkpoints, metrics, evaluations),
    would destroy it; an output inside an input that is not a run (a corpus, a vocabulary)
    would replace one of its files or add one its reader refuses; so would an output into a
    run's checkpoints/ or tensorboard/, or over a run's whole eval/ folder. Inside a run, other
    outputs may be written: eval/<result> is where the evaluation commands file (and refile)
    their results, and an export kept beside the checkpoints is the user's own. `inputs` are
    (name, path) pairs such as ("--checkpoint", "runs/a"), including those a command derives
    (the checkpoint's corpus); the command line's own flags are checked once for every command
    by pmi_jax/cli/io_flags.py. A PathError names `output`; the command names its flag.
    """
    for source_name, source in inputs:
        if not source:
            continue
        if storage.is_inside(source, output):
            what = "is" if storage.is_inside(output, source) else "holds"
            raise PathError(output, f"{what} the input {source_name} {source}; write the output elsewhere")
        if storage.is_inside(output, source) and not is_run(source):
            raise PathError(output, f"lies inside the input {source_name} {source}, which is not this command's to "
                            "change; write the output elsewhere")
    run = _run_at_or_below(output)
    if run is not None:
        raise PathError(output, f"holds the training run {run}; write the output elsewhere")
    run = _run_holding(output)
    if run is not None:
        raise PathError(output, f"lies inside the records of the training run {run}; write the output elsewhere")
    parent, name = os.path.split(output.rstrip("/") if not storage.is_local(output) else os.path.abspath(output))
    if name == EVAL_DIR and is_run(parent):
        raise PathError(output, f"is the results folder of the training run {parent}; write the output elsewhere")


def check_new_output(path: str, overwrite: bool, directory: bool = False,
                     inputs: Iterable[tuple[str, str | None]] = ()) -> None:
    """Refuse an output that may not or cannot be written, before any work starts: first
    `check_output_apart` (no input, no run), then `storage.check_writable` (exists without
    `overwrite`, a file for a directory, a place that takes no new file)."""
    check_output_apart(path, inputs)
    storage.check_writable(path, overwrite, directory)


# --------------------------------------------------------------------------------------
# The checkpoint's vocabulary
# --------------------------------------------------------------------------------------


def vocabulary_for(metadata: CheckpointMetadata, checkpoint: str, vocab_size: int, *, vocab: str | None = None,
                   data_dir: str | None = None, flag: str = "--vocab") -> str:
    """The path of the vocab.txt a checkpoint was trained with, checked against its recorded hash.

    `vocab` (a --vocab flag) wins, then `data_dir`'s vocab.txt (a --data flag), then the
    corpus the run recorded. Token ids mean nothing under another vocabulary, so every reader
    of a checkpoint goes through here (wordpiece_vocab.check_matches_checkpoint).
    """
    from pmi_jax.formats import prepared_corpus, wordpiece_vocab

    if vocab:
        path, source = vocab, f"--vocab {vocab}"
    elif data_dir:
        path, source = prepared_corpus.vocab_path(data_dir), f"--data {data_dir}: its vocab.txt"
    elif metadata.data_dir:
        path = prepared_corpus.vocab_path(metadata.data_dir)
        source = f"the corpus {metadata.data_dir}: its vocab.txt"
    else:
        raise UserInputError(f"checkpoint {checkpoint} records no corpus; pass {flag}")
    tokens = wordpiece_vocab.read_vocab(path)
    wordpiece_vocab.check_matches_checkpoint(source, sha256=storage.file_sha256(path), size=len(tokens),
                                             expected_sha256=metadata.vocab_sha256, vocab_size=vocab_size,
                                             checkpoint=checkpoint)
    return path


def corpus_tokenizer_for(metadata: CheckpointMetadata) -> str | None:
    """The tokenizer.json text of the corpus a checkpoint was trained on, where it was prepared
    with `--tokenizer` (None for BERT's uncased WordPiece), checked against the hash its
    metadata.json records: text for the model must be encoded with it. A corpus out of reach
    (only possible with --vocab) has nothing to read: the uncased WordPiece of --vocab is used."""
    from pmi_jax.formats import prepared_corpus

    data_dir = metadata.data_dir
    if not data_dir or not storage.gfile.exists(prepared_corpus.metadata_path(data_dir)):
        return None
    return prepared_corpus.read_tokenizer(data_dir, prepared_corpus.read_metadata(data_dir))


# --------------------------------------------------------------------------------------
# metrics.jsonl
# --------------------------------------------------------------------------------------


class MetricWriter:
    """Scalars to stdout, TensorBoard and `metrics.jsonl`, from process 0 only.

    The JSON-lines file is the machine-readable record (one object per write: the training
    scalars of a logged step, the validation scalars of a validated step); a resumed run
    appends to it, so a scalar logged twice for a step keeps its last value when read.
    TensorBoard's event files are written through TensorFlow; where it is not installed (a
    JAX-only accelerator image training from pre-masked batches) the run still logs to
    stdout and `metrics.jsonl` on local disk, and says once that it writes no event files.
    """

    def __init__(self, logdir: str, enabled: bool):
        self.logdir = logdir
        self.enabled = enabled
        self._tb = None
        if not enabled:
            return
        jsonl = os.path.join(logdir, METRICS_FILE) if "://" not in logdir else logdir.rstrip("/") + "/" + METRICS_FILE
        if "://" not in jsonl:
            _drop_cut_line(jsonl)
        try:
            import tensorflow as tf
        except ImportError:
            if "://" in logdir:
                raise
            logging.warning("TensorFlow is not installed: no TensorBoard event files, metrics go to %s", jsonl)
            os.makedirs(logdir, exist_ok=True)
            self._jsonl = open(jsonl, "a")
            return
        tf.io.gfile.makedirs(logdir)
        self._tb = tf.summary.create_file_writer(logdir)
        self._jsonl = tf.io.gfile.GFile(jsonl, "a")

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        if self._tb is not None:
            import tensorflow as tf

            with self._tb.as_default(step=step):
                for name, value in scalars.items():
                    if value is not None:
                        tf.summary.scalar(name, value)
        self._jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
        self._jsonl.flush()
        print(f"step {step}  " + "  ".join(_format(k, v) for k, v in scalars.items() if v is not None), flush=True)

    def flush(self) -> None:
        if self.enabled:
            if self._tb is not None:
                self._tb.flush()
            self._jsonl.flush()

    def close(self) -> None:
        if self.enabled:
            if self._tb is not None:
                self._tb.close()
            self._jsonl.close()


def _drop_cut_line(path: str) -> None:
    """A run killed mid-write leaves a last line without its newline; the resumed run appends to
    the file, so cut that partial line first, or it would fuse with the next record."""
    if not os.path.exists(path):
        return
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def _format(name: str, value: float) -> str:
    if name in ("learning_rate",):
        return f"{name}={value:.3e}"
    if abs(value) >= 1000:
        return f"{name}={value:.0f}"
    return f"{name}={value:.4f}"


def read_metrics_file(path: str) -> dict[int, dict]:
    """step -> every scalar logged for it, one dict (training and validation are lines of their
    own; a resumed run re-logs the steps it redid, and the last value of a scalar wins); {} when
    the file does not exist. A line that is not a record is a UserInputError naming it."""
    if not storage.gfile.exists(path):
        return {}
    rows = {}
    with storage.gfile.GFile(path, "rb") as f:
        lines = f.read().splitlines()
    for number, line in enumerate(lines, start=1):
        if line.strip():
            row = parse_metrics_line(line, f"{path}:{number}")
            rows.setdefault(row["step"], {}).update(row)
    return rows


def parse_metrics_line(line: bytes, where: str) -> dict:
    """One metrics.jsonl line, checked: a JSON object with an integer step and a number (or null,
    a scalar not measured at that step) for every other field.

    `where` is FILE:LINE for the one-line error; a reader that plotted a string or crashed on
    binary bytes would hide which line of which run is damaged.
    """
    try:
        record = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise UserInputError(f"{where}: not a metrics line (a JSON object with a step)") from None
    if not isinstance(record, dict) or isinstance(record.get("step"), bool) or not isinstance(record.get("step"), int):
        raise UserInputError(f"{where}: not a metrics line (a JSON object with an integer step)")
    for name, value in record.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, type(None))):
            raise UserInputError(f"{where}: {name} is {json.dumps(value)[:40]}, not a number")
    return record


def read_metrics(logdir: str) -> dict[int, dict]:
    """The records of `logdir`/metrics.jsonl (see read_metrics_file)."""
    return read_metrics_file(storage.join(logdir, METRICS_FILE))
