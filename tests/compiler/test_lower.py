"""kernel_table: which graph nodes, ATen ops and model source lines `graphllm inspect` pairs with
each kernel call of an AOTInductor C++ wrapper, on a hand-written wrapper and on a real artifact
(the shared `compiled_dir("llama")`, compiled once per test cache)."""

from graphllm.compiler.inspection import kernels_with_sources
from graphllm.compiler.lower import kernel_table

# The shape of Inductor's CPU wrapper: generated kernels (cpp_fused_*) get no comment; the
# comment before an extern call names its nodes and those of the unrealized inputs it consumed.
WRAPPER = """\
void AOTInductorModel::run_impl(
    AtenTensorHandle* input_handles) {
    cpp_fused_embedding_rms_norm_0((const int64_t*)(arg0.data_ptr()), (float*)(buf1.data_ptr()));
    // Topologically Sorted Source Nodes: [embedding, rms_norm, linear], Original ATen: [aten.embedding, graphllm.rms_norm, aten.t, aten.mm]
    static constexpr int64_t int_array_8[] = {64L, 128L};
    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_cpu_mm_out(buf2, buf1, qkv_weight));
    // Topologically Sorted Source Nodes: [add_rms_norm, linear_2], Original ATen: [graphllm.add_rms_norm, aten.t, aten.mm]
    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_cpu_mm_out(buf18, buf17, gate_up_weight));
    buf17.reset();
    cpp_fused_silu_and_mul_3((const float*)(buf18.data_ptr()), (float*)(buf19.data_ptr()), s72);
    buf18.reset();
    // Topologically Sorted Source Nodes: [silu_and_mul, linear_3, add_rms_norm_1], Original ATen: [graphllm.silu_and_mul, aten.t, graphllm.add_rms_norm]
    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_cpu_addmm_out(buf20, buf15, buf19, down_weight, 1L, 1L));
    cpp_fused_add_rms_norm_index_4((const float*)(buf20.data_ptr()), (float*)(buf42.data_ptr()), s72);
}
"""


def test_kernel_table_pairs_a_cpu_kernel_with_the_comment_after_it_not_the_one_before():
    groups = kernel_table(WRAPPER)
    assert [g["calls"] for g in groups] == [
        ["cpp_fused_embedding_rms_norm_0", "aoti_torch_cpu_mm_out"],
        ["aoti_torch_cpu_mm_out"],
        ["cpp_fused_silu_and_mul_3", "aoti_torch_cpu_addmm_out"],
        ["cpp_fused_add_rms_norm_index_4"]]
    assert groups[0]["aten"] == ["aten.embedding", "graphllm.rms_norm", "aten.t", "aten.mm"]
    assert groups[1]["nodes"] == ["add_rms_norm", "linear_2"]
    assert groups[2]["nodes"] == ["silu_and_mul", "linear_3", "add_rms_norm_1"]
    assert groups[2]["aten"] == ["graphllm.silu_and_mul", "aten.t", "graphllm.add_rms_norm"]
    assert groups[3]["nodes"] == [] and groups[3]["aten"] == []  # after the last comment


def test_kernel_table_pairs_a_cpu_kernel_with_its_own_ops_in_a_real_artifact(compiled_dir):
    kernels = kernels_with_sources(compiled_dir("llama"))
    generated = [(call, k) for k in kernels for call in k["calls"] if call.startswith("cpp_fused_")]
    silu = [k for call, k in generated if "silu" in call]
    rms = [k for call, k in generated if "rms_norm" in call]
    assert len(silu) == 2 and len(rms) >= 3  # one silu_and_mul per layer; a norm before every linear
    for k in silu:
        assert "graphllm.silu_and_mul" in k["aten"]
        assert any(m.endswith(".mlp") for m in k["modules"])
        assert any("F.silu(" in line for line in k["sources"])
    for k in rms:
        assert {"graphllm.rms_norm", "graphllm.add_rms_norm"} & set(k["aten"])
        assert any(m.endswith("layernorm") or m.endswith("model.norm") for m in k["modules"])
