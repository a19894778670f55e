import pytest

from tests.tiny_models import CONFIGS, make_hf_model, save_model_folder


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


ARCHS = list(CONFIGS)
