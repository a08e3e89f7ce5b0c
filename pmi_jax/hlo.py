"""Read a compiled program's optimized HLO text: its kernels, the bytes and FLOPs each one's shapes
imply, and the model operation each belongs to.

XLA:GPU's cost analysis is not available for a program compiled without a GPU, and a profile
names kernels by their fusion, not by the model code. Both questions are answered here from the
text alone (`compiled.as_text()`), so that the deviceless compile (`pmi_jax.compile_only`) and
the GPU profile (`benchmarks/gpu_step.py`) use one mapping. Bytes are what a kernel's operands and
results would move if each were read or written once: a fusion that only slices or gathers
from a parameter is counted for the slices it reads; caches and re-reads are not modelled.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import math
import re

DTYPE_BITS = {"pred": 8, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "s32": 32, "u32": 32,
              "s64": 64, "u64": 64, "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
              "f8e4m3fn": 8, "f8e5m2": 8, "f8e4m3fnuz": 8, "f8e5m2fnuz": 8, "token": 0}
# Opcodes that launch no work of their own (views, tuples, control flow counted through its body).
_NO_KERNEL = frozenset({"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all",
                        "partition-id", "replica-id", "opt-barrier", "add-dependency", "while", "conditional",
                        "call", "async-start", "async-update", "async-done"})
_READS_PART = frozenset({"slice", "dynamic-slice", "gather"})

_COMPUTATION = re.compile(r"^(ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%?([\w.\-]+) = (.*?) ([a-z][\w\-]*)\((.*)$")
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition|branch_computations)=\{?%?([\w.\-]+)")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_FRAME = re.compile(r"stack_frame_id=(\d+)")


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    opcode: str
    shape: str  # the result's shape as written, e.g. "(bf16[32,512]{1,0}, f32[32])"
    operands: tuple[str, ...]
    calls: tuple[str, ...]  # fused / called computations
    target: str  # custom-call target, else ""
    op_name: str  # metadata op_name: the JAX name stack of the code that emitted it
    frame: int | None  # metadata stack_frame_id
    attributes: str  # the rest of the line (backend_config, dimension numbers)
    parameter: int = -1  # a parameter's number


@dataclasses.dataclass(frozen=True)
class Module:
    entry: str
    computations: dict  # name -> tuple[Instruction, ...]
    frames: dict  # stack frame id -> ((file, function), ...) innermost first
    shapes: dict  # (computation, instruction name) -> shape

    def shape_of(self, computation: str, name: str) -> str:
        return self.shapes.get((computation, name), "")

    def stack(self, inst: Instruction) -> tuple:
        return self.frames.get(inst.frame, ()) if inst.frame is not None else ()


def parse(text: str) -> Module:
    computations: dict[str, list[Instruction]] = {}
    entry, current = "", None
    for line in text.splitlines():
        m = _COMPUTATION.match(line)
        if m and " = " not in line.split("{")[0]:
            current = m.group(2)
            computations[current] = []
            entry = current if m.group(1) else entry
            continue
        m = _INSTRUCTION.match(line)
        if m and current is not None:
            name, shape, opcode, rest = m.groups()
            args, attributes = _split_operands(rest)
            op_name, frame = _OP_NAME.search(attributes), _FRAME.search(attributes)
            target = _TARGET.search(attributes)
            computations[current].append(Instruction(
                name, opcode, shape, tuple(re.findall(r"%([\w.\-]+)", args)), tuple(_CALLS.findall(attributes)),
                target.group(1) if target else "", op_name.group(1) if op_name else "",
                int(frame.group(1)) if frame else None, attributes,
                int(args) if opcode == "parameter" and args.strip().isdigit() else -1))
    shapes = {(c, i.name): i.shape for c, insts in computations.items() for i in insts}
    return Module(entry, {k: tuple(v) for k, v in computations.items()}, _stack_frames(text), shapes)


def _split_operands(rest: str) -> tuple[str, str]:
    """'a, b), attrs...' -> ('a, b', 'attrs...'): the operand list ends at its matching parenthesis."""
    depth = 1
    for i, ch in enumerate(rest):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return rest[:i], rest[i + 1:]
    return rest, ""


def _stack_frames(text: str) -> dict:
    """The module's stack-frame tables: frame id -> ((file, function), ...), innermost first."""
    tables: dict[str, dict[int, str]] = collections.defaultdict(dict)
    section = None
    for line in text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = line
            continue
        m = re.match(r"^(\d+) (.*)$", line)
        if section and m:
            tables[section][int(m.group(1))] = m.group(2)
        elif line.strip() and not m:
            section = None

    def field(value: str, key: str) -> int:
        m = re.search(rf"{key}=(\d+)", value)
        return int(m.group(1)) if m else 0

    files = {k: v.strip('"') for k, v in tables["FileNames"].items()}
    functions = {k: v.strip('"') for k, v in tables["FunctionNames"].items()}
    locations = {k: (files.get(field(v, "file_name_id"), ""), functions.get(field(v, "function_name_id"), ""))
                 for k, v in tables["FileLocations"].items()}
    parents = {k: (field(v, "file_location_id"), field(v, "parent_frame_id")) for k, v in tables["StackFrames"].items()}
    out = {}
    for frame in parents:
        stack, seen, f = [], set(), frame
        while f in parents and f not in seen:
            seen.add(f)
            stack.append(locations.get(parents[f][0], ("", "")))
            f = parents[f][1]
        out[frame] = tuple(stack)
    return out


def array_bytes(shape: str) -> int:
    """Bytes of every array in a shape string (tuples summed): 'bf16[32,512]{1,0}' -> 32768."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        if dtype in DTYPE_BITS:
            total += math.prod(int(d) for d in dims.split(",") if d) * DTYPE_BITS[dtype] // 8
    return total


def _bits(shape: str) -> int:
    m = _ARRAY.search(shape)
    return DTYPE_BITS.get(m.group(1), 0) if m else 0


def _dims(shape: str) -> list[int]:
    m = _ARRAY.search(shape)
    return [int(d) for d in m.group(2).split(",") if d] if m else []


def kernels(module: Module) -> list[tuple[str, Instruction]]:
    """(computation, instruction) for every instruction that launches device work, in program order.

    The entry's instructions and those of the computations its control flow (while, call,
    conditional) runs; a loop body is listed once, whatever its trip count.
    """
    out, seen = [], set()

    def visit(computation: str) -> None:
        if computation in seen:
            return
        seen.add(computation)
        for inst in module.computations.get(computation, ()):
            if inst.opcode in ("while", "call", "conditional", "async-start"):
                for called in inst.calls:
                    visit(called)
            elif inst.opcode not in _NO_KERNEL:
                out.append((computation, inst))

    visit(module.entry)
    return out


def kernel_bytes(module: Module, computation: str, inst: Instruction) -> int:
    """Bytes the kernel reads and writes once each: its operands and its result, by shape (a cuBLAS
    call's workspace, scratch it may not touch, left out).

    A fusion parameter used only by slices, dynamic slices or gathers (as their source, also
    through bitcasts and conversions, which XLA computes only where sliced) is counted for what
    those read: an embedding lookup reads its rows, not the table; a bias add on one third of a
    merged Q/K/V matmul's output reads that third; one layer's weights cast from stacked ones
    read that layer's. A buffer passed several times is read once (the attention kernel takes
    the stacked q, k, v as each of the three); one a Pallas kernel's result aliases is counted
    as the result, which it updates in place (a cuBLAS call's aliased operand is its beta term,
    read).
    """
    fused = module.computations.get(inst.calls[0], ()) if inst.opcode == "fusion" and inst.calls else ()
    params = {i.parameter: i.name for i in fused if i.opcode == "parameter"}
    gemm = _gemm_target(inst.target) or any(_gemm_target(i.target) for i in fused)  # or cuBLAS on slices
    aliased = {int(n) for n in _ALIASED.findall(inst.attributes)} if inst.target == _TRITON else set()
    read, seen = 0, set()
    for n, operand in enumerate(inst.operands):
        if operand in seen or n in aliased:
            continue
        seen.add(operand)
        shape = module.shape_of(computation, operand)
        size = array_bytes(shape)
        readers = _readers(fused, params[n]) if n in params else []
        if readers and all(r.opcode in _READS_PART and r.operands[0] == via for r, via in readers):
            size = min(size, sum(math.prod(_dims(r.shape)) * _bits(shape) // 8 for r, _ in readers))
        read += size
    return read + array_bytes(_WORKSPACE.sub(")", inst.shape) if gemm else inst.shape)


_TRITON = "__gpu$xla.gpu.triton"  # the custom call of a Pallas (Triton) kernel
_ALIASED = re.compile(r"\{[\d,\s]*\}:\s*\((\d+),")  # output_to_operand_aliasing={{}: (8, {})}: operand 8
_WORKSPACE = re.compile(r",\s*s8\[\d+\](\{0\})?\)$")  # a cuBLAS call's scratch: the last array of its result


def _readers(fused: tuple, name: str) -> list[tuple[Instruction, str]]:
    """(instruction, the operand name it reads) for every use of `name` in a fused computation,
    looking through bitcasts and conversions: a slice of a reshaped or cast operand reads only
    its part."""
    out = []
    for user in (i for i in fused if name in i.operands):
        out += _readers(fused, user.name) if user.opcode in ("bitcast", "convert") else [(user, name)]
    return out


# --------------------------------------------------------------------------------------
# FLOPs from shapes
# --------------------------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def _dot_flops(out_shape: str, lhs_shape: str, contracting: list[int]) -> float:
    lhs = _dims(lhs_shape)
    return 2.0 * math.prod(_dims(out_shape)) * math.prod(lhs[d] for d in contracting if d < len(lhs))


def _backend_dims(attributes: str, key: str) -> dict:  # a dimension-numbers object of a backend_config
    m = re.search(rf'"{key}":\s*(\{{[^{{}}]*\}})', attributes)
    return json.loads(m.group(1)) if m else {}


def instruction_flops(module: Module, computation: str, inst: Instruction) -> float:
    """Matmul FLOPs of one instruction, from its shapes: dots (inside fusions too), cuBLAS GEMMs,
    cuDNN attention (forward: its two batched products; backward: five, the scores recomputed),
    our Triton attention (`pmi_jax.fused_attention`: forward two, dK/dV four, dQ three, over the
    whole [L, L] as the formula counts), our feed-forward matmuls (`pmi_jax.fused_feed_forward`).
    Elementwise work is not counted: it is small beside the matmuls and bound by bytes."""
    if inst.opcode == "dot":
        m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", inst.attributes)
        lhs = module.shape_of(computation, inst.operands[0]) if inst.operands else ""
        return _dot_flops(inst.shape, lhs, _int_list(m.group(1)) if m else [])
    if inst.opcode == "custom-call" and _gemm_target(inst.target):
        dims = _backend_dims(inst.attributes, "dot_dimension_numbers")
        lhs = module.shape_of(computation, inst.operands[0]) if inst.operands else ""
        out = _ARRAY.search(inst.shape)
        return _dot_flops(out.group(0) if out else "", lhs,
                          [int(d) for d in dims.get("lhs_contracting_dimensions", [])])
    if inst.opcode == "custom-call" and _attention_target(inst.target):
        # The scores' shape [batch, heads, queries, keys] and the query's size give the head
        # dimension, whatever the layout. JAX 0.11 writes the shape's fields in another order,
        # its dimensions as strings.
        m = re.search(r'"intermediate_tensor_shape":\s*\{[^{}]*?"dimensions":\s*\[([^\]]*)\]', inst.attributes)
        scores = _int_list(m.group(1)) if m else []
        q = _dims(module.shape_of(computation, inst.operands[0])) if inst.operands else []
        if len(scores) != 4 or not q:
            return 0.0
        head_dim = math.prod(q) / math.prod(scores[:3])
        products = 5 if "backward" in inst.target.lower() else 2
        return products * 2.0 * math.prod(scores) * head_dim
    ours = inst.opcode == "custom-call" and re.search(OUR_ATTENTION_KERNELS + r"(forward|dkv|dq)\b", inst.op_name)
    if ours and len(inst.operands) > 2:
        q = _dims(module.shape_of(computation, inst.operands[2]))  # (lengths, streams, q, k, v, ...)
        if len(q) in (4, 5):  # [B, L, H, K], or q, k and v stacked: [B, L, 3, H, K]
            batch, length, heads, head_dim = q[0], q[1], q[-2], q[-1]
            return {"forward": 2, "dkv": 4, "dq": 3}[ours.group(1)] * 2.0 * batch * heads * length ** 2 * head_dim
    if inst.opcode == "custom-call" and OUR_MATMUL_KERNELS in inst.op_name and len(inst.operands) > 1:
        a, b = (_dims(module.shape_of(computation, o)) for o in inst.operands[:2])  # [T, D] and [D, F] or [F, D]
        return 2.0 * math.prod(a) * math.prod(b) / a[-1] if a and b else 0.0
    return sum(instruction_flops(module, called, i) for called in inst.calls
               for i in module.computations.get(called, ()))


def _gemm_target(target: str) -> bool:
    return bool(re.search(r"gemm|cublas|matmul", target, re.I)) and not _attention_target(target)


def _attention_target(target: str) -> bool:
    return bool(re.search(r"fmha|flash|attention|sdpa", target, re.I))


# --------------------------------------------------------------------------------------
# Kernel -> model operation
# --------------------------------------------------------------------------------------

OUR_ATTENTION_KERNELS = "attention_dropout_"  # in the names of pmi_jax.fused_attention's Triton calls
OUR_ELEMENTWISE_KERNELS = "residual_layer_norm_"  # pmi_jax.fused_layer_norm's
OUR_MATMUL_KERNELS = "gelu_feed_forward_"  # pmi_jax.fused_feed_forward's: matmuls with the GELU in their epilogues
# The functions of the model's written-out attention, whose non-matmul kernels count as attention.
WRITTEN_ATTENTION = {"SelfAttention.__call__", "written_attention", "_written_attention_fwd",
                     "_written_attention_bwd", "_probabilities", "_dropped"}
CATEGORIES = ("matmul", "attention", "scatter", "elementwise", "optimizer", "other")


def _contains(module: Module, computation: str, wanted, seen: set) -> bool:
    if computation in seen:
        return False
    seen.add(computation)
    for inst in module.computations.get(computation, ()):
        if wanted(inst) or any(_contains(module, c, wanted, seen) for c in inst.calls):
            return True
    return False


def category(module: Module, inst: Instruction) -> str:
    """The kernel category of one instruction.

    matmul: dots, fusions containing one, cuBLAS GEMMs, our feed-forward kernels; attention:
    cuDNN's fused attention, and the non-matmul work of the written-out attention (softmax,
    dropout, the padding bias), found from the instruction's Python stack or its module path
    (.../attention, not its projections);
    scatter: scatters and fusions containing one; optimizer: what optax's code emitted;
    elementwise: the remaining fusions (LayerNorm, GELU, dropout elsewhere, the loss) and the
    fused residual LayerNorm's kernels; other: copies, collectives, sorts and the rest; control:
    while loops and calls, whose kernels are counted where they are.
    """
    frames = module.stack(inst)
    functions = {f for _, f in frames}
    if inst.opcode in ("while", "conditional", "call"):
        return "control"
    if _attention_target(inst.target) or OUR_ATTENTION_KERNELS in inst.attributes:
        return "attention"
    if OUR_ELEMENTWISE_KERNELS in inst.attributes:
        return "elementwise"
    if OUR_MATMUL_KERNELS in inst.attributes:
        return "matmul"
    if inst.opcode == "scatter" or (inst.opcode == "fusion" and any(
            _contains(module, c, lambda i: i.opcode == "scatter", set()) for c in inst.calls)):
        return "scatter"
    if _is_optimizer(module, inst):
        return "optimizer"
    if (inst.opcode in ("dot", "convolution") or _gemm_target(inst.target) or (inst.opcode == "fusion" and any(
            _contains(module, c, lambda i: i.opcode in ("dot", "convolution") or _gemm_target(i.target), set())
            for c in inst.calls))):
        return "matmul"
    if ((functions & WRITTEN_ATTENTION and "HeadsProjection.__call__" not in functions)
            or re.search(r"/attention(/Dropout_\d+)?$", model_op(inst.op_name)[1])):
        return "attention"
    return "elementwise" if inst.opcode == "fusion" else "other"


def categories(text: str) -> dict[str, str]:
    """HLO instruction name -> kernel category (`category`), for every instruction of the module."""
    module = parse(text)
    return {inst.name: category(module, inst) for insts in module.computations.values() for inst in insts}


def kernel_name(hlo_name: str) -> str:
    """The GPU kernel name XLA gives an HLO instruction: '.' and '-' become '_'."""
    return re.sub(r"[.\-]", "_", hlo_name)


def model_op(op_name: str) -> tuple[str, str]:
    """(direction, module path) of a JAX op_name: 'forward'/'backward' (transposed, from
    autodiff) or '' outside the differentiated model, and the Flax module path without wrappers,
    e.g. ('backward', 'encoder/layer_11/feed_forward/intermediate')."""
    direction = "backward" if "transpose(" in op_name else "forward" if "jvp(" in op_name else ""
    parts = []
    for part in op_name.split("/")[:-1]:  # the last part is the primitive
        if part.startswith(("jit(", "jvp(", "transpose(", "vmap(", "remat", "checkpoint", "pjit(", "eval_jaxpr")) \
                or "<" in part:
            continue
        if parts and (part == parts[-1] or part.startswith(parts[-1] + ".")):
            continue  # flax repeats a layer's name (layer_3/layer_3) and names a method's scope Dropout_0.keep_mask
        parts.append(part)
    return direction, "/".join(parts)


def _is_optimizer(module: Module, inst: Instruction) -> bool:
    """Emitted by optax outside the differentiated loss (optax's loss functions are the model's)."""
    return not model_op(inst.op_name)[0] and any("/optax/" in f for f, _ in module.stack(inst))


def _where(module: Module, inst: Instruction) -> tuple[str, str]:
    """(direction, what): the module path, else the innermost project function, else the primitive."""
    direction, path = model_op(inst.op_name)
    if path:
        return direction, path
    for file, function in module.stack(inst):
        if "/pmi_jax/" in file and not file.endswith("/train.py"):
            return direction, f"{file.rsplit('/', 1)[-1][:-3]}.{function}"
    return direction, inst.op_name.rsplit("/", 1)[-1]


def describe(module: Module, inst: Instruction) -> str:
    """The model operations a kernel computes, from what it fuses, most frequent first:
    'backward encoder/layer_11/feed_forward/intermediate + forward encoder/layer_11/feed_forward'."""
    if _is_optimizer(module, inst):
        return "optimizer (optax)"
    counts: collections.Counter = collections.Counter()

    def visit(i: Instruction, seen: set) -> None:
        if i.opcode not in ("parameter", "constant", "bitcast", "get-tuple-element", "tuple") and i.op_name:
            counts[_where(module, i)] += 1
        for c in i.calls:
            if c not in seen:
                seen.add(c)
                for j in module.computations.get(c, ()):
                    visit(j, seen)

    visit(inst, set())
    ranked = [k for k, _ in counts.most_common()]
    named = [k for k in ranked if "/" in k[1] or "." in k[1]] or ranked
    parts = [f"{d} {w}".strip() for d, w in named[:2]]
    return " + ".join(parts) + (f" (+{len(named) - 2} more)" if len(named) > 2 else "")


# --------------------------------------------------------------------------------------
# The program's figures
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str  # the HLO instruction; the profile's kernel name is kernel_name(name)
    opcode: str
    category: str
    bytes: int  # read + written once, by shape (kernel_bytes)
    flops: float  # matmul FLOPs by shape (instruction_flops)
    shape: str  # the result's shape
    op: str  # the model operations it computes (describe)
    kernel: str = ""  # the GPU kernel it launches: kernel_name of the first identical fusion (reuse)


def program_kernels(text: str) -> list[Kernel]:
    """Every kernel launch of a compiled program with its bytes, FLOPs, category and model operation.

    XLA:GPU compiles identical fusions (the same computation on the same shapes, e.g. one per
    layer) once and names the kernel after the first: a profile's time for that name is the sum
    over all of them, which `kernel` finds.
    """
    module = parse(text)
    first: dict[str, str] = {}
    out = []
    for computation, inst in kernels(module):
        key = _fingerprint(module, inst) if inst.opcode == "fusion" else inst.name
        out.append(Kernel(inst.name, inst.opcode, category(module, inst), kernel_bytes(module, computation, inst),
                          instruction_flops(module, computation, inst), re.sub(r"\{[^}]*\}", "", inst.shape),
                          describe(module, inst), kernel_name(first.setdefault(key, inst.name))))
    return out


_METADATA = re.compile(r",? ?metadata=\{[^}]*\}")
_NAME = re.compile(r"%[\w.\-]+")


def _anonymous(attributes: str) -> str:
    return _METADATA.sub("", _NAME.sub("", attributes))


def _fingerprint(module: Module, inst: Instruction) -> str:
    """The fusion's code without names or metadata: equal for fusions XLA compiles to one kernel."""
    def body(computation: str, seen: frozenset) -> str:
        if computation in seen:
            return ""
        insts = module.computations.get(computation, ())
        index = {i.name: n for n, i in enumerate(insts)}
        lines = []
        for i in insts:
            called = "|".join(body(c, seen | {computation}) for c in i.calls)
            operands = [index.get(o, o) for o in i.operands]
            lines.append(f"{i.shape} {i.opcode} {operands} {i.parameter} {_anonymous(i.attributes)} {called}")
        return ";".join(lines)

    return f"{inst.shape} {_anonymous(inst.attributes)} " + "|".join(body(c, frozenset()) for c in inst.calls)


@dataclasses.dataclass(frozen=True)
class KernelGroup:
    """One GPU kernel (a name in a profile) and the launches that run it in one step."""

    kernel: str
    launches: int
    bytes: int  # over all launches
    flops: float
    category: str
    op: str  # the first launch's operations; layer_* where the launches span layers
    layers: tuple  # the encoder layers the launches belong to


def by_kernel(kernels: list[Kernel]) -> dict[str, KernelGroup]:
    """program_kernels' launches grouped by the kernel they run, largest bytes first."""
    groups: dict[str, list[Kernel]] = collections.defaultdict(list)
    for k in kernels:
        groups[k.kernel or kernel_name(k.name)].append(k)
    out = {}
    for name, members in groups.items():
        layers = sorted({int(m) for k in members for m in re.findall(r"layer_(\d+)", k.op)})
        op = re.sub(r"layer_\d+", "layer_*", members[0].op) if len(layers) > 1 else members[0].op
        out[name] = KernelGroup(name, len(members), sum(k.bytes for k in members), sum(k.flops for k in members),
                                members[0].category, op, tuple(layers))
    return dict(sorted(out.items(), key=lambda kv: -kv[1].bytes))
