"""ShardTP: N gloo processes each run their shard of the captured step; every rank's logits equal the
unsharded step's, and every rank's KV cache holds exactly its heads of the unsharded cache. Tiny
random configs in float32, including GQA with fewer KV heads than ranks, q/k/v bias (Qwen2), per-head
q/k norms (Qwen3) and a sliding window (Mistral)."""

import os
import socket
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from graphllm.passes.parallel.shard_tp import ShardTP, check_divisible, local_kv_heads

pytestmark = pytest.mark.slow  # spawns processes


def run_rank(rank: int, world_size: int, port: int, folders: dict[str, str], results: dict) -> None:
    """One rank: every model in folders (arch -> folder) in turn, in one process group (a spawn and a group cost
    a few seconds of CI each)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        for arch, folder in folders.items():
            try:
                results[(arch, rank)] = check_rank(rank, world_size, folder)
            except Exception as e:
                raise AssertionError(f"{arch} at N = {world_size}, rank {rank}") from e
    finally:
        dist.destroy_process_group()
    # leave without the interpreter's teardown, where a C++ thread still joinable (gloo's) can abort the rank
    # ("terminate called without an active exception", SIGABRT: mistral-4 once in CI); as spawned_worker does
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def check_rank(rank: int, world_size: int, folder: str) -> dict:
    """This rank's shard of the model's captured step computes the unsharded step's logits and its heads of the
    unsharded KV cache; returns the pass's counts."""
    from graphllm.ir import capture
    from graphllm.models import load_model
    from tests.passes.harness import clone_inputs, copy_graph, on_reference, random_step_inputs
    model, config = load_model(folder)
    full = capture(model, config, torch.float32, torch.device("cpu"))
    shard = copy_graph(full)
    tp = ShardTP(rank, world_size, dist.group.WORLD.group_name, config.num_attention_heads,
                 config.num_key_value_heads, config.head_dim, config.intermediate_size)
    counts = tp(shard)
    inputs = random_step_inputs(config, seed=7)
    full_in = clone_inputs(inputs)
    local_caches = [tp.local_kv(c) for c in inputs[-1]]
    with on_reference():
        expected = full(*full_in)
        got = shard(*inputs[:-1], local_caches)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    for mine, whole in zip(local_caches, full_in[-1]):
        torch.testing.assert_close(mine, tp.local_kv(whole), atol=1e-5, rtol=1e-5)  # a narrower matmul
    assert got.shape == expected.shape  # the full vocabulary on every rank
    lm_head = shard.weights["model.lm_head.weight"]
    assert lm_head.shape[0] == -(-config.vocab_size // world_size)  # rank r's rows only
    assert [c.shape[3] for c in shard.example_inputs[-1]] == [local_kv_heads(config.num_key_value_heads,
                                                                              world_size)] * 2
    return counts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("world_size, archs", [
    (2, ("llama", "qwen2", "qwen3", "mixtral", "qwen3_moe-mixed")),
    (4, ("llama", "mistral", "llama-vocab-126"))], ids=["N2", "N4"])
def test_every_rank_computes_the_unsharded_step(world_size, archs, tiny_model_dir, tmp_path):
    """tiny configs: 4 query heads, 2 KV heads (N = 4 replicates each KV head on two ranks); qwen2 ties its
    embedding to lm_head; a vocabulary of 126 pads to 128 at N = 4 (the last rank holds two zero rows)."""
    results = mp.Manager().dict()
    folders = {}
    for arch in archs:
        if arch == "llama-vocab-126":
            import transformers
            from tests.tiny_models import COMMON, save_model_folder
            torch.manual_seed(0)
            hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**COMMON, "vocab_size": 126})).eval()
            folders[arch] = str(save_model_folder(hf, tmp_path / "v126"))
        else:
            folders[arch] = str(tiny_model_dir(arch)[0])
    mp.spawn(run_rank, args=(world_size, free_port(), folders, results), nprocs=world_size, join=True)
    assert sorted(results) == sorted((arch, rank) for arch in archs for rank in range(world_size))
    for arch in archs:
        # 2 layers; vocab: the embedding and lm_head (one all-reduce more: the embedding's rows); an MoE layer: q/k/v
        # and o_proj split, its experts split by their intermediate size (one all-reduce), its router whole
        sparse = {"mixtral": 2, "qwen3_moe-mixed": 1}.get(arch, 0)  # qwen3_moe-mixed: layer 0 is dense
        dense = 2 - sparse
        assert results[(arch, 0)] == {"column": 5 * dense + 3 * sparse, "row": 2 * dense + sparse,
                                      "experts": sparse, "all_reduce": 2 * dense + 2 * sparse + 1, "vocab": 2}, arch


def test_shapes_that_do_not_divide_are_refused_with_the_numbers():
    with pytest.raises(ValueError, match=r"size 3 does not divide 4 attention heads, 2 KV heads \(fewer than the "
                                         r"ranks: the ranks must be a multiple\), intermediate size 128"):
        check_divisible(3, 4, 2, 128)
    with pytest.raises(ValueError, match="size 2 does not divide 3 KV heads$"):
        check_divisible(2, 6, 3, 64)  # 6 query heads and 64 divide: only the KV heads fail
    check_divisible(4, 8, 2, 64)  # 2 KV heads, each on two of the 4 ranks
    assert local_kv_heads(2, 4) == 1 and local_kv_heads(8, 2) == 4


def test_check_shapes_names_an_inconsistent_graph():
    """The FakeTensor check ShardTP ends with: a weight sliced to a width the next op cannot take fails at
    compile time, with the shapes, not in a rank's first step."""
    from graphllm.passes.parallel.shard_tp import check_shapes
    from tests.passes.harness import tiny_step_graph
    graph, _ = tiny_step_graph("llama")
    check_shapes(graph)  # the unsharded graph is consistent
    owner = graph.gm.get_submodule("model.model.layers.0.self_attn.o_proj")
    owner.register_parameter("weight", torch.nn.Parameter(owner.weight.detach()[:, :40], requires_grad=False))
    with pytest.raises(ValueError, match="does not type-check with rank shapes"):
        check_shapes(graph)


def test_moe_is_refused_in_eager_tensor_parallelism_and_when_its_experts_do_not_divide():
    from graphllm.bench.presets import PRESETS
    from graphllm.models.registry import resolve_architecture
    _, config = resolve_architecture(PRESETS["qwen3-30b-a3b"])  # moe_intermediate_size 768
    ShardTP.for_model(config, 0, 2, "0")  # a compiled artifact shards the experts
    with pytest.raises(ValueError, match="eager tensor parallelism does not read a rank's slices of its experts"):
        ShardTP.for_model(config, 0, 2, "0", eager=True)
    with pytest.raises(ValueError, match="moe_intermediate_size 768 does not divide by 5"):
        ShardTP.for_model(config, 0, 5, "0")


def test_families_it_cannot_split_yet_are_refused_by_name():
    from graphllm.bench.presets import PRESETS
    from graphllm.models.registry import resolve_architecture
    _, config = resolve_architecture(PRESETS["olmo-2-7b"])
    with pytest.raises(ValueError, match="Olmo2ForCausalLM normalises q and k over all heads"):
        ShardTP.for_model(config, 0, 2, "0")
    _, config = resolve_architecture(PRESETS["phi-3-mini"])
    with pytest.raises(ValueError, match="Phi3ForCausalLM keeps q/k/v and gate/up fused"):
        ShardTP.for_model(config, 0, 2, "0")
