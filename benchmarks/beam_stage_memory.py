"""Anonymous memory of the DirectRunner's processes, stage by stage, in a Beam `vocab build`
(issue 35: what made its memory grow about 210 MB per 1M words).

    nice -n 10 .venv/bin/python benchmarks/beam_stage_memory.py CORPUS.txt [--malloc off]

Runs preprocess/beam/beam_vocab.py with the DirectRunner and 2 worker processes
(multi_processing), as `pmi-jax vocab build --runner DirectRunner --direct_num_workers 2`.
Before each bundle the runner starts, it prints the stage's name and the anonymous memory (RssAnon)
of the runner process and of its worker processes; a sampler (every 0.3 s) keeps the peak of
their sum and where it happened. The pipeline runs inside `malloc_thresholds.direct_runner_malloc()`
as the commands run it; `--malloc off` runs it with glibc's defaults, to compare. The sampler hooks a private method of Beam's FnApiRunner
(`_execute_bundle`, apache-beam 2.77): a measuring tool, not pipeline code.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def anonymous_mb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(re.search(r"RssAnon:\s+(\d+)", f.read()).group(1)) >> 10
    except (OSError, AttributeError):
        return 0  # the process ended


def process_tree_mb() -> tuple[int, list[int]]:
    """(this process's anonymous MB, its descendants' largest first)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
    descendants, frontier = [], {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier}
        descendants += frontier
    return anonymous_mb(os.getpid()), sorted((anonymous_mb(p) for p in descendants), reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", help="a text file (or directory) for vocab build --input")
    parser.add_argument("--malloc", choices=["on", "off"], default="on",
                        help="off: glibc's default malloc thresholds (the code before issue 35's fix)")
    args = parser.parse_args()

    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    from pmi_jax.preprocess.beam import beam_vocab
    from pmi_jax.preprocess.vocab.malloc_thresholds import direct_runner_malloc

    stage, peak, started = ["start"], {"total": 0}, time.perf_counter()

    def sample() -> None:
        while True:
            runner, workers = process_tree_mb()
            if runner + sum(workers) > peak["total"]:
                peak.update(total=runner + sum(workers), runner=runner, workers=workers[:2], stage=stage[0])
            time.sleep(0.3)

    execute_bundle = fn_runner.FnApiRunner._execute_bundle

    def logged(self, context, bundle, data_input):
        stage[0] = bundle.stage.name
        runner, workers = process_tree_mb()
        print(f"{time.perf_counter() - started:7.1f} s  runner {runner:5d} MB  workers {workers[:2]} MB  "
              f"peak {peak['total']:5d} MB  before {stage[0][:90]}", flush=True)
        return execute_bundle(self, context, bundle, data_input)

    fn_runner.FnApiRunner._execute_bundle = logged
    threading.Thread(target=sample, daemon=True).start()
    options = PipelineOptions(["--runner", "DirectRunner", "--direct_num_workers", "2",
                               "--direct_running_mode", "multi_processing"])
    malloc = direct_runner_malloc() if args.malloc == "on" else contextlib.nullcontext()
    with tempfile.TemporaryDirectory() as tmp, malloc:
        beam_vocab.build_vocabulary([args.corpus], os.path.join(tmp, "vocab"), pipeline_options=options)
    print(f"peak {peak['total']} MB: runner {peak['runner']} MB, workers {peak['workers']} MB, "
          f"during {peak['stage'][:120]}")


if __name__ == "__main__":
    main()
