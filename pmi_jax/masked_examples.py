"""The masked examples a scheme makes of a prepared corpus, as the trainer reads them.

`pmi-jax data dump` writes them as JSON lines and `pmi-jax data show` prints them decoded, each
selected unit as {original|what the model sees}; both call `examples`, which reads the scheme's
seqio task with the trainer's seed semantics, so what is shown is what is trained on.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Iterator


from pmi_jax.config import MASK_RATE
from pmi_jax.errors import UserInputError

DUMPED = ("inputs", "targets", "weights", "units", "word_ids")  # the lists of a dumped line
POSITION = ("shard", "position", "epoch")  # where the example comes from, as integers


@dataclasses.dataclass(frozen=True)
class ExampleRequest:
    data: str  # a prepared corpus directory
    scheme: str
    num: int
    split: str = "train"
    seed: int = 0
    mask_rate: float = MASK_RATE
    shuffle: bool = False  # the training order for `seed` instead of file order


def examples(request: ExampleRequest):
    """(vocabulary, iterator of `num` NumPy examples without their padding) of the scheme's task."""
    import seqio

    from pmi_jax import tasks
    from pmi_jax.config import check_scheme, mask_rate_units
    from pmi_jax.formats import prepared_corpus

    if request.num < 1:
        raise UserInputError(f"--num {request.num}: must be at least 1")
    check_scheme(request.scheme, "--scheme")
    mask_rate_units(request.mask_rate, "--mask-rate")
    tasks.TaskCorpus(request.data).files(request.split)  # a missing split is an input error, not a tf.data one
    (name,) = tasks.register_corpus("data", request.data, [request.scheme], mask_rate=request.mask_rate)
    task = seqio.get_mixture_or_task(name)
    ds = task.get_dataset(None, request.split, shuffle=request.shuffle, seed=request.seed, num_epochs=None)

    def unpadded(found):  # task examples are padded to the corpus's seq_len with [PAD] = 0
        with prepared_corpus.reading(request.data):  # a shard whose bytes changed is named
            for ex in found:
                length = int((ex["targets"] != 0).sum())
                yield {k: v[:length] if v.ndim else v for k, v in ex.items()}

    return task.output_features["inputs"].vocabulary, unpadded(ds.take(request.num).as_numpy_iterator())


def dump(request: ExampleRequest, output: str) -> int:
    """Write the examples to `output` as JSON lines (whole, then renamed); how many were written."""
    from pmi_jax import storage

    _, found = examples(request)
    count = 0
    # A full disk's message says how much the whole dump needs: its lines so far, scaled to num.
    with storage.write_errors(output), storage.needs_space(lambda: f.written * request.num // max(count, 1)), \
            storage.atomic_file(output) as f:
        for ex in found:
            record = {k: ex[k].tolist() for k in DUMPED}
            record.update({k: int(ex[k]) for k in POSITION})
            count += 1
            f.write(json.dumps(record) + "\n")
    return count


def _join_pieces(tokens: list[str]) -> str:
    """WordPiece tokens as text: `##` pieces glue to what precedes them (except at the start)."""
    text = ""
    for token in tokens:
        if text and token.startswith("##") and len(token) > 2:
            text += token[2:]
        else:
            text += (" " if text else "") + token
    return text


def render(targets, inputs, weights, units, vocab_tokens: list[str]) -> str:
    """One example as text, each selected unit shown as {original|input}."""
    pieces, i, length = [], 0, len(targets)
    while i < length:
        if weights[i] == 0:
            pieces.append(vocab_tokens[targets[i]])
            i += 1
            continue
        j = i
        while j < length and weights[j] > 0 and units[j] == units[i]:
            j += 1
        original = _join_pieces([vocab_tokens[t] for t in targets[i:j]])
        shown = _join_pieces([vocab_tokens[t] for t in inputs[i:j]])
        pieces.append(("##{" if original.startswith("##") else "{") + original.removeprefix("##") + "|" + shown + "}")
        i = j
    return _join_pieces(pieces)


@dataclasses.dataclass(frozen=True)
class Shown:
    """One example as `data show` prints it."""

    shard: int
    position: int
    epoch: int
    tokens: int  # every token, [CLS] and [SEP] included, as `corpus show` counts them
    maskable: int  # the tokens a scheme may select (special tokens, unit -1, never are)
    selected: int
    units: int  # distinct units among the selected tokens
    budget: int  # the scheme's budget of the maskable tokens: `pmi_jax.masking.scheme_budget`
    text: str  # `render`'s


def shown(request: ExampleRequest) -> Iterator[Shown]:
    """The examples decoded, with the counts `data show` prints."""
    from pmi_jax.config import mask_rate_units
    from pmi_jax.masking import scheme_budget

    vocab, found = examples(request)
    rate = mask_rate_units(request.mask_rate)
    for ex in found:
        maskable = int((ex["units"] >= 0).sum())
        yield Shown(int(ex["shard"]), int(ex["position"]), int(ex["epoch"]), len(ex["targets"]), maskable,
                    int(ex["weights"].sum()), len(set(ex["units"][ex["weights"] > 0].tolist())),
                    int(scheme_budget(request.scheme, maskable, rate)),
                    render(ex["targets"], ex["inputs"], ex["weights"], ex["units"], vocab.tokens))
