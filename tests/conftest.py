import os
import tempfile

# One Inductor cache and one artifact cache for the whole run: compiles are the slow part. The artifact
# cache reaches in-process engines as EngineConfig(cache_dir=TEST_CACHE_DIR) and the `graphllm`
# subprocesses of the CLI tests through GRAPHLLM_CACHE_DIR, which their CLI entry reads.
TEST_CACHE_DIR = os.environ.setdefault("GRAPHLLM_CACHE_DIR", os.path.join(tempfile.gettempdir(), "graphllm-tests-cache"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), "graphllm-tests-inductor"))

import pytest  # noqa: E402

from graphllm.config import EngineConfig  # noqa: E402

from tests.tiny_models import CONFIGS, make_hf_model, save_model_folder  # noqa: E402

ARCHS = list(CONFIGS)


def pytest_addoption(parser):
    parser.addoption("--no-fuse-rope-attention", action="store_true",
                     help="compile the GPU teacher tests' artifacts without the fuse_rope_attention pass")


@pytest.fixture(scope="session")
def fuse_rope_attention(request) -> bool:
    """The GPU teacher tests compile with the rotary + KV-write fusion (the default), unless
    --no-fuse-rope-attention (the A/B of gpu_run.sh's rope-teacher stage)."""
    return not request.config.getoption("--no-fuse-rope-attention")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """arch -> (folder, the transformers model it was saved from)."""
    cache = {}

    def get(arch: str):
        if arch not in cache:
            model = make_hf_model(arch)
            cache[arch] = (save_model_folder(model, tmp_path_factory.mktemp(arch)), model)
        return cache[arch]

    return get


@pytest.fixture(scope="session")
def compiled_dir(tiny_model_dir):
    """arch -> the artifact of its tiny model under default compile settings (compiled once)."""
    cache = {}

    def get(arch: str):
        if arch not in cache:
            path, _ = tiny_model_dir(arch)
            config = EngineConfig(model=str(path), dtype="float32")  # float32 on GPU too: exact oracle
            cache[arch] = compile_cached(config, path)
        return cache[arch]

    return get


def compile_cached(config, model_dir):
    """The artifact that compile=True would build for config, in the tests' shared cache."""
    from dataclasses import replace

    from graphllm.compiler.cache import compiled_artifact
    from graphllm.device import resolve_device
    config = replace(config, cache_dir=TEST_CACHE_DIR)
    return compiled_artifact(model_dir, config.compile_config(), resolve_device(config.device), config.artifact_cache,
                             show_progress=False)
