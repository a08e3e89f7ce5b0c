"""Experiment configs: plain Python files whose `get_config()` returns an ExperimentConfig.

`pmi-jax train --config tiny` (a name here) or `--config path/to/file.py`; any field can
then be overridden with `--set section.field=value`. The library never imports this package.
"""
