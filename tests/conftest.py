"""Shared test setup: 8 virtual CPU devices for mesh tests, quiet TensorFlow."""
import os

# Must precede any jax import: lets sharding tests build (data=4, model=2) meshes on one CPU.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
