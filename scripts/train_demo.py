"""Train the demo model shipped in graphllm/demo_model/ (see graphllm/demo.py for the task).

Builds a byte-level BPE tokenizer with single-digit tokens, a chat template (system / user /
assistant / tool roles, hermes-style tools and tool calls), trains a tiny LlamaForCausalLM on
generated chats with the loss on assistant tokens only, saves a Hugging Face folder and prints
greedy exact-answer accuracy on the held-out questions.

  python scripts/train_demo.py --steps 2000 --out graphllm/demo_model
"""

import argparse
import random
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AddedToken,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graphllm.demo import (  # noqa: E402
    DEMO_MODEL_DIR,
    chat_messages,
    extract_answer,
    held_out_questions,
    make_problem,
)

SEED = 0
VOCAB_SIZE = 512  # an upper bound: the generated corpus saturates below it
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
TOOL_CALL_TOKENS = ["<tool_call>", "</tool_call>"]  # single tokens, but kept on decode
SYSTEM_PROMPTS = [None, None, "You are a helpful assistant.", "You are a calculator. Answer briefly."]

# <|bos|><|system|>S<|end|><|user|>Q<|end|><|assistant|>A<|end|><|tool|>R<|end|>...
# `{% generation %}` marks the tokens the loss is computed on (return_assistant_tokens_mask).
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if tools %}"
    "{{- '<|system|>' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\nYou may call functions. Their signatures are within <tools></tools>:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\nTo call one, reply with <tool_call>{\"name\": <name>, "
    "\"arguments\": <args-object>}</tool_call>' + eos_token }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|system|>' + messages[0].content + eos_token }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- if not loop.first %}{{- '<|system|>' + message.content + eos_token }}{%- endif %}"
    "{%- elif message.role == 'user' %}"
    "{{- '<|user|>' + message.content + eos_token }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|tool|>' + message.content + eos_token }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|assistant|>' }}"
    "{%- generation %}"
    "{%- if message.content is string %}{{- message.content }}{%- endif %}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- set call = call.function if call.function is defined else call %}"
    "{%- set args = call.arguments if call.arguments is string else (call.arguments | tojson) %}"
    "{{- '<tool_call>{\"name\": \"' + call.name + '\", \"arguments\": ' + args + '}</tool_call>' }}"
    "{%- endfor %}"
    "{{- eos_token }}"
    "{%- endgeneration %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>' }}{%- endif %}"
)


def arithmetic_chat(rng: random.Random) -> list[dict]:
    """user asks a plus/minus question (optionally after a system prompt); assistant answers."""
    problem = make_problem(rng)
    messages = chat_messages(problem.question, system=rng.choice(SYSTEM_PROMPTS))
    return messages + [{"role": "assistant", "content": problem.reply}]


# (weight, generator): add conversation types here (e.g. multiply via a tool call).
CONVERSATIONS = [(1.0, arithmetic_chat)]


def make_conversation(rng: random.Random) -> list[dict]:
    """One training conversation, its type drawn by weight from CONVERSATIONS."""
    weights = [w for w, _ in CONVERSATIONS]
    generator = rng.choices([g for _, g in CONVERSATIONS], weights=weights)[0]
    return generator(rng)


def render_plain(messages: list[dict]) -> str:
    """Conversation text for tokenizer training (the same layout the chat template makes)."""
    return "".join(f"<|{m['role']}|>{m.get('content') or ''}<|end|>" for m in messages)


def build_tokenizer(rng: random.Random) -> PreTrainedTokenizerFast:
    """Byte-level BPE, digits always single tokens, trained on generated conversations."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [render_plain(make_conversation(rng)) for _ in range(20000)]
    bpe.train_from_iterator(corpus, trainer=trainer)
    bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_CALL_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|bos|>",
        eos_token="<|end|>",
        pad_token="<|pad|>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
        padding_side="left",
        model_max_length=1024,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    """A tiny Llama: 4 layers, hidden 128, 4 query heads sharing 2 KV heads, tied embeddings."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config.architectures = ["LlamaForCausalLM"]
    return LlamaForCausalLM(config)


def encode_batch(tokenizer, conversations: list[list[dict]]) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids[B, S] right-padded and labels[B, S] (-100 outside assistant tokens)."""
    encoded = tokenizer.apply_chat_template(
        conversations, return_dict=True, return_assistant_tokens_mask=True
    )
    width = max(len(ids) for ids in encoded["input_ids"])
    input_ids = torch.full((len(conversations), width), tokenizer.pad_token_id)
    labels = torch.full((len(conversations), width), -100)
    for row, (ids, mask) in enumerate(zip(encoded["input_ids"], encoded["assistant_masks"])):
        ids, mask = torch.tensor(ids), torch.tensor(mask, dtype=torch.bool)
        input_ids[row, : len(ids)] = ids
        labels[row, : len(ids)] = torch.where(mask, ids, -100)
    return input_ids, labels


def learning_rate(step: int, steps: int, peak: float) -> float:
    """Linear warm-up over the first 5% of steps, then cosine decay to 10% of the peak."""
    warmup = max(1, steps // 20)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + torch.cos(torch.tensor(progress * torch.pi)).item()))


def train(model, tokenizer, steps: int, batch_size: int, peak_lr: float, rng: random.Random) -> None:
    """AdamW on freshly generated batches; the loss covers assistant tokens only."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr, weight_decay=0.01, betas=(0.9, 0.98))
    model.train()
    device = next(model.parameters()).device
    start = time.time()
    for step in range(steps):
        input_ids, labels = encode_batch(tokenizer, [make_conversation(rng) for _ in range(batch_size)])
        input_ids, labels = input_ids.to(device), labels.to(device)
        attention_mask = (input_ids != tokenizer.pad_token_id).long()
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, peak_lr)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"step {step:5d}  loss {loss.item():.4f}  {time.time() - start:6.0f}s", flush=True)


@torch.no_grad()
def evaluate(model, tokenizer, questions: list[tuple[str, int]], batch_size: int = 100) -> float:
    """Greedy exact-answer accuracy with transformers generate (left-padded batches)."""
    model.eval()
    correct = 0
    for first in range(0, len(questions), batch_size):
        chunk = questions[first : first + batch_size]
        prompts = [chat_messages(question) for question, _ in chunk]
        inputs = tokenizer.apply_chat_template(
            prompts, add_generation_prompt=True, padding=True, return_tensors="pt", return_dict=True
        )
        output = model.generate(**inputs.to(model.device), max_new_tokens=24, do_sample=False)
        replies = tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        correct += sum(extract_answer(reply) == answer for reply, (_, answer) in zip(replies, chunk))
    print(f"sample: {chunk[0][0]!r} -> {replies[0]!r}", flush=True)
    return correct / len(questions)


def save(model, tokenizer, out: Path) -> None:
    """Hugging Face folder: float32 safetensors, tokenizer, chat_template.jinja, generation config."""
    out.mkdir(parents=True, exist_ok=True)
    generation = model.generation_config
    generation.bos_token_id = tokenizer.bos_token_id
    generation.eos_token_id = tokenizer.eos_token_id
    generation.pad_token_id = tokenizer.pad_token_id
    generation.do_sample = False
    generation.max_new_tokens = 64
    model.to(torch.float32).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"saved {out} ({size / 1e6:.2f} MB)", flush=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1200)  # the shipped model: 1200 steps, 97.8% held out
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--out", type=Path, default=DEMO_MODEL_DIR)
    parser.add_argument("--eval-only", action="store_true", help="evaluate the folder at --out")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    questions = held_out_questions()
    if args.eval_only:
        tokenizer = AutoTokenizer.from_pretrained(args.out)
        model = AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32)
    else:
        start = time.time()
        tokenizer = build_tokenizer(rng)
        model = build_model(tokenizer)
        print(f"vocab {len(tokenizer)}, params {sum(p.numel() for p in model.parameters()):,}", flush=True)
        train(model, tokenizer, args.steps, args.batch_size, args.lr, rng)
        print(f"trained in {time.time() - start:.0f}s", flush=True)
        save(model, tokenizer, args.out)
    print(f"held-out accuracy {evaluate(model, tokenizer, questions):.4f} on {len(questions)}", flush=True)


if __name__ == "__main__":
    main()
