"""pmi_jax/config.py: `--set` overrides parsed by the field's type, and the errors a typo gets."""
import dataclasses
import json

import pytest

from pmi_jax.config import (SCHEMES, UNIT_SCHEMES, ExperimentConfig, MeshConfig, ModelConfig, apply_overrides,
                            model_config_from_dict, to_dict)
from pmi_jax.errors import UserInputError


def _config() -> ExperimentConfig:
    return ExperimentConfig(model=ModelConfig(vocab_size=100, hidden_size=64, num_layers=2, num_heads=4,
                                              intermediate_size=128, max_position_embeddings=64))


def test_overrides_parse_each_value_by_its_field_type():
    config = apply_overrides(_config(), [
        "model.num_layers=4", "optimizer.peak_learning_rate=2e-4", "optimizer.warmup_steps=1e3",
        "model.dtype=bfloat16", "data.scheme=random_span", "train.batch_size = 32",
        "mesh.rules=[['batch', ['data', 'fsdp']], ['vocab', None]]", "optimizer.weight_decay=1"])
    assert config.model.num_layers == 4
    assert config.optimizer.peak_learning_rate == 2e-4
    assert config.optimizer.warmup_steps == 1000 and isinstance(config.optimizer.warmup_steps, int)
    assert config.model.dtype == "bfloat16"
    assert config.data.scheme == "random_span"
    assert config.train.batch_size == 32
    assert config.mesh.rules == (("batch", ("data", "fsdp")), ("vocab", None))  # lists become tuples
    assert config.optimizer.weight_decay == 1.0 and isinstance(config.optimizer.weight_decay, float)
    # Nothing else changed, and the original is untouched (frozen dataclasses, replaced).
    assert config.model.hidden_size == 64 and _config().model.num_layers == 2


def test_later_overrides_win():
    assert apply_overrides(_config(), ["train.seed=1", "train.seed=7"]).train.seed == 7


@pytest.mark.parametrize("override, message", [
    ("model.num_layer=4", r"ModelConfig has no field 'num_layer' \(fields: vocab_size, "),
    ("modle.num_layers=4", "ExperimentConfig has no field 'modle'"),
    ("model=4", "'model' is a section; name one of its fields"),
    ("model.num_layers.x=4", "'num_layers' is not a section"),
    ("model.num_layers", "expected FIELD=VALUE"),
    ("=4", "expected FIELD=VALUE"),
    ("model.num_layers=four", "cannot parse 'four' as int"),
    ("model.num_layers=2.5", "'2.5' is not a valid int"),
    ("model.num_layers=True", "'True' is not a valid int"),  # a bool is not an int here
    ("optimizer.peak_learning_rate=[1]", r"'\[1\]' is not a valid float"),
])
def test_bad_overrides_name_the_override(override, message):
    with pytest.raises(UserInputError, match=message) as error:
        apply_overrides(_config(), [override])
    assert repr(override) in str(error.value)


def test_model_config_checks_itself():
    with pytest.raises(UserInputError, match="not divisible by model.num_heads=3"):
        apply_overrides(_config(), ["model.num_heads=3"])
    with pytest.raises(UserInputError, match="expected 'float32' or 'bfloat16'"):
        apply_overrides(_config(), ["model.dtype=float16"])
    with pytest.raises(UserInputError, match="model.dropout_mask='bits8': expected one of auto, bernoulli, bits16"):
        apply_overrides(_config(), ["model.dropout_mask=bits8"])
    with pytest.raises(UserInputError, match="model.decoder_grad='bf16': expected one of auto, float32, compute"):
        apply_overrides(_config(), ["model.decoder_grad=bf16"])
    for override in ("model.attention_dropout_rate=1.5", "model.dropout_rate=-0.1", "model.dropout_rate=1"):
        with pytest.raises(UserInputError, match=r"dropout_rate=.*: a dropout rate must be in \[0, 1\)"):
            apply_overrides(_config(), [override])
    assert apply_overrides(_config(), ["model.attention_dropout_rate=0"]).model.attention_dropout_rate == 0.0
    with pytest.raises(UserInputError, match=r"model.scan_unroll=-1: expected a number of layers, or 0 \(auto\)"):
        apply_overrides(_config(), ["model.scan_layers=true", "model.scan_unroll=-1"])
    with pytest.raises(UserInputError, match="model.scan_unroll=12 unrolls the scan of model.scan_layers=true"):
        apply_overrides(_config(), ["model.scan_layers=false", "model.scan_unroll=12"])


@pytest.mark.parametrize("override, message", [
    ("optimizer.grad_clip_norm=-1", r"optimizer.grad_clip_norm=-1.0: expected at least 0 \(0: no clipping\)"),
    ("optimizer.b2=1", r"optimizer.b2=1.0: expected in \[0, 1\)"),
    ("optimizer.eps=0", "optimizer.eps=0.0: expected above 0"),
    ("optimizer.warmup_steps=-5", "optimizer.warmup_steps=-5: expected at least 0"),
])
def test_optimizer_config_checks_itself(override, message):
    with pytest.raises(UserInputError, match=message):
        apply_overrides(_config(), [override])
    assert apply_overrides(_config(), ["optimizer.grad_clip_norm=0"]).optimizer.grad_clip_norm == 0


def test_config_round_trips_through_json():
    config = apply_overrides(_config(), ["model.num_layers=3", "mesh.model=2"])
    as_json = json.loads(json.dumps(to_dict(config)))
    assert model_config_from_dict(as_json["model"]) == config.model
    # Unknown keys (from a newer version's checkpoint) are ignored rather than fatal.
    assert model_config_from_dict({**as_json["model"], "future_field": 1}) == config.model
    assert MeshConfig(**{k: (tuple(tuple(r) if isinstance(r, list) else r for r in v) if k == "rules" else v)
                         for k, v in as_json["mesh"].items()}).model == 2


def test_scheme_names_are_defined_once_and_consistently():
    assert set(UNIT_SCHEMES) <= set(SCHEMES) and len(set(SCHEMES)) == len(SCHEMES)
    assert dataclasses.fields(ExperimentConfig)[1].default.scheme in SCHEMES


def test_a_bad_scheme_is_refused_where_it_is_given(tmp_path):
    """One check (config.check_scheme, run by DataConfig); the error names where the value came from."""
    from pmi_jax.experiment import RunSpec, resolve_config

    with pytest.raises(UserInputError, match=r"^--scheme: data.scheme 'pmi_masking': not a masking scheme; choose "
                                             r"one of random_token, "):
        resolve_config(RunSpec(config="tiny", scheme="pmi_masking"))
    with pytest.raises(UserInputError, match=r"^override 'data.scheme=spans': data.scheme 'spans': not a masking"):
        resolve_config(RunSpec(config="tiny", overrides=("data.scheme=spans",)))
    config_file = tmp_path / "mine.py"
    config_file.write_text("import dataclasses\nfrom pmi_jax.configs.tiny import get_config as tiny\n"
                           "from pmi_jax.config import DataConfig\n\n\ndef get_config():\n"
                           "    return dataclasses.replace(tiny(), data=DataConfig(scheme='wwm'))\n")
    with pytest.raises(UserInputError, match=rf"^--config {config_file} \({config_file}\): data.scheme 'wwm': not a"):
        resolve_config(RunSpec(config=str(config_file)))
    assert resolve_config(RunSpec(config="tiny", scheme="random_span"))[0].data.scheme == "random_span"


def test_the_sequence_length_rule():
    """0 means the corpus's length; a shorter one would cut its sequences; a longer one pads."""
    from pmi_jax.formats.prepared_corpus import training_seq_len

    assert training_seq_len(0, 128, "d") == 128 and training_seq_len(None, 128, "d") == 128
    assert training_seq_len(256, 128, "d") == 256 and training_seq_len(128, 128, "d") == 128
    with pytest.raises(UserInputError, match=r"data.seq_len=64 but d holds sequences of up to 128 tokens"):
        training_seq_len(64, 128, "d")


def test_paper_schemes_are_the_first_six_schemes():
    from pmi_jax.configs.experiments import PAPER_SCHEMES

    assert SCHEMES[:len(PAPER_SCHEMES)] == PAPER_SCHEMES and SCHEMES[len(PAPER_SCHEMES):] == ("informask",)
    assert len(PAPER_SCHEMES) == 6


def test_the_2_4m_config_decays_over_its_own_steps():
    """configs/experiments/paper_2_4m.py (the paper's §5.1 runs): same model, batch and optimizer
    as paper.py, 2.4M steps, the learning rate reaching 0 at 2.4M and not at 1M; every 200K kept."""
    from pmi_jax.config import load_config
    from pmi_jax.optimizer import learning_rate_schedule

    paper = load_config("configs/experiments/paper.py")
    longer = load_config("configs/experiments/paper_2_4m.py")
    assert longer.train.num_steps == 2_400_000 and paper.train.num_steps == 1_000_000
    assert (longer.model, longer.optimizer, longer.train.batch_size, longer.train.seed) == \
        (paper.model, paper.optimizer, paper.train.batch_size, paper.train.seed)
    assert (longer.checkpoint.every_steps, longer.checkpoint.keep) == (200_000, 12)
    schedule = learning_rate_schedule(longer.optimizer, longer.train.num_steps)
    one_m = learning_rate_schedule(paper.optimizer, paper.train.num_steps)
    peak = longer.optimizer.peak_learning_rate
    assert float(schedule(10_000)) == pytest.approx(peak)
    assert float(schedule(1_000_000)) == pytest.approx(peak * 1_400_000 / 2_390_000, rel=1e-5)
    assert float(one_m(1_000_000)) == pytest.approx(0.0, abs=1e-12)
    assert float(schedule(2_400_000)) == pytest.approx(0.0, abs=1e-12)


def test_a_named_config_is_found_in_the_configs_package_and_a_path_as_given(tmp_path):
    """`experiments/paper` names configs/experiments/paper.py wherever pmi_jax.configs lives; the
    path form still works; an unknown name is the user's error, with the names to try."""
    import os

    from pmi_jax.config import config_path, load_config

    named, by_path = load_config("experiments/paper"), load_config("configs/experiments/paper.py")
    assert named == by_path and named.train.num_steps == 1_000_000
    assert os.path.samefile(config_path("tiny"), os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.py"))
    with pytest.raises(UserInputError, match="--config experiments/nope: no config of that name.*experiments/demo"):
        config_path("experiments/nope")
