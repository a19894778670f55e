"""compile_model and its parts: the cache key (what invalidates an artifact), weights stored once
per tied tensor, phase timings, one graph diff per pass, the manifest, and the atomic write.

One compile of its own (the `fresh` fixture, about 12 s on 2 cores), small; the rest needs none."""

import contextlib
import dataclasses
import io
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from graphllm import Engine, SamplingParams
from graphllm.compiler import artifact as A
from graphllm.compiler import pipeline
from graphllm.compiler.artifact import MANIFEST, WEIGHTS, quick_fingerprint
from graphllm.compiler.loading import load_weights
from graphllm.compiler.pipeline import PHASES, GraphDumps, PhaseTimer, cache_key, compile_model, save_weights
from graphllm.config import CompileConfig
from graphllm.ir.graph import diff_graphs
from graphllm.passes.manager import PassManager, PassReport

CPU = torch.device("cpu")
SMALL = CompileConfig(dtype="float32", max_num_seqs=4, max_num_batched_tokens=64)


@pytest.fixture
def model_copy(tiny_model_dir, tmp_path):
    """A private copy of the tiny Llama folder, safe to edit."""
    return shutil.copytree(tiny_model_dir("llama")[0], tmp_path / "model")


# -- cache_key ------------------------------------------------------------------------------


def test_cache_key_is_stable_and_follows_the_folders_content_not_its_path(tiny_model_dir, model_copy):
    path, _ = tiny_model_dir("llama")
    key = cache_key(path, SMALL, CPU)
    assert cache_key(path, CompileConfig(dtype="float32", max_num_seqs=4, max_num_batched_tokens=64), CPU) == key
    assert cache_key(model_copy, SMALL, CPU) == key


CHANGES = dict(dtype="bfloat16", max_num_seqs=8, max_model_len=128, max_num_batched_tokens=128, block_size=32,
               buckets=(1, 4), fuse_qkv=False, fuse_gate_up=False, fuse_silu_mul=False, fuse_add_rmsnorm=False,
               skinny_linear=False, linear_prologue=False, linear_epilogue=True, row_sumsq=True, shared_norm_prologue=True,
               fuse_moe_router=True,
               fp8_linear_prologue=True, int4_mma=True,
               fuse_rope_attention=False,
               lowering="inductor", inductor_pdl=False, persistent_norms=False, quantization="int4", quantization_group_size=64, quantize_lm_head=True,
               tensor_parallel_size=2)
# refused without int4 (config.check_quantization): their case sets it too
NEEDS = {"quantization_group_size": dict(quantization="int4"), "quantize_lm_head": dict(quantization="int4")}


def test_cache_key_changes_with_every_compile_config_field(tiny_model_dir):
    """skinny_linear and linear_prologue do nothing on CPU graphs, yet still make another artifact."""
    path, _ = tiny_model_dir("llama")
    assert CHANGES.keys() == {f.name for f in dataclasses.fields(CompileConfig)}  # a new field gets a case here
    keys = [cache_key(path, dataclasses.replace(SMALL, **NEEDS.get(name, {}), **{name: value}), CPU)
            for name, value in CHANGES.items()]
    assert len(set(keys) | {cache_key(path, SMALL, CPU)}) == len(CHANGES) + 1


def test_cache_key_changes_when_a_weight_file_changes(model_copy):
    key = cache_key(model_copy, SMALL, CPU)
    file = model_copy / "model.safetensors"
    weights = load_file(file)
    name = next(iter(weights))
    weights[name][0, 0] += 1
    save_file(weights, file, metadata={"format": "pt"})
    assert cache_key(model_copy, SMALL, CPU) != key


def test_cache_key_changes_when_the_model_config_changes(model_copy):
    key = cache_key(model_copy, SMALL, CPU)
    config = json.loads((model_copy / "config.json").read_text())
    config["rms_norm_eps"] *= 10
    (model_copy / "config.json").write_text(json.dumps(config))
    assert cache_key(model_copy, SMALL, CPU) != key


# -- save_weights ---------------------------------------------------------------------------


def weights_manifest(art, aliases: dict) -> dict:
    return {"files": {WEIGHTS: A.file_record(art / WEIGHTS)}, "weight_aliases": aliases}


def test_tied_weights_are_stored_once_and_come_back_as_aliases(tmp_path):
    embed, norm = torch.randn(8, 4), torch.randn(4)
    weights = {"embed": embed, "lm_head": embed, "norm": norm, "norm_copy": norm.clone(),
               "transposed": torch.randn(4, 6).t()}  # not contiguous: stored by value
    aliases = save_weights(weights, tmp_path / WEIGHTS)
    assert aliases == {"lm_head": "embed"}  # an equal tensor of its own is not an alias
    assert set(load_file(tmp_path / WEIGHTS)) == {"embed", "norm", "norm_copy", "transposed"}
    loaded = load_weights(tmp_path, weights_manifest(tmp_path, aliases), CPU)
    assert loaded.keys() == weights.keys()
    for name, tensor in weights.items():
        assert torch.equal(loaded[name], tensor), name


def test_a_transposed_view_of_a_square_weight_is_not_an_alias(tmp_path):
    w = torch.randn(4, 4)
    aliases = save_weights({"w": w, "w_t": w.t()}, tmp_path / WEIGHTS)
    assert torch.equal(load_weights(tmp_path, weights_manifest(tmp_path, aliases), CPU)["w_t"], w.t())


# -- PhaseTimer, GraphDumps -----------------------------------------------------------------


def test_phase_timer_records_each_phase_and_the_summary_lists_them():
    timer = PhaseTimer(show=False)
    for name in PHASES[:3]:
        with timer.phase(name):
            torch.ones(1)  # some work
    assert list(timer.seconds) == list(PHASES[:3]) and all(s >= 0 for s in timer.seconds.values())
    lines = timer.summary().splitlines()
    assert lines[0] == "phase timings:"
    assert [line.split()[0] for line in lines[1:]] == [*PHASES[:3], "total"]
    assert float(lines[-1].split()[1]) == pytest.approx(sum(timer.seconds.values()), abs=0.01)


def test_phase_timer_total_is_the_sum_of_the_phases():
    timer = PhaseTimer(show=False)
    timer.seconds.update({"load": 1.25, "lower": 2.5})
    assert timer.summary().splitlines()[1:] == ["  load         1.25 s", "  lower        2.50 s",
                                                "  total        3.75 s"]


def report(name: str) -> PassReport:
    return PassReport(name, "uuid", 3, 2, {}, 0.0)


def test_graph_dumps_write_one_numbered_diff_per_pass_in_order(tmp_path):
    dumps = GraphDumps()
    graphs = ["a = x\nb = a\nc = b", "a = x\nc = a", "a = x\nc = a", "c = x"]
    for name, before, after in zip(["noops", "fuse", "noops"], graphs, graphs[1:]):
        dumps.on_pass(report(name), before, after)
    dumps.write(tmp_path, before=(graphs[0], "code before"), after=(graphs[-1], "code after"))
    files = sorted(p.name for p in (tmp_path / "graphs").iterdir())
    assert files == ["01_noops.diff", "02_fuse.diff", "03_noops.diff", "after.py", "after.txt",
                     "before.py", "before.txt"]
    for i, name in enumerate(files[:3]):
        assert (tmp_path / "graphs" / name).read_text() == diff_graphs(graphs[i], graphs[i + 1])
    assert (tmp_path / "graphs" / "02_fuse.diff").read_text() == ""  # the pass changed nothing
    assert "-b = a" in (tmp_path / "graphs" / "01_noops.diff").read_text()
    assert (tmp_path / "graphs" / "before.txt").read_text() == graphs[0]
    assert (tmp_path / "graphs" / "after.py").read_text() == "code after"


# -- compile_model --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fresh(tiny_model_dir, tmp_path_factory):
    """This file's one compile (SMALL), into an output directory that holds an older artifact's file,
    next to the `.partial` directory of a compile that died half way: (parent, out, manifest, stderr)."""
    path, _ = tiny_model_dir("llama")
    parent = tmp_path_factory.mktemp("compile")
    out = parent / "art"
    out.mkdir()
    (out / MANIFEST).write_text("{}")  # an artifact (check_output refuses to replace anything else)
    (out / "stale.txt").write_text("from an older compile")
    (parent / "art.partial").mkdir()
    (parent / "art.partial" / "junk").write_text("a compile that died half way")
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed):  # the progress bar and timings go to stderr
        manifest = compile_model(path, out, SMALL, device="cpu", show_progress=True)
    return parent, out, manifest, printed.getvalue()


def test_compile_replaces_the_output_directory_atomically(fresh):
    parent, out, manifest, _ = fresh
    assert sorted(p.name for p in parent.iterdir()) == ["art"]  # no .partial left behind
    assert not (out / "stale.txt").exists()
    written = json.loads((out / MANIFEST).read_text())
    assert {k: v for k, v in written.items() if k not in ("schema_version", "files")} == manifest
    assert set(written["files"]) == {p.relative_to(out).as_posix() for p in out.rglob("*")
                                     if p.is_file() and p.name != MANIFEST}


def test_manifest_records_the_key_passes_buckets_and_dtype(tiny_model_dir, fresh):
    path, _ = tiny_model_dir("llama")
    _, out, manifest, printed = fresh
    assert manifest["cache_key"] == cache_key(path, SMALL, CPU)
    expected = PassManager(SMALL).passes
    assert [(p["name"], p["uuid"]) for p in manifest["passes"]] == [(p.name, p.uuid()) for p in expected]
    assert manifest["compile"]["buckets"] == [1, 2, 4] and manifest["compile"]["max_num_seqs"] == 4
    assert manifest["compile"]["dtype"] == "float32" and manifest["compile"]["fuse_qkv"] is True
    assert manifest["model"]["architecture"] == "LlamaForCausalLM"
    weights = path / "model.safetensors"
    assert manifest["model"]["weight_fingerprints"] == {weights.name: quick_fingerprint(weights)}
    assert list(manifest["timings"]) == list(PHASES)
    assert "\nphase timings:\n" in printed and all(f"  {phase} " in printed for phase in PHASES)
    diffs = sorted(p.name for p in (out / "graphs").glob("*.diff"))
    assert diffs == [f"{i:02d}_{p.name}.diff" for i, p in enumerate(expected, 1)]
    fused = (out / "graphs" / f"{[p.name for p in expected].index('fuse_qkv') + 1:02d}_fuse_qkv.diff").read_text()
    lines = fused.splitlines()
    assert sum(line.startswith("-%") and "self_attn.q_proj.weight]" in line for line in lines) == 2  # 2 layers
    assert sum(line.startswith("+%") and "self_attn.qkv_proj.weight]" in line for line in lines) == 2


def test_the_compiled_artifact_gives_the_eager_tokens(tiny_model_dir, fresh):
    path, _ = tiny_model_dir("llama")
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompt = [1, 5, 9, 17]
    compiled = Engine.load(fresh[1]).generate([prompt], greedy)[0].outputs[0].token_ids
    assert compiled == Engine.from_pretrained(path).generate([prompt], greedy)[0].outputs[0].token_ids


def test_a_failing_compile_leaves_the_previous_artifact_in_place(model_copy, fresh, tmp_path):
    out = shutil.copytree(fresh[1], tmp_path / "art")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    config = json.loads((model_copy / "config.json").read_text())
    (model_copy / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchForCausalLM"]}))
    with pytest.raises(ValueError, match="unknown architecture"):
        compile_model(model_copy, out, SMALL, device="cpu", show_progress=False)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art", "model"]  # no staging directory beside it


def test_a_compile_failing_after_it_began_writing_removes_what_it_wrote(tiny_model_dir, fresh, tmp_path, monkeypatch):
    path, _ = tiny_model_dir("llama")
    out = shutil.copytree(fresh[1], tmp_path / "art")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))

    def failing_lowering(graph, package):  # the CPU's lowering (AOTInductor), after writing part of its file
        package.write_bytes(b"half a package")
        raise RuntimeError("the lowering failed")

    monkeypatch.setattr(pipeline, "lower", failing_lowering)
    with pytest.raises(RuntimeError, match="the lowering failed"):
        compile_model(path, out, SMALL, device="cpu", show_progress=False)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]


def test_every_module_the_graph_is_traced_from_is_in_the_cache_key():
    """Editing a file whose code the captured graph comes from must change the key: every graphllm
    file named in a node's stack trace is one of the hashed COMPILER_MODULES."""
    import re

    from graphllm.compiler.pipeline import COMPILER_MODULES
    from tests.passes.harness import tiny_step_graph
    graph, _ = tiny_step_graph("qwen3")
    traced = set()
    for node in graph.graph.nodes:
        for path in re.findall(r'File "([^"]+)"', node.meta.get("stack_trace") or ""):
            if "/graphllm/" in path and "/tests/" not in path:
                traced.add("graphllm." + path.rsplit("/graphllm/", 1)[1].removesuffix(".py").replace("/", "."))
    assert {"graphllm.models.llama", "graphllm.models.layers"} <= traced  # the walk finds the sources
    assert traced <= set(COMPILER_MODULES)


@pytest.mark.parametrize("field, value", [("max_num_seqs", 0), ("max_model_len", -5), ("max_model_len", 1),
                                          ("max_num_batched_tokens", 0), ("block_size", 0)])
def test_compile_limits_are_checked_as_the_engines_are(field, value):
    """Regression (s35's fuzzing): --max-num-seqs 0 wrote an artifact of no decode buckets, --max-model-len -5 one
    that loaded and ran; EngineConfig refused both."""
    with pytest.raises(ValueError, match=field):
        CompileConfig(**{field: value})
