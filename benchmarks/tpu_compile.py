"""The compiler's memory and step-time estimates of the train step on TPU slices, without a TPU.

    python benchmarks/tpu_compile.py --output benchmarks/tpu_compile.json            # the whole sweep
    python benchmarks/tpu_compile.py --cells base/v5p-8 --options scan_layers=false  # one cell, one toggle

Each cell compiles `pmi_jax.compile_only.compile_train_step` for one model size (batch 256,
seq 512, vocabulary 30,522, bf16; the paper's BERT-base setting) on one slice, with the
recommended options (configs/base.py and configs/large.py) or with one option toggled, and
appends a JSON record (bytes per device, fits, compiler FLOPs, the compiler's estimated step
time and the MFU it implies) to --output as soon as the cell is done, so a long sweep keeps
what it finished. Cells already in --output are skipped. Every figure is the compiler's
estimate on this machine, not a measurement on a TPU. Needs libtpu (`pip install '.[tpu]'`).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

from pmi_jax import compile_only  # noqa: E402
from pmi_jax.config import load_config  # noqa: E402
from pmi_jax.config import apply_overrides  # noqa: E402
from pmi_jax.errors import UserInputError  # noqa: E402

SIZES = ("base", "large")
TOPOLOGIES = ("v5p-8", "v4-32", "v5e-16", "v6e-8")
COMMON = ("model.vocab_size=30522", "data.seq_len=512", "train.batch_size=256", "model.dtype=bfloat16")
# One option at a time, away from the recommended setting (configs/base.py, configs/large.py).
TOGGLES = {
    "full_logits": ("model.max_predictions_per_seq=-1",),
    "scan": ("model.scan_layers=true",),
    "no_scan": ("model.scan_layers=false",),
    "remat_none": ("model.remat=none",),
    "remat_full": ("model.remat=full",),
    "remat_dots": ("model.remat=dots_saveable",),
    "vocab_unpadded": ("model.vocab_multiple=1",),
    "cpu_variants": ("model.xla_cpu_variants=always",),
    "fused_attention": ("model.attention_dropout_rate=0.0",),
    "pallas_attention": ("model.attention=pallas",),
    "pallas_attention_no_dropout": ("model.attention=pallas", "model.attention_dropout_rate=0.0"),
    "embedding_sorted": ("model.embedding_grad=sorted",),
    "rbg": ("train.prng_impl=rbg",),
    "unsafe_rbg": ("train.prng_impl=unsafe_rbg",),
}
TOGGLE_CELLS = ("base/v5p-8", "large/v5e-16")


def default_plan() -> list[tuple[str, str, str]]:
    """(size, topology, option label): the recommended cells first, then the toggles.

    A toggle that leaves a size's recommended config as it is (`no_scan` for base, which is
    not scanned; `remat_dots` for large, which already uses it) is not a cell.
    """
    plan = [(size, topology, "recommended") for size in SIZES for topology in TOPOLOGIES]
    for cell in TOGGLE_CELLS:
        size, topology = cell.split("/")
        recommended = apply_overrides(load_config(size), list(COMMON))
        plan += [(size, topology, label) for label, overrides in TOGGLES.items()
                 if apply_overrides(load_config(size), list(COMMON) + list(overrides)) != recommended]
    return plan


def hlo_summary(hlo_text: str, config) -> dict:
    """What the compiled program's matmuls and saved activations are made of.

    Counts the dot/convolution instructions by operand and result types, and lists the
    buffers shaped like stacked per-layer activations ([layers, ...] with a length axis),
    which is how a scanned program keeps the forward pass's values for the backward one,
    with their element types.
    """
    import re

    types = {m.group(1): m.group(2) for m in re.finditer(r"^\s*(?:ROOT )?(%[\w.\-]+) = (\w+)\[", hlo_text, re.M)}
    counts: dict[str, int] = {}
    for match in re.finditer(r"^\s*(?:ROOT )?%[\w.\-]+ = (\w+)\[[^\n]*? (dot|convolution)\((%[\w.\-]+), "
                             r"(%[\w.\-]+)\)", hlo_text, re.M):
        key = f"{match.group(2)} {types.get(match.group(3))} x {types.get(match.group(4))} -> {match.group(1)}"
        counts[key] = counts.get(key, 0) + 1
    m = config.model
    stacked = {}
    for match in re.finditer(r"\b(\w+)\[%d,\d+,[\d,]+\]" % m.num_layers, hlo_text):
        if str(config.data.seq_len) in match.group(0).split("[")[1]:  # activations have a length axis
            stacked[match.group(0)] = stacked.get(match.group(0), 0) + 1
    return {"matmuls": counts, "stacked_activations": stacked}


def _libtpu_version() -> str | None:
    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:  # compile_train_step will say how to install it
        return None


def run_cell(size: str, topology: str, label: str, extra: list[str], hlo_dir: str | None = None) -> dict:
    overrides = list(COMMON) + list(TOGGLES.get(label, ())) + extra
    config = apply_overrides(load_config(size), overrides)
    record = {"size": size, "topology": topology, "options": label, "overrides": overrides,
              "jax": jax.__version__, "libtpu": _libtpu_version()}
    start = time.perf_counter()
    try:
        report, compiled = compile_only.compile_train_step(config, topology)
    except UserInputError as e:
        record.update(error=str(e), compile_s=round(time.perf_counter() - start, 1))
        return record
    record.update(
        compile_s=round(time.perf_counter() - start, 1), slice=report.topology, devices=report.num_devices,
        hosts=report.num_hosts, mesh=report.mesh, hbm_gib=report.hbm_bytes / compile_only.GiB,
        state_gib=report.state_bytes / compile_only.GiB, temp_gib=report.temp_bytes / compile_only.GiB,
        batch_gib=report.batch_bytes / compile_only.GiB, total_gib=report.total_bytes / compile_only.GiB,
        fits=report.fits, compiler_flops=report.compiler_flops, formula_flops=report.formula_flops,
        loop_note=report.loop_note,
        estimated_step_s=report.estimated_seconds, estimated_mfu=report.estimated_mfu)
    if hlo_dir:
        text = compiled.as_text()
        os.makedirs(hlo_dir, exist_ok=True)
        with open(os.path.join(hlo_dir, f"{size}_{topology}_{label}.hlo.txt"), "w") as f:
            f.write(text)
        record["hlo"] = hlo_summary(text, config)
    return record


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="benchmarks/tpu_compile.json", help="JSON list of records (appended)")
    parser.add_argument("--cells", nargs="*", default=None, metavar="SIZE/TOPOLOGY",
                        help="compile only these cells (default: the whole plan)")
    parser.add_argument("--options", nargs="*", default=[], metavar="FIELD=VALUE", help="extra overrides")
    parser.add_argument("--label", default=None, help="option label recorded for --cells runs")
    parser.add_argument("--hlo", default=None, metavar="DIR",
                        help="also write each compiled program's HLO text to DIR and summarise its matmul types "
                             "and saved activations in the record")
    args = parser.parse_args(argv)

    if args.cells:
        label = args.label or ("custom" if args.options else "recommended")
        plan = [(*cell.split("/"), label) for cell in args.cells]
    else:
        plan = default_plan()
    records = json.load(open(args.output)) if os.path.exists(args.output) else []
    done = {(r["size"], r["topology"], r["options"]) for r in records}
    for size, topology, label in plan:
        if (size, topology, label) in done:
            continue
        record = run_cell(size, topology, label, args.options, args.hlo)
        print(json.dumps(record), flush=True)
        records.append(record)
        tmp = args.output + ".tmp"
        with open(tmp, "w") as f:
            json.dump(records, f, indent=1)
        os.replace(tmp, args.output)


if __name__ == "__main__":
    main()
