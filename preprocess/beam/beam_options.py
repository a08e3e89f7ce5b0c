"""Command-line flags that choose where a Beam pipeline runs, shared by `pmi-jax vocab build`
and `pmi-jax corpus prepare`.

Without `--runner` those commands run their local multi-core path. With `--runner DirectRunner`
(this process) or `--runner DataflowRunner` (Google Cloud Dataflow, with the flags below) they
run the same code as an Apache Beam pipeline (preprocess/beam/beam_vocab.py, beam_prepare.py), with
byte-identical output. Any other Beam pipeline option goes through `--beam-option`.

Dataflow workers must run the same code with the same versions. `--setup_file ./setup.py`
builds this package and installs it on every worker; for a fully pinned worker environment,
build a container with `pip install -c constraints.txt -e '.[beam]'` and pass
`--sdk_container_image`. Apache Beam itself is imported only when a pipeline runs.
"""
from __future__ import annotations

import argparse
import contextlib

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
        "Apache Beam",
        "Without --runner the job runs here on every core. With --runner it runs as an Apache Beam pipeline "
        "with byte-identical output: DirectRunner in this process, or on Dataflow, for example "
        "--runner DataflowRunner --project P --region us-central2 --temp_location gs://B/tmp "
        "--machine_type n2-highmem-8 --max_num_workers 32 --setup_file ./setup.py.")
    group.add_argument("--runner", choices=("DirectRunner", "DataflowRunner"), default=None,
                       help="run as a Beam pipeline on this runner")
    group.add_argument("--direct_num_workers", type=int, default=1, metavar="N",
                       help="DirectRunner only: parallel workers in this process (default 1)")
    for flag, metavar, text in _DATAFLOW_FLAGS:
        group.add_argument(flag, metavar=metavar, default=None, help=text)
    group.add_argument("--beam-option", action="append", default=[], metavar="--FLAG=VALUE",
                       help="any other Beam pipeline option, passed on as given (repeatable), "
                       "e.g. --beam-option=--experiments=use_runner_v2")


def pipeline_options(args: argparse.Namespace):
    """Beam PipelineOptions from the parsed runner flags, plus every --beam-option given."""
    from apache_beam.options.pipeline_options import PipelineOptions

    flags = ["--runner", args.runner]
    if args.runner == "DirectRunner":
        flags += ["--direct_num_workers", str(args.direct_num_workers)]
    for flag, _, _ in _DATAFLOW_FLAGS:
        value = getattr(args, flag.lstrip("-"))
        if value is not None:
            flags += [flag, str(value)]
    return PipelineOptions(flags + list(args.beam_option))


def direct_runner():
    """Options that run a pipeline in this process (the default when none are given)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    return PipelineOptions(["--runner", "DirectRunner"])


def malloc_for_runner(args: argparse.Namespace):
    """The commands' malloc thresholds for the runner chosen: `direct_runner_malloc` around a
    DirectRunner pipeline (preprocess/vocab/malloc_thresholds.py); on Dataflow nothing here matters."""
    from pmi_jax.preprocess.vocab.malloc_thresholds import direct_runner_malloc

    return direct_runner_malloc() if args.runner == "DirectRunner" else contextlib.nullcontext()
