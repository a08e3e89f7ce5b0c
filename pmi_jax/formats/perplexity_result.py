"""The contents of a `pmi-jax eval perplexity` result file (named by
`pmi_jax.formats.run_dir.perplexity_result_path`).

JSON: unit, split, step, scheme, seed, positions, perplexity, mean_nll, counts, `interval`,
`scored_set` (sha256 of which tokens were scored: equal for every run scored on the same corpus,
split, unit kind, seed and positions) and `scores`, every scored token's NLL (nats, rounded to
1e-6) with its sequence (run-length encoded), position and unit, so `pmi-jax compare` can pair
runs token by token. Files from before units read as unit `token` without scores. Field list:
docs/design.md, "Module notes", perplexity_result.py.
"""
from __future__ import annotations

import json

import numpy as np

from pmi_jax import storage
from pmi_jax.errors import UserInputError

TOKEN_UNIT = "token"
NLL_DECIMALS = 6


def encode_scores(sequence_N, position_N, unit_N, nll_N) -> dict:
    sequence_N = np.asarray(sequence_N)
    starts = np.flatnonzero(np.r_[True, sequence_N[1:] != sequence_N[:-1]]) if len(sequence_N) else np.array([], int)
    counts = np.diff(np.r_[starts, len(sequence_N)])
    return {"sequence": sequence_N[starts].tolist(), "count": counts.tolist(),
            "position": np.asarray(position_N).tolist(), "unit": np.asarray(unit_N).tolist(),
            "nll": np.round(np.asarray(nll_N, np.float64), NLL_DECIMALS).tolist()}


def decode_scores(scores: dict, path: str) -> dict[str, np.ndarray]:
    """{"sequence", "position", "unit": int64 [N], "nll": float64 [N]}."""
    try:
        sequence_N = np.repeat(np.asarray(scores["sequence"], np.int64), np.asarray(scores["count"], np.int64))
        columns = {"sequence": sequence_N, "position": np.asarray(scores["position"], np.int64),
                   "unit": np.asarray(scores["unit"], np.int64), "nll": np.asarray(scores["nll"], np.float64)}
    except (KeyError, TypeError, ValueError):
        raise UserInputError(f"{path}: its scores are not sequence/count/position/unit/nll columns") from None
    if len({len(c) for c in columns.values()}) != 1:
        raise UserInputError(f"{path}: its score columns differ in length")
    return columns


def write(path: str, result: dict) -> None:
    """The whole file under a temporary name, then renamed."""
    with storage.atomic_file(path) as f:
        f.write(json.dumps(result, separators=(",", ":")) + "\n")


# The fields readers use, with their types: `compare` tabulates them, `export hf --perplexity`
# quotes them in the model card; a string or binary bytes there would surface as a traceback.
FIELDS = {"step": int, "split": str, "unit": str, "perplexity": float, "mean_nll": float, "num_tokens": int,
          "num_sequences": int}


def read(path: str, option: str = "") -> dict:
    """The result, `unit` filled in for older files, `scores` decoded (None when absent); its
    fields and their types checked, a one-line error naming `option` and `path` otherwise."""
    name = f"{option} {path}".strip()
    if not storage.gfile.exists(path):
        raise UserInputError(f"{name}: no such file")
    try:
        with storage.gfile.GFile(path, "rb") as f:
            result = json.loads(f.read().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserInputError(f"{name}: not JSON ({e})") from None
    if not isinstance(result, dict) or "perplexity" not in result or "step" not in result:
        raise UserInputError(f"{name}: not an `eval perplexity` result (no perplexity or step)")
    result.setdefault("unit", TOKEN_UNIT)
    result.setdefault("split", "validation")
    for field, kind in FIELDS.items():
        value = result.get(field)
        if kind is str:
            ok = isinstance(value, str)
        else:
            ok = not isinstance(value, bool) and isinstance(value, int if kind is int else (int, float))
        if not ok:
            expected = {str: "a string", int: "an integer", float: "a number"}[kind]
            raise UserInputError(f"{name}: not an `eval perplexity` result ({field} is "
                                 f"{json.dumps(value)[:40]}, expected {expected})")
    result["scores"] = decode_scores(result["scores"], path) if result.get("scores") else None
    return result
