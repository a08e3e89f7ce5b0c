"""Does a DirectRunner stage read every element of its input? A Beam pipeline with no pmi_jax code.

    python3 benchmarks/beam_flush_race.py --output race.json --repeats 3

Elements of --element-bytes are made by one stage and read again by a stage that waits for a side
input (as `vocab build`'s Count{n} stages read the corpus's batches), then counted. A thread that
only spins stands in for a loaded launcher (`--load`). Each run is tried with Beam as it is and
inside `direct_data_plane.without_timed_flush()`; benchmarks/README.md ("Issue 35", "Found:
Beam's timed flush") gives the figures. Each configuration runs in a process of its own.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CONFIGURATIONS = [(mode, fix) for mode in ("multi_processing", "multi_threading") for fix in (False, True)]


def one_run(elements: int, element_bytes: int, mode: str, workers: int, load: bool, fix: bool) -> dict:
    """Run the pipeline here; its last stage prints what was read (a line the parent parses)."""
    import contextlib
    import threading

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    if load:
        threading.Thread(target=_spin, daemon=True).start()

    def record(_, count, total):
        # Runs in a worker (in multi_processing a child process sharing this one's stdout): it
        # prints a line that main() reads.
        print("READ " + json.dumps({"read": count, "id_sum": total}), flush=True)

    options = PipelineOptions(["--runner", "DirectRunner", "--direct_num_workers", str(workers),
                               "--direct_running_mode", mode])
    started = time.time()
    guard = contextlib.nullcontext()
    if fix:
        from pmi_jax.preprocess.beam import direct_data_plane
        guard = direct_data_plane.without_timed_flush()
    with guard, beam.Pipeline(options=options) as p:
        items = (p | "Ids" >> beam.Create(range(elements)) | "Spread" >> beam.Reshuffle()
                 | "Payload" >> beam.Map(lambda i, n=element_bytes: (i, bytes([i % 251]) * n)))
        ready = beam.pvalue.AsSingleton(items | "CountFirst" >> beam.combiners.Count.Globally())
        ids = items | "ReadAgain" >> beam.Map(lambda kv, _: kv[0], ready)
        count = beam.pvalue.AsSingleton(ids | "Count" >> beam.combiners.Count.Globally())
        total = beam.pvalue.AsSingleton(ids | "Sum" >> beam.CombineGlobally(sum))
        _ = p | "Start" >> beam.Create([None]) | "Check" >> beam.Map(record, count, total)
    return {"seconds": round(time.time() - started, 1)}


def _spin() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="JSON file for the runs")
    parser.add_argument("--elements", type=int, default=1500)
    parser.add_argument("--element-bytes", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--load", action=argparse.BooleanOptionalAction, default=True,
                        help="a spinning thread in the launcher (default on)")
    parser.add_argument("--one", nargs=2, metavar=("MODE", "FIX"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        mode, fix = args.one[0], args.one[1] == "fix"
        print("DONE " + json.dumps(one_run(args.elements, args.element_bytes, mode, args.workers, args.load, fix)))
        return
    runs = []
    for repeat in range(args.repeats):
        for mode, fix in CONFIGURATIONS:
            command = [sys.executable, __file__, "--output", "-", "--elements", str(args.elements),
                       "--element-bytes", str(args.element_bytes), "--workers", str(args.workers),
                       "--load" if args.load else "--no-load", "--one", mode, "fix" if fix else "beam"]
            out = subprocess.run(command, capture_output=True, text=True).stdout.splitlines()
            run = {"mode": mode, "without_timed_flush": fix, "repeat": repeat, "expected": args.elements,
                   "expected_id_sum": args.elements * (args.elements - 1) // 2}
            for line in out:
                if line.startswith(("READ ", "DONE ")):
                    run.update(json.loads(line.split(" ", 1)[1]))
            runs.append(run)
            print(json.dumps(run), flush=True)
    with open(args.output, "w") as f:
        json.dump({"elements": args.elements, "element_bytes": args.element_bytes, "workers": args.workers,
                   "load": args.load, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
