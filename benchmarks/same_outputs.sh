#!/bin/bash
# The demo pipeline on one checkout of pmi-jax, for the before/after check in benchmarks/README.md
# ("Issue 24 layout: same outputs"). usage: benchmarks/same_outputs.sh CODE_ROOT OUT
# PYTHON=... picks the interpreter; TEXT=DIR uses that text instead of the demo corpus, which is the
# running Python's own documentation (two Pythons compared on one text: "Issue 22: JAX 0.12 pins").
set -e
CODE=$1; OUT=$2
OUT=$(realpath -m "$OUT"); rm -rf "$OUT"; mkdir -p "$OUT"
export PYTHONPATH=$CODE PYTHONHASHSEED=0
PY() { nice -n 5 "${PYTHON:-python}" -c "import sys; from pmi_jax.cli import main; sys.exit(main())" "$@"; }
cd "$CODE"
if [ -n "${TEXT:-}" ]; then cp -r "$TEXT" $OUT/text; else PY demo-corpus --output $OUT/text --overwrite; fi
PY vocab build --input "$OUT/text/*.txt" --output $OUT/vocab --size 20000 --min-count 5 --overwrite
PY corpus prepare --input "$OUT/text/*.txt" --output $OUT/data --units pmi=$OUT/vocab --seq-len 128 --overwrite
for s in random_token whole_word random_span pmi; do
  PY data dump --data $OUT/data --scheme $s --num 50 --seed 0 --output $OUT/dump_$s.jsonl
done
PY train --config configs/experiments/demo.py --data $OUT/data --scheme pmi --workdir $OUT/runs/pmi --set train.num_steps=30
PY eval perplexity --checkpoint $OUT/runs/pmi --positions 8 --max-sequences 100 || true
echo DONE
