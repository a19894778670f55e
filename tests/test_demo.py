"""The built-in demo model: an ordinary Hugging Face folder that answers held-out arithmetic
questions correctly through the Engine (greedy), and is what Engine uses when given no model."""

import pytest

from graphllm import Engine, SamplingParams
from graphllm.demo import DEMO_MODEL_DIR, chat_messages, extract_answer, held_out_questions


@pytest.fixture(scope="module")
def engine():
    return Engine.from_pretrained()  # no model given: the demo model


def test_engine_defaults_to_the_demo_model(engine):
    assert engine.state.model_path == DEMO_MODEL_DIR


def test_demo_folder_is_small_and_loads_in_transformers():
    import transformers
    size = sum(f.stat().st_size for f in DEMO_MODEL_DIR.iterdir() if f.is_file())
    assert size <= 20 * 2**20
    tokenizer = transformers.AutoTokenizer.from_pretrained(DEMO_MODEL_DIR)
    model = transformers.AutoModelForCausalLM.from_pretrained(DEMO_MODEL_DIR)
    assert model.config.architectures == ["LlamaForCausalLM"] and tokenizer.chat_template


def test_held_out_accuracy_at_least_95_percent(engine):
    questions = held_out_questions(500)
    prompts = [engine.apply_chat_template(chat_messages(q)) for q, _ in questions]
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=40))
    correct = sum(extract_answer(o.outputs[0].text) == answer for o, (_, answer) in zip(outs, questions))
    assert all(o.outputs[0].finish_reason == "stop" for o in outs[:50])  # ends its turn by itself
    assert correct / len(questions) >= 0.95, f"{correct}/{len(questions)} correct"
    assert engine.pool.num_free_blocks == engine.pool.num_blocks
