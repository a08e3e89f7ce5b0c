"""`pmi-jax export`: hand a pretrained checkpoint to other libraries.

    pmi-jax export hf --checkpoint runs/base-pmi --output exported/base-pmi

`hf` writes a Hugging Face transformers BertForMaskedLM directory (config.json,
model.safetensors, the corpus's WordPiece tokenizer, a README.md model card) that
`AutoModelForMaskedLM.from_pretrained(DIR)` and `AutoTokenizer.from_pretrained(DIR)` load with
no other file. docs/huggingface.md lists how every parameter maps.
"""
from __future__ import annotations

import argparse

from pmi_jax.cli import io_flags


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("export", help="export a checkpoint for other libraries (Hugging Face)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    formats = parser.add_subparsers(dest="export_format", required=True, metavar="FORMAT")
    p = formats.add_parser(
        "hf", help="a transformers BertForMaskedLM directory: config, safetensors weights, tokenizer, model card",
        description="Write a directory that transformers' AutoModelForMaskedLM and AutoTokenizer load as is "
                    "(PyTorch parameter names and layouts, the corpus's own uncased WordPiece vocabulary).")
    io_flags.reads(p.add_argument("--checkpoint", required=True,
                   help="a training --workdir (its latest checkpoint, or the one --step names) or one of its "
                        "checkpoints/<step> directories (local or gs://)"))
    p.add_argument("--step", type=int, default=None, help="export this step of the run (default: the latest)")
    io_flags.writes(p.add_argument("--output", required=True, help="directory to write (local or gs://); must not "
                                   "exist"), directory=True)
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    io_flags.reads(p.add_argument("--vocab", default=None,
                   help="the WordPiece vocab.txt the checkpoint was trained with (default: the one in the "
                        "checkpoint's corpus directory); checked against the checkpoint's hash"))
    io_flags.reads(p.add_argument("--perplexity", default=None, metavar="JSON",
                   help="a result of `pmi-jax eval perplexity --output JSON` for this checkpoint, quoted in the "
                        "model card"))
    p.set_defaults(func=run_hf)


def run_hf(args: argparse.Namespace) -> int:
    from pmi_jax.cli import quiet
    from pmi_jax.export import export_hf

    quiet.quiet_checkpoint_reads()
    exported = export_hf(args.checkpoint, args.output, step=args.step, vocab=args.vocab,
                         perplexity=args.perplexity, overwrite=args.overwrite)
    print(f"exported step {exported.step} ({exported.tensors} tensors, {exported.mebibytes:.1f} MiB) to {args.output}")
    return 0
