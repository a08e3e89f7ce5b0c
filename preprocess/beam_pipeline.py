"""What the two Beam pipelines share: their runner flags, and reading the corpus in parallel.

`preprocess.beam_vocab` and `preprocess.beam_prepare` run the local pipelines' own code
(`pmi-jax vocab build`, `pmi-jax corpus prepare`) as Apache Beam transforms, so the same job
runs in this process (`--runner DirectRunner`, the default) or on Google Cloud Dataflow
(`--runner DataflowRunner` with the flags below). Any other Beam pipeline option may be given
too: the command line is handed to Beam's `PipelineOptions` as well.

Dataflow workers must run the same code with the same versions. `--setup_file ./setup.py`
builds this package and installs it on every worker, with the exact versions setup.py pins for
what decides the output bytes (tensorflow, tensorflow-text, numpy). For a fully pinned worker
environment, build a container with `pip install -c constraints.txt -e '.[beam]'` and pass
`--sdk_container_image`.
"""
from __future__ import annotations

import argparse
from typing import Iterator, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

# Documents are read and split into words in batches of about this many characters: the
# unit of parallel work, large enough that per-element overhead vanishes.
BATCH_CHARS = 1_000_000

_DATAFLOW_FLAGS = (
    # (flag, metavar, help)
    ("--project", "PROJECT", "Google Cloud project that runs the Dataflow job"),
    ("--region", "REGION", "Dataflow region, e.g. us-central2 (keep it where the bucket is)"),
    ("--temp_location", "GS_DIR", "gs:// folder for Dataflow's temporary files"),
    ("--staging_location", "GS_DIR", "gs:// folder for the staged package (default: under --temp_location)"),
    ("--machine_type", "TYPE", "worker machine type, e.g. n2-highmem-8 (the vocabulary's selection step holds "
     "every frequent n-gram of the corpus in one worker's memory)"),
    ("--num_workers", "N", "initial number of workers"),
    ("--max_num_workers", "N", "upper bound for autoscaling"),
    ("--setup_file", "PATH", "./setup.py: build this package and install it on every worker"),
    ("--requirements_file", "PATH", "a pip requirements file installed on every worker"),
    ("--sdk_container_image", "IMAGE", "a worker container with the package preinstalled (fully pinned)"),
    ("--job_name", "NAME", "Dataflow job name"),
)


def add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    """The runner choice and the Dataflow flags, documented in the command's --help."""
    group = parser.add_argument_group(
        "Beam runner",
        "Where the pipeline runs. Without flags: here, with the DirectRunner. On Dataflow, for example: "
        "--runner DataflowRunner --project P --region us-central2 --temp_location gs://B/tmp "
        "--machine_type n2-highmem-8 --max_num_workers 32 --setup_file ./setup.py. Any other Beam pipeline "
        "option is passed on to Beam as given.")
    group.add_argument("--runner", default="DirectRunner",
                       help="DirectRunner (default: this process) or DataflowRunner")
    group.add_argument("--direct_num_workers", type=int, default=1, metavar="N",
                       help="DirectRunner only: parallel workers in this process (default 1)")
    for flag, metavar, text in _DATAFLOW_FLAGS:
        group.add_argument(flag, metavar=metavar, default=None, help=text)


def pipeline_options(args: argparse.Namespace, extra: Sequence[str] = ()) -> PipelineOptions:
    """PipelineOptions from the parsed runner flags plus any further Beam flags (`extra`)."""
    flags = ["--runner", args.runner]
    if args.runner == "DirectRunner":
        flags += ["--direct_num_workers", str(args.direct_num_workers)]
    for flag, _, _ in _DATAFLOW_FLAGS:
        value = getattr(args, flag.lstrip("-"))
        if value is not None:
            flags += [flag, str(value)]
    return PipelineOptions(flags + list(extra))


def direct_runner() -> PipelineOptions:
    """Options that run a pipeline in this process (the default when none are given)."""
    return PipelineOptions(["--runner", "DirectRunner"])


def _read_batches(path: str, batch_chars: int) -> Iterator[list[str]]:
    from preprocess.documents import iter_document_batches

    yield from iter_document_batches([path], batch_chars)


class ReadDocumentBatches(beam.PTransform):
    """Input files -> batches (lists) of their documents, spread over the workers.

    One file is read by one worker, in order; give a large corpus as many files (a few hundred
    MB each) so that reading is parallel too. The batches are then redistributed, so that the
    work done per batch is spread evenly whatever the file sizes.
    """

    def __init__(self, files: Sequence[str], batch_chars: int = BATCH_CHARS):
        super().__init__()
        self._files = list(files)
        self._batch_chars = batch_chars

    def expand(self, pbegin):
        return (pbegin
                | "Files" >> beam.Create(self._files)
                | "SpreadFiles" >> beam.Reshuffle()
                | "Read" >> beam.FlatMap(_read_batches, self._batch_chars)
                | "SpreadBatches" >> beam.Reshuffle())
