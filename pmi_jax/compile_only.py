"""Compile the training step for a TPU slice or a GPU that is not here, and read the compiler's figures.

With libtpu installed, `jax.experimental.topologies` describes any TPU slice without one
attached; the program the slice would run (same mesh, shardings and train step) is lowered from
abstract inputs and compiled, nothing runs, and the compiler's memory, FLOPs and estimated step
time are reported (the estimate is its cost model, not a measurement). Slices are named as
Google names them (`v5p-8`) or as a topology (`v5p:2x2x2`); docs/tpu.md, "Compile-only".
With JAX's CUDA plugin (no GPU or NVIDIA library needed) the same for one `h100` or `h200`,
described by gpu_specs/; XLA:GPU has no cost analysis there, so FLOPs and bytes come from the
optimized HLO's shapes (`pmi_jax.hlo`) with the kernels moving the most bytes (docs/gpu.md).
"""
from __future__ import annotations

import dataclasses
import math
import os
import re

from pmi_jax.config import ExperimentConfig
from pmi_jax.errors import UserInputError

GiB = 1024 ** 3
# Without a device XLA:GPU cannot autotune its matmuls and emits Triton GEMMs with default tiles,
# which the device did not choose: the lent H100 ran cuBLAS for all of BERT-base's (its own HLO).
# With cuBLAS only the program has the device's fusions (benchmarks/README.md, "Deviceless H100
# programs as the device compiles them") and compiles in half a minute instead of minutes.
GPU_COMPILER_OPTIONS = {"xla_gpu_enable_triton_gemm": False}
GPU_SPECS = {"h100": "h100_sxm.txtpb", "h200": "h200_sxm.txtpb"}  # --topology -> pmi_jax/gpu_specs/ file
TOP_KERNELS = 15  # rows of the report's table of kernels by bytes


@dataclasses.dataclass(frozen=True)
class Generation:
    prefix: str  # jax's topology-name prefix
    cores_in_name: bool  # True: "v4-32" counts TensorCores (2 per chip); False: chips
    dims: int  # 3-D torus (v4, v5p) or 2-D (v5e, v6e)
    hbm_bytes: int  # per chip, data sheet
    device_kind: str  # jax's device_kind, for the MFU peak (pmi_jax.flops)


GENERATIONS = {
    "v4": Generation("v4", True, 3, 32 * GiB, "TPU v4"),
    "v5p": Generation("v5p", True, 3, 95 * GiB, "TPU v5"),
    "v5e": Generation("v5e", False, 2, 16 * GiB, "TPU v5 lite"),
    "v6e": Generation("v6e", False, 2, 32 * GiB, "TPU v6 lite"),
}


def slice_topology(name: str) -> tuple[Generation, str]:
    """`v4-32` -> (v4, "v4:2x2x4"); `v5e:4x4` passes through. UserInputError for anything else."""
    known = ", ".join(GENERATIONS) + " (or a GPU: " + ", ".join(GPU_SPECS) + ")"
    match = re.fullmatch(r"(v\d+[a-z]?)([-:])(.+)", name.strip().lower())
    generation = GENERATIONS.get(match.group(1)) if match else None
    if generation is None:
        raise UserInputError(f"--topology {name}: expected GEN-N or GEN:AxB[xC] with GEN one of {known}, "
                             "e.g. v5p-8, v4-32, v5e-16, v6e-8 or v5p:2x2x2")
    if match.group(2) == ":":
        dims = match.group(3).split("x")
        if len(dims) != generation.dims or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise UserInputError(f"--topology {name}: {generation.prefix} topologies have {generation.dims} "
                                 "positive dimensions, e.g. " + ("2x2x2" if generation.dims == 3 else "4x4"))
        return generation, f"{generation.prefix}:{match.group(3)}"
    count = int(match.group(3)) if match.group(3).isdigit() else 0
    chips = count // 2 if generation.cores_in_name else count
    if count <= 0 or (generation.cores_in_name and count % 2) or chips & (chips - 1):
        raise UserInputError(f"--topology {name}: the number after {match.group(1)}- must be a power of two"
                             + (" of TensorCores (2 per chip)" if generation.cores_in_name else " of chips"))
    return generation, f"{generation.prefix}:{'x'.join(map(str, _torus(chips, generation.dims)))}"


def _torus(chips: int, ndims: int) -> list[int]:
    """The standard slice shape of `chips` chips: 4 -> 2x2x1, 16 -> 2x2x4, 64 -> 4x4x4; 16 -> 4x4 in 2-D.

    Slices grow by doubling the last of the smallest dimensions, which reproduces Google's
    published shapes (v4-32 is 2x2x4, v4-64 2x4x4, v5e-32 4x8).
    """
    shape = [2, 2, 1] if ndims == 3 and chips >= 4 else [1] * ndims
    while math.prod(shape) < chips:
        smallest = min(shape)
        last = max(i for i, s in enumerate(shape) if s == smallest)
        shape[last] *= 2
    return shape


def topology_devices(name: str):
    """(generation, topology name, the slice's compile-only devices). Needs libtpu."""
    generation, topology = slice_topology(name)
    # libtpu takes a machine-wide lock for the TPU chips it would drive; compiling drives
    # none, so several compile-only processes (a sweep, tests) may load it side by side.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        from jax.experimental import topologies

        kwargs = {"chip_config_name": "megacore"} if generation.prefix == "v4" else {}
        description = topologies.get_topology_desc(platform="tpu", topology_name=topology, **kwargs)
    except Exception as e:  # no libtpu, or a topology libtpu does not know
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise UserInputError(f"--topology {name}: cannot describe TPU slice {topology} ({reason}); compile-only "
                             "needs libtpu: pip install -c constraints.txt -e '.[tpu]'") from e
    return generation, topology, description.devices


def gpu_spec(name: str) -> str:
    """The GpuTargetConfig text of a GPU named in GPU_SPECS."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_specs", GPU_SPECS[name])
    with open(path, encoding="utf-8") as f:
        return f.read()


def _spec_value(spec: str, field: str) -> float:
    return float(re.search(rf"^\s*{field}: ([\d.]+)", spec, re.M).group(1))


def gpu_devices(name: str):
    """The compile-only device of one GPU of kind `name` (h100, h200). Needs the CUDA plugin only."""
    # The plugin checks the NVIDIA libraries' versions when it starts; a compile uses none of them.
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    try:
        from jax.experimental import topologies

        description = topologies.get_topology_desc(platform="cuda", target_config=gpu_spec(name), topology="1x1x1")
    except Exception as e:  # no CUDA plugin
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise UserInputError(f"--topology {name}: cannot describe an {name.upper()} ({reason}); GPU compile-only "
                             "needs JAX's CUDA plugin, not a GPU: pip install -c constraints.txt "
                             "jax-cuda12-plugin jax-cuda12-pjrt") from e
    return description.devices


@dataclasses.dataclass(frozen=True)
class CompileReport:
    """The compiler's view of one training step on one slice; bytes and FLOPs per device."""

    topology: str
    num_devices: int
    num_hosts: int
    mesh: dict
    hbm_bytes: int
    state_bytes: int  # parameters + optimiser state held by one device
    batch_bytes: int
    temp_bytes: int
    code_bytes: int
    total_bytes: int
    compiler_flops: float  # per device, per step
    formula_flops: float  # pmi_jax.flops' count for the computed model, per device, per step
    estimated_seconds: float | None  # None when the compiler gives no usable estimate
    peak_flops: float | None
    # Why the FLOPs and time are not the step's, when they are not: XLA's cost analysis
    # counts the body of a loop once, so a program with its layers in a scan (or gradient
    # accumulation) reports a fraction of its work.
    loop_note: str | None = None
    # GPU programs: XLA:GPU has no cost analysis without a device, so the figures come from the
    # optimized HLO's shapes (pmi_jax.hlo): bytes each kernel reads and writes once, its matmul
    # FLOPs, and the kernels moving the most bytes.
    bandwidth: float | None = None  # bytes/s of the chip's memory (gpu_specs/)
    hlo_bytes: int | None = None
    kernel_count: int = 0  # launches
    roofline_seconds: float | None = None  # sum over kernels of max(FLOPs / peak, bytes / bandwidth)
    top_kernels: tuple = ()  # pmi_jax.hlo.KernelGroup, the TOP_KERNELS moving the most bytes per step

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.hbm_bytes

    @property
    def estimated_mfu(self) -> float | None:
        if not self.estimated_seconds or not self.peak_flops or self.loop_note:
            return None
        return self.formula_flops / self.estimated_seconds / self.peak_flops

    def lines(self) -> list[str]:
        def gib(n):
            return f"{n / GiB:.2f} GiB"

        if self.loop_note:
            estimate = f"not available ({self.loop_note})"
        elif self.hlo_bytes is not None:
            estimate = "not available (XLA:GPU estimates nothing without a device; the bounds below are ours)"
        elif self.estimated_seconds and self.estimated_mfu is not None:
            estimate = f"{self.estimated_seconds * 1000:.1f} ms per step, estimated MFU {100 * self.estimated_mfu:.1f}%"
        else:
            estimate = "not available (the compiler's estimate for this chip is not a positive time)"
        flops = (f"FLOPs per device per step: compiler {self.compiler_flops:.4g}, formula {self.formula_flops:.4g} "
                 + (f"(compiler / formula = {self.compiler_flops / self.formula_flops:.3f})" if not self.loop_note
                    else "(the compiler's count covers one pass of each loop body)"))
        if self.hlo_bytes is not None:
            flops = (f"FLOPs per device per step: from the HLO's shapes (matmuls, cuDNN and our Triton attention) "
                     f"{self.compiler_flops:.4g}, formula {self.formula_flops:.4g} "
                     f"(HLO / formula = {self.compiler_flops / self.formula_flops:.3f})")
        return [
            f"topology {self.topology}: {self.num_devices} devices on {self.num_hosts} hosts, mesh {self.mesh}",
            f"HBM per device: state (params + optimiser) {gib(self.state_bytes)}, temporaries "
            f"{gib(self.temp_bytes)}, batch {gib(self.batch_bytes)}, code {gib(self.code_bytes)}; "
            f"total {gib(self.total_bytes)} of {gib(self.hbm_bytes)}: " + ("fits" if self.fits else "DOES NOT FIT"),
            flops,
            f"compiler's step-time estimate (not a measurement): {estimate}",
        ] + (self._gpu_lines() if self.hlo_bytes is not None else [])

    def _gpu_lines(self) -> list[str]:
        bound = self.hlo_bytes / self.bandwidth
        mfu = (f", MFU at most {100 * self.formula_flops / self.roofline_seconds / self.peak_flops:.1f}%"
               if self.roofline_seconds and self.peak_flops else "")
        loops = " (loop bodies counted once)" if self.loop_note else ""
        lines = [f"bytes per step from the HLO's shapes ({self.kernel_count} kernel launches, each operand and "
                 f"result once{loops}): {self.hlo_bytes / GiB:.2f} GiB, {1e3 * bound:.1f} ms at "
                 f"{self.bandwidth / 1e12:.2f} TB/s",
                 "roofline bound (each kernel at the larger of FLOPs / peak and bytes / bandwidth; not a "
                 "measurement): " + (f"{1e3 * self.roofline_seconds:.1f} ms per step{mfu}" if self.roofline_seconds
                                     else "not available (no peak FLOP/s known: --peak-flops)"),
                 f"the {len(self.top_kernels)} kernels moving the most bytes per step (a kernel XLA reuses for "
                 "identical fusions runs once per launch; ms at the bandwidth bound):",
                 f"  {'kernel':<40} {'launches':>8} {'MiB':>8} {'ms':>6}  {'kind':<11} model operation"]
        for k in self.top_kernels:
            lines.append(f"  {k.kernel:<40} {k.launches:>8} {k.bytes / 2**20:8.1f} {1e3 * k.bytes / self.bandwidth:6.3f}  "
                         f"{k.category:<11} {k.op}")
        return lines


def _bytes_per_device(abstract, shardings) -> int:
    import jax

    leaves = zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings))
    return sum(math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize for a, s in leaves)


def _target(name: str):
    """(topology, devices, HBM bytes per device, device kind, GPU spec text or None) of --topology."""
    gpu = name.strip().lower()
    if gpu in GPU_SPECS:
        spec, devices = gpu_spec(gpu), gpu_devices(gpu)
        kind = devices[0].device_kind
        return f"{gpu} ({kind})", devices, int(_spec_value(spec, "device_memory_size")), kind, spec
    generation, topology, devices = topology_devices(name)
    return topology, devices, generation.hbm_bytes, generation.device_kind, None


def _hlo_figures(hlo_text: str, spec: str, peak: float | None) -> dict:
    """A GPU program's FLOPs, bytes, bounds and largest kernels, from its optimized HLO."""
    from pmi_jax import hlo

    bandwidth = _spec_value(spec, "memory_bandwidth")
    kernels = hlo.program_kernels(hlo_text)
    return dict(flops=sum(k.flops for k in kernels), bandwidth=bandwidth, hlo_bytes=sum(k.bytes for k in kernels),
                kernel_count=len(kernels),
                roofline_seconds=sum(max(k.flops / peak, k.bytes / bandwidth) for k in kernels) if peak else None,
                top_kernels=tuple(hlo.by_kernel(kernels).values())[:TOP_KERNELS])


def compile_train_step(config: ExperimentConfig, topology_name: str):
    """(CompileReport, the compiled executable) for `config` on the named slice.

    Raises UserInputError when the slice cannot be described, the config does not fit the
    mesh, or XLA rejects the program (e.g. out of memory at compile time).
    """
    import jax
    import numpy as np

    from pmi_jax import batches, flops, model, partitioning, train

    topology, devices, hbm_bytes, device_kind, spec = _target(topology_name)
    mesh = partitioning.make_mesh(config.mesh, devices)
    train.validate(config, mesh)
    with partitioning.activate(mesh, config.mesh):
        try:
            program = train.build_program(config, mesh)
            state = program.restore_target()
        except RuntimeError as e:  # JAX reads cuDNN's version before it emits cuDNN attention
            if "cuDNN" not in str(e):
                raise
            raise UserInputError(f"--topology {topology_name}: cuDNN attention needs NVIDIA's cuDNN library beside JAX's "
                                 "CUDA plugin, not a GPU: pip install -c constraints.txt nvidia-cudnn-cu12 (python3 "
                                 "dev.py puts it in .venv/cuda12), or --set model.attention=xla") from e
        batch_sharding = partitioning.batch_sharding(mesh)
        shape = (config.train.batch_size, config.data.seq_len)
        batch = {k: jax.ShapeDtypeStruct(shape, np.float32 if k == "weights" else np.int32, sharding=batch_sharding)
                 for k in batches.BATCH_KEYS}
        try:
            compiled = program.step.lower(train.TrainState(**state), batch).compile(
                compiler_options=GPU_COMPILER_OPTIONS if spec else None)
        except Exception as e:  # XLA's errors (resource exhausted, ...) as one line
            first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
            raise UserInputError(f"--topology {topology_name}: the train step does not compile for {topology}: "
                                 f"{first[:400]}") from e
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
    estimate = float(cost.get("optimal_seconds", 0.0) or 0.0)
    state_bytes = _bytes_per_device(program.abstract, program.shardings)
    batch_bytes = sum(_bytes_per_device(b, b.sharding) for b in batch.values())
    total = (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
             + memory.temp_size_in_bytes + memory.generated_code_size_in_bytes)
    tokens = config.train.batch_size * config.data.seq_len
    formula = (flops.training_flops_per_token(config.model, config.data.seq_len, config.data.highest_mask_rate)
               * tokens / len(devices))
    settled = model.for_platform(config.model, mesh.devices.flat[0].platform)  # as `train.build_program` settles it
    rolled = settled.scan_layers and settled.scan_unroll < settled.num_layers
    loops = [what for what, on in (("model.scan_layers", rolled),
                                   ("optimizer.grad_accum_steps > 1", config.optimizer.grad_accum_steps > 1)) if on]
    loop_note = (f"XLA's cost analysis counts a loop body once and {' and '.join(loops)} puts the layers in a loop; "
                 "compile with model.scan_layers=false (or model.scan_unroll at the number of layers) and "
                 "optimizer.grad_accum_steps=1 for the step's FLOPs and "
                 "time" if loops else None)
    peak = config.train.peak_flops or flops.device_peak_flops(device_kind)
    gpu_figures = _hlo_figures(compiled.as_text(), spec, peak) if spec else {}
    if spec:
        cost = {"flops": gpu_figures.pop("flops")}
    report = CompileReport(
        topology=topology, num_devices=len(devices), num_hosts=len({d.process_index for d in devices}),
        mesh=dict(mesh.shape), hbm_bytes=hbm_bytes, state_bytes=state_bytes, batch_bytes=batch_bytes,
        temp_bytes=memory.temp_size_in_bytes, code_bytes=memory.generated_code_size_in_bytes, total_bytes=total,
        compiler_flops=float(cost.get("flops", 0.0)), formula_flops=formula,
        estimated_seconds=estimate if estimate > 0 else None, peak_flops=peak, loop_note=loop_note, **gpu_figures)
    return report, compiled
