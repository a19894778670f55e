import os
import tempfile

# One Inductor cache and one artifact cache for the whole run: compiles are the slow part.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), "graphllm-tests-inductor"))
os.environ.setdefault("GRAPHLLM_CACHE_DIR", os.path.join(tempfile.gettempdir(), "graphllm-tests-cache"))

import pytest  # noqa: E402

from tests.tiny_models import CONFIGS, make_hf_model, save_model_folder  # noqa: E402

ARCHS = list(CONFIGS)


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
    from graphllm.compiler.cache import compiled_artifact
    from graphllm.config import EngineConfig
    cache = {}

    def get(arch: str):
        if arch not in cache:
            path, _ = tiny_model_dir(arch)
            config = EngineConfig(model=str(path), dtype="float32")  # float32 on GPU too: exact oracle
            cache[arch] = compiled_artifact(config, path, show_progress=False)
        return cache[arch]

    return get
