"""/v1/models, /tokenize, /detokenize, /health, /version and /metrics."""

import graphllm
from tests.server.conftest import MODEL


def test_models_list_and_retrieve(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL, "alias"]
    card = client.models.retrieve("alias")
    assert card.id == "alias" and card.owned_by == "graphllm"
    assert card.max_model_len == server.engine.state.max_model_len


def test_tokenize_and_detokenize_round_trip(server, pieces_join):
    text = "What is 2 plus 3?" if pieces_join else "w1 w2 w3"  # words the tiny vocabulary knows
    out = server.post("/tokenize", {"model": MODEL, "prompt": text}).json()
    assert out["tokens"] == list(server.engine.tokenizer.encode(text)) and out["count"] == len(out["tokens"])
    assert out["max_model_len"] == server.engine.state.max_model_len
    assert server.post("/detokenize", {"tokens": out["tokens"]}).json() == {"prompt": text}
    chat = server.post("/tokenize", {"messages": [{"role": "user", "content": text}]}).json()
    assert chat["tokens"] == server.engine.apply_chat_template([{"role": "user", "content": text}])
    assert server.post("/tokenize", {"prompt": text, "messages": []}).status_code == 400
    assert server.post("/detokenize", {"tokens": [-1]}).status_code == 400


def test_health_and_version(server):
    assert server.get("/health").status_code == 200
    assert server.get("/version").json() == {"version": graphllm.__version__}


def test_metrics_count_requests_tokens_and_latencies(server, client):
    before = server.metrics()
    client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=4, extra_body={"ignore_eos": True})
    try:
        client.completions.create(model=MODEL, prompt=[5, 6, 7], temperature=-1)
    except Exception:
        pass
    m = server.metrics()

    def grew(name: str) -> float:
        return m.get(name, 0) - before.get(name, 0)
    assert grew('graphllm:http_requests_total{endpoint="/v1/completions",status="200"}') == 1
    assert grew('graphllm:http_requests_total{endpoint="/v1/completions",status="400"}') == 1
    assert grew("graphllm:prompt_tokens_total") == 3 and grew("graphllm:generation_tokens_total") == 4
    assert grew("graphllm:time_to_first_token_seconds_count") == 1
    assert grew("graphllm:inter_token_latency_seconds_count") == 3
    assert m["graphllm:kv_cache_total_blocks"] == server.engine.pool.num_blocks
    for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "kv_cache_free_blocks"):
        assert f"graphllm:{gauge}" in m
