"""With an API key every route but /health needs it (/metrics too, unless --metrics-public); the
scheme is case-insensitive (RFC 7235) and the key compared in constant time."""

import httpx2 as httpx
import pytest

from tests.server.conftest import API_KEY, MODEL, start
from tests.server.test_errors import check_shape

ROUTES = [("POST", "/v1/completions", {"model": MODEL, "prompt": [1, 2], "max_tokens": 1}),
          ("POST", "/v1/chat/completions", {"model": MODEL, "max_tokens": 1,
                                            "messages": [{"role": "user", "content": "hi"}]}),
          ("GET", "/v1/models", None), ("POST", "/tokenize", {"prompt": "hi"}),
          ("POST", "/detokenize", {"tokens": [1, 2]}), ("GET", "/metrics", None), ("GET", "/version", None)]


def call(server, method: str, path: str, body, authorization: str | None) -> httpx.Response:
    headers = {"Authorization": authorization} if authorization is not None else {}
    return httpx.request(method, server.base_url + path, json=body, headers=headers, timeout=30)


@pytest.mark.parametrize("method, path, body", ROUTES)
def test_every_route_but_health_needs_the_key(server, method, path, body):
    check_shape(call(server, method, path, body, None), 401, code="invalid_api_key")
    check_shape(call(server, method, path, body, "Bearer wrong"), 401, code="invalid_api_key")
    assert call(server, method, path, body, f"Bearer {API_KEY}").status_code == 200
    assert call(server, "GET", "/health", None, None).status_code == 200


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer", "bEaReR"])
def test_the_scheme_is_case_insensitive(server, scheme):
    assert call(server, "GET", "/v1/models", None, f"{scheme} {API_KEY}").status_code == 200


def test_other_schemes_and_a_key_prefix_are_refused(server):
    for authorization in (f"Basic {API_KEY}", API_KEY, f"Bearer {API_KEY[:-1]}", f"Bearer {API_KEY}x", "Bearer"):
        check_shape(call(server, "GET", "/v1/models", None, authorization), 401, code="invalid_api_key")


def test_metrics_public_opens_metrics_only(request, engine):
    public = start(request, engine, metrics_public=True)
    assert call(public, "GET", "/metrics", None, None).status_code == 200
    assert call(public, "GET", "/v1/models", None, None).status_code == 401


def test_models_root_is_the_model_given_not_a_cache_path(request, engine):
    models = call(start(request, engine, model_root="meta-llama/x"), "GET", "/v1/models", None, f"Bearer {API_KEY}")
    assert {m["root"] for m in models.json()["data"]} == {"meta-llama/x"}
    default = call(start(request, engine), "GET", "/v1/models", None, f"Bearer {API_KEY}").json()["data"]
    assert [m["root"] for m in default] == [m["id"] for m in default]  # no path of this machine
