"""pmi_jax.hlo on programs XLA:CPU compiles here: bytes and FLOPs from shapes, and the model
operation of each kernel from a Flax model's name stack (forward and backward)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from pmi_jax import hlo


def _kernels(fn, *args):
    return hlo.program_kernels(jax.jit(fn).lower(*args).compile().as_text())


def test_bytes_and_flops_of_a_matmul_and_its_epilogue():
    x, w = jnp.ones((64, 32), jnp.float32), jnp.ones((32, 16), jnp.float32)
    kernels = _kernels(lambda x, w: jnp.tanh(x @ w) * 2.0 + 1.0, x, w)
    assert sum(k.flops for k in kernels) == 2 * 64 * 32 * 16
    # Whatever XLA fuses, the program reads x and w and writes the [64, 16] result at least once.
    assert sum(k.bytes for k in kernels) >= 4 * (64 * 32 + 32 * 16 + 64 * 16)
    matmul = [k for k in kernels if k.category == "matmul"]
    assert len(matmul) == 1 and matmul[0].flops == 2 * 64 * 32 * 16


def test_an_elementwise_kernel_moves_its_operands_and_result_once():
    x = jnp.ones((1000, 300), jnp.bfloat16)
    (kernel,) = _kernels(lambda x: (x * 3 + 1).astype(jnp.float32), x)
    assert kernel.bytes == 1000 * 300 * (2 + 4) and kernel.flops == 0 and kernel.shape == "f32[1000,300]"


def test_a_lookup_counts_the_rows_it_reads_not_the_table():
    table = jnp.ones((50_000, 128), jnp.float32)
    ids = jnp.arange(64, dtype=jnp.int32)
    kernels = _kernels(lambda t, i: jnp.take(t, i, axis=0) * 2.0, table, ids)
    total = sum(k.bytes for k in kernels)
    rows = 64 * 128 * 4
    assert 2 * rows <= total < 4 * rows + 64 * 4 + 1024  # rows read, result written, ids: not 25.6 MB


_SLICED = """HloModule sliced

%fused_add (param_0: bf16[16384,2304], param_1: bf16[768]) -> bf16[32,512,768] {
  %param_0 = bf16[16384,2304]{1,0} parameter(0)
  %bitcast.1 = bf16[32,512,2304]{2,1,0} bitcast(%param_0)
  %slice.1 = bf16[32,512,768]{2,1,0} slice(%bitcast.1), slice={[0:32], [0:512], [768:1536]}
  %param_1 = bf16[768]{0} parameter(1)
  %broadcast.1 = bf16[32,512,768]{2,1,0} broadcast(%param_1), dimensions={2}
  ROOT %add.1 = bf16[32,512,768]{2,1,0} add(%slice.1, %broadcast.1)
}

ENTRY %main (p0: bf16[16384,2304], p1: bf16[768]) -> bf16[32,512,768] {
  %p0 = bf16[16384,2304]{1,0} parameter(0)
  %p1 = bf16[768]{0} parameter(1)
  ROOT %loop_add_fusion = bf16[32,512,768]{2,1,0} fusion(%p0, %p1), kind=kLoop, calls=%fused_add
}
"""


def test_a_slice_behind_a_bitcast_counts_its_part():
    # XLA:GPU merges the Q, K and V matmuls into one [T, 3D] output; each bias add reads a third.
    third = 32 * 512 * 768 * 2
    (kernel,) = hlo.program_kernels(_SLICED)
    assert kernel.bytes == third + 768 * 2 + third
    whole = _SLICED.replace("%slice.1 = bf16[32,512,768]{2,1,0} slice(%bitcast.1), slice={[0:32], [0:512], [768:1536]}",
                            "%slice.1 = bf16[32,512,768]{2,1,0} negate(%bitcast.1)")
    (kernel,) = hlo.program_kernels(whole)  # shapes no longer agree, but a non-slice use reads it all
    assert kernel.bytes == 3 * third + 768 * 2 + third


@pytest.mark.parametrize("kernel, expected", [("attention_dropout_forward", "attention"),
                                              ("residual_layer_norm_forward", "elementwise"),
                                              ("gelu_feed_forward_up", "matmul"),
                                              ("something_else", "other")])
def test_our_triton_kernels_are_categorised_by_their_names(kernel, expected):
    """The Pallas kernels' Triton calls carry only their pallas_call name (in the op_name)."""
    text = f"""HloModule ours

ENTRY %main (p0: bf16[32,512,768]) -> bf16[32,512,768] {{
  %p0 = bf16[32,512,768]{{2,1,0}} parameter(0)
  ROOT %pallas_call.1 = bf16[32,512,768]{{2,1,0}} custom-call(%p0), custom_call_target="__gpu$xla.gpu.triton", metadata={{op_name="jit(step)/encoder/layer_0/{kernel}/pallas_call"}}
}}
"""
    (found,) = hlo.program_kernels(text)
    assert found.category == expected


@pytest.mark.parametrize("kernel, products", [("forward", 2), ("dkv", 4), ("dq", 3)])
def test_our_attention_kernels_count_the_products_they_compute(kernel, products):
    """pmi_jax.fused_attention's three Triton calls, (lengths, streams, q, k, v, ...) -> ...: each
    product over the whole [L, L] is 2 B H L^2 K FLOPs (B 2, L 128, H 3, K 16)."""
    text = f"""HloModule ours

ENTRY %main (l: s32[2], s: u32[2,3,2], q: bf16[2,128,3,16], k: bf16[2,128,3,16], v: bf16[2,128,3,16]) -> bf16[2,128,3,16] {{
  %l = s32[2]{{0}} parameter(0)
  %s = u32[2,3,2]{{2,1,0}} parameter(1)
  %q = bf16[2,128,3,16]{{3,2,1,0}} parameter(2)
  %k = bf16[2,128,3,16]{{3,2,1,0}} parameter(3)
  %v = bf16[2,128,3,16]{{3,2,1,0}} parameter(4)
  ROOT %pallas_call.1 = bf16[2,128,3,16]{{3,2,1,0}} custom-call(%l, %s, %q, %k, %v), custom_call_target="__gpu$xla.gpu.triton", metadata={{op_name="jit(step)/encoder/layer_0/attention_dropout_{kernel}/pallas_call"}}
}}
"""
    (found,) = hlo.program_kernels(text)
    assert found.category == "attention" and found.flops == products * 2 * 2 * 3 * 128 ** 2 * 16
    # q, k and v stacked ([B, L, 3, H, K], `fused_attention.attention_stacked`), passed three times
    stacked = text.replace("q: bf16[2,128,3,16]", "q: bf16[2,128,3,3,16]").replace(
        "%q = bf16[2,128,3,16]{3,2,1,0}", "%q = bf16[2,128,3,3,16]{4,3,2,1,0}").replace(
        "custom-call(%l, %s, %q, %k, %v)", "custom-call(%l, %s, %q, %q, %q)")
    (found,) = hlo.program_kernels(stacked)
    assert found.flops == products * 2 * 2 * 3 * 128 ** 2 * 16
    assert found.bytes == 2 * (2 * 128 * 9 * 16 + 2 * 128 * 48) + 8 + 48  # the stack read once, the result


@pytest.mark.parametrize("kernel, weights", [("up", "bf16[768,3072]"), ("down", "bf16[3072,768]")])
def test_our_feed_forward_kernels_count_their_matmul(kernel, weights):
    """pmi_jax.fused_feed_forward's two Triton calls, (x or dy [T, D], W1 [D, F] or W2 [F, D], ...):
    2 T D F FLOPs each, whichever way the weights lie."""
    text = f"""HloModule ours

ENTRY %main (x: bf16[4096,768], w: {weights}) -> bf16[4096,3072] {{
  %x = bf16[4096,768]{{1,0}} parameter(0)
  %w = {weights}{{1,0}} parameter(1)
  ROOT %pallas_call.1 = bf16[4096,3072]{{1,0}} custom-call(%x, %w), custom_call_target="__gpu$xla.gpu.triton", metadata={{op_name="jit(step)/encoder/layer_0/feed_forward/gelu_feed_forward_{kernel}/pallas_call"}}
}}
"""
    (found,) = hlo.program_kernels(text)
    assert found.category == "matmul" and found.flops == 2 * 4096 * 768 * 3072


@pytest.mark.parametrize("shape_json", [
    '{"element_type": "BF16", "dimensions": [2, 3, 128, 128], "layout": {"minor_to_major": [3, 2, 1, 0]}}',  # 0.12
    '{"dimensions":["2","3","128","128"],"element_type":"BF16","layout":{"minor_to_major":["3","2","1","0"]}}',  # 0.11
], ids=["jax-0.12", "jax-0.11"])
@pytest.mark.parametrize("target, products", [("fmhaSoftmax", 2), ("fmhaSoftmaxBackward", 5)])
def test_cudnn_attention_counts_its_products_in_either_jaxs_backend_config(shape_json, target, products):
    """The scores' shape in the backend config gives B, H and L; the query's size the head dimension."""
    text = f"""HloModule cudnn

ENTRY %main (q: bf16[2,128,3,16], k: bf16[2,128,3,16], v: bf16[2,128,3,16]) -> bf16[2,3,128,16] {{
  %q = bf16[2,128,3,16]{{3,2,1,0}} parameter(0)
  %k = bf16[2,128,3,16]{{3,2,1,0}} parameter(1)
  %v = bf16[2,128,3,16]{{3,2,1,0}} parameter(2)
  ROOT %fmha.1 = bf16[2,3,128,16]{{3,1,2,0}} custom-call(%q, %k, %v), custom_call_target="__cudnn${target}", backend_config={{"cudnn_fmha_backend_config":{{"intermediate_tensor_shape":{shape_json}}}}}
}}
"""
    (found,) = hlo.program_kernels(text)
    assert found.category == "attention" and found.flops == products * 2 * 2 * 3 * 128 ** 2 * 16


def test_a_cublas_call_moves_its_operands_and_output_not_its_workspace():
    """As the device's own HLO writes a GEMM: the output and a 4 MiB s8 scratch workspace in one tuple."""
    text = """HloModule gemm

ENTRY %main (x: bf16[512,256], w: bf16[256,128]) -> bf16[512,128] {
  %x = bf16[512,256]{1,0} parameter(0)
  %w = bf16[256,128]{1,0} parameter(1)
  %gemm.1 = (bf16[512,128]{1,0}, s8[4194304]{0}) custom-call(%x, %w), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
  ROOT %out = bf16[512,128]{1,0} get-tuple-element(%gemm.1), index=0
}
"""
    (found,) = hlo.program_kernels(text)
    assert found.category == "matmul" and found.bytes == 2 * (512 * 256 + 256 * 128 + 512 * 128)
    assert found.flops == 2 * 512 * 256 * 128


def test_a_cast_or_a_matmul_on_one_layer_of_stacked_weights_reads_that_layer():
    """As an unrolled scan's H100 program writes them (`model.scan_unroll`): a fusion that casts the
    stacked float32 weights and slices one layer reads that layer's float32 entries; a cuBLAS call
    in a dynamic-slice fusion reads its slice of the stacked bf16 weights and not its workspace."""
    text = """HloModule stacked

%fused_cast (param_0: f32[12,256,128]) -> bf16[256,128] {
  %param_0 = f32[12,256,128]{2,1,0} parameter(0)
  %convert.1 = bf16[12,256,128]{2,1,0} convert(%param_0)
  %slice.1 = bf16[1,256,128]{2,1,0} slice(%convert.1), slice={[3:4], [0:256], [0:128]}
  ROOT %bitcast.1 = bf16[256,128]{1,0} bitcast(%slice.1)
}

%dynamic-slice-fusion.1 (p0: bf16[12,256,128], p1: bf16[512,256]) -> (bf16[512,128], s8[33554432]) {
  %p1 = bf16[512,256]{1,0} parameter(1)
  %p0 = bf16[12,256,128]{2,1,0} parameter(0)
  %slice.2 = bf16[1,256,128]{2,1,0} slice(%p0), slice={[3:4], [0:256], [0:128]}
  %bitcast.2 = bf16[256,128]{1,0} bitcast(%slice.2)
  ROOT %gemm.1 = (bf16[512,128]{1,0}, s8[33554432]{0}) custom-call(%p1, %bitcast.2), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
}

ENTRY %main (w: f32[12,256,128], s: bf16[12,256,128], x: bf16[512,256]) -> (bf16[256,128], bf16[512,128]) {
  %w = f32[12,256,128]{2,1,0} parameter(0)
  %s = bf16[12,256,128]{2,1,0} parameter(1)
  %x = bf16[512,256]{1,0} parameter(2)
  %cast = bf16[256,128]{1,0} fusion(%w), kind=kLoop, calls=%fused_cast
  %dsf = (bf16[512,128]{1,0}, s8[33554432]{0}) fusion(%s, %x), kind=kCustom, calls=%dynamic-slice-fusion.1
  %out = bf16[512,128]{1,0} get-tuple-element(%dsf), index=0
  ROOT %t = (bf16[256,128]{1,0}, bf16[512,128]{1,0}) tuple(%cast, %out)
}
"""
    cast, gemm = hlo.program_kernels(text)
    assert cast.bytes == 256 * 128 * (4 + 2)
    assert gemm.category == "matmul" and gemm.bytes == 2 * (256 * 128 + 512 * 256 + 512 * 128)


def test_a_buffer_passed_twice_is_read_once_and_a_kernels_aliased_operand_is_its_result():
    """As the H100 program writes the stacked attention's dK/dV kernel (operand 0 is the stack, passed
    as q, k and v; operand 3 the dQ kernel's output, which it writes dK and dV into), and a cuBLAS
    call with a beta term, whose aliased operand (C) is read."""
    text = """HloModule aliasing

ENTRY %main (s: bf16[64,3,32], d: bf16[64,3,32], x: bf16[64,32], w: bf16[32,32], c: bf16[64,32]) -> bf16[64,3,32] {
  %s = bf16[64,3,32]{2,1,0} parameter(0)
  %d = bf16[64,3,32]{2,1,0} parameter(1)
  %x = bf16[64,32]{1,0} parameter(2)
  %w = bf16[32,32]{1,0} parameter(3)
  %c = bf16[64,32]{1,0} parameter(4)
  %call.1 = bf16[64,3,32]{2,1,0} custom-call(%s, %s, %s, %d), custom_call_target="__gpu$xla.gpu.triton", output_to_operand_aliasing={{}: (3, {})}, metadata={op_name="jit(f)/attention_dropout_dkv/pallas_call"}
  %gemm.1 = (bf16[64,32]{1,0}, s8[4194304]{0}) custom-call(%x, %w, %c), custom_call_target="__cublas$lt$matmul", output_to_operand_aliasing={{0}: (2, {})}, backend_config={"gemm_backend_config":{"beta":1,"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
  ROOT %out = bf16[64,3,32]{2,1,0} get-tuple-element(%call.1), index=0
}
"""
    found = {k.name: k for k in hlo.program_kernels(text)}
    stack = 2 * 64 * 3 * 32
    assert found["call.1"].bytes == 2 * stack  # the stack read once, the result written; operand 3 not read
    assert found["gemm.1"].bytes == 2 * (64 * 32 + 32 * 32 + 64 * 32 + 64 * 32)  # x, w, C read; the output


def test_batched_dot_flops_count_the_batch():
    q, k = jnp.ones((4, 8, 32, 16)), jnp.ones((4, 8, 48, 16))
    kernels = _kernels(lambda q, k: jnp.einsum("bhqd,bhkd->bhqk", q, k), q, k)
    assert sum(k.flops for k in kernels) == 2 * 4 * 8 * 32 * 48 * 16


class _Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(64, name="intermediate")(x)
        return nn.LayerNorm(name="norm")(nn.gelu(h) + x.sum())


def test_kernels_are_named_by_module_and_direction():
    """The op_name of a Flax model's ops carries the module path; autodiff's transposes mark the
    backward pass. Every kernel of a value_and_grad step is placed, and both directions of the
    named modules are found."""
    model = _Block()
    x = jnp.ones((8, 16))
    params = model.init(jax.random.key(0), x)

    def loss(p, x):
        return jnp.mean(model.apply(p, x) ** 2)

    kernels = _kernels(jax.value_and_grad(loss), params, x)
    ops = " | ".join(k.op for k in kernels)
    assert "forward intermediate" in ops and "backward intermediate" in ops, ops
    assert "norm" in ops, ops
    assert all(k.op for k in kernels), [k for k in kernels if not k.op]


@pytest.mark.parametrize("op_name, expected", [
    ("jit(train_step)/jvp(BertForMaskedLM)/encoder/layer_3/layer_3/feed_forward/intermediate/dot_general",
     ("forward", "encoder/layer_3/feed_forward/intermediate")),
    ("jit(train_step)/transpose(jvp(BertForMaskedLM))/encoder/layer_11/layer_11/attention/Dropout_0/mul",
     ("backward", "encoder/layer_11/attention/Dropout_0")),
    ("jit(train_step)/jvp(BertForMaskedLM)/encoder/layer_2/layer_2/attention/Dropout_0/Dropout_0.keep_mask/lt",
     ("forward", "encoder/layer_2/attention/Dropout_0")),  # a method's own scope, under its module
    ("jit(train_step)/jvp(BertForMaskedLM)/encoder/eval_jaxpr/layers/layers/feed_forward/output/dot_general",
     ("forward", "encoder/layers/feed_forward/output")),  # scanned layers: all of them, stacked
    ("jit(train_step)/add", ("", "")),
])
def test_op_names_become_direction_and_module_path(op_name, expected):
    assert hlo.model_op(op_name) == expected


def test_shapes_to_bytes():
    assert hlo.array_bytes("(bf16[32,512]{1,0}, f32[32]{0}, pred[2,3]{1,0}, u8[0]{0})") == 32 * 512 * 2 + 128 + 6
    assert hlo.array_bytes("s32[]") == 4


def test_identical_fusions_are_one_kernel_named_after_the_first():
    """XLA compiles a fusion repeated on the same shapes (one per layer) once: a profile reports
    the kernel under the first launch's name, with the time of all launches."""
    def f(x, w):
        a = jnp.sin(x @ w) * 3.0
        return jnp.sin(a @ w) * 3.0 + jnp.cos(x)

    x = jnp.ones((64, 64))
    kernels = _kernels(f, x, x)
    groups = hlo.by_kernel(kernels)
    matmuls = [g for g in groups.values() if g.category == "matmul"]
    assert len(matmuls) == 1 and matmuls[0].launches == 2 and matmuls[0].flops == 2 * 2 * 64 ** 3
    assert matmuls[0].kernel == hlo.kernel_name(next(k.name for k in kernels if k.category == "matmul"))
    assert sum(g.launches for g in groups.values()) == len(kernels)
    assert sum(g.bytes for g in groups.values()) == sum(k.bytes for k in kernels)
