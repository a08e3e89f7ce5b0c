"""The share of masked tokens whose two neighbours are both visible, per masking scheme.

Issue 32: random_span's single-token perplexity lags the other schemes' because it rarely
trains on a token with both neighbours in view (8.0% of its masked tokens on the H100 run's
batches, against random_token's 74.8%). This measures that share on the batches the trainer
reads (`tasks.get_dataset`, the training seed's order and masks) for every scheme asked:

    python benchmarks/mask_context.py --data work/data --schemes random_token whole_word \\
        random_span naive_pmi pmi --batches 20 --batch 128

It prints a markdown table (share with its 95% interval over sequences,
`masking.neighbour_visibility`) and, with --output, writes the figures as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def measure(data: str, scheme: str, batches: int, batch: int, seed: int, split: str, rate: float) -> dict:
    """One scheme's share over `batches` batches of its training input."""
    import numpy as np

    from pmi_jax import masking, tasks

    ds = tasks.get_dataset(data, scheme, split, batch_size=batch, seed=seed, num_epochs=None,
                           mask_rate=masking.MaskRate(rate))
    weights = np.concatenate([b["weights"] for b in ds.take(batches).as_numpy_iterator()])
    visibility = masking.neighbour_visibility(weights)
    return {"scheme": scheme, "sequences": len(weights), **vars(visibility)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="prepared corpus directory")
    p.add_argument("--schemes", nargs="+", required=True)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="train")
    p.add_argument("--mask-rate", type=float, default=0.15)
    p.add_argument("--output", help="JSON file for the figures")
    args = p.parse_args(argv)
    rows = [measure(args.data, s, args.batches, args.batch, args.seed, args.split, args.mask_rate) for s in args.schemes]
    print(f"{args.data} ({args.split}), seed {args.seed}, {args.batches} batches of {args.batch}, "
          f"mask rate {args.mask_rate:g}")
    print("| scheme | masked tokens | both neighbours visible | 95% interval |\n| --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['scheme']} | {r['selected']:,} | {100 * r['share']:.1f}% | ±{100 * r['half_width']:.1f} |")
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"data": args.data, "split": args.split, "seed": args.seed, "batches": args.batches,
                       "batch": args.batch, "mask_rate": args.mask_rate, "schemes": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
