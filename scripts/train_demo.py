"""Train the demo model shipped in graphllm/demo_model/ (see graphllm/demo.py for the task).

Builds a byte-level BPE tokenizer with single-digit tokens, a chat template (system / user /
assistant / tool roles, hermes-style tools and tool calls), trains a tiny LlamaForCausalLM on
generated chats with the loss on assistant tokens only, saves a Hugging Face folder and prints
greedy exact-answer accuracy on the held-out questions, and (for the multiply tool) exact
tool-call and follow-up answer accuracy on held-out multiplication questions.

  python scripts/train_demo.py --steps 1200 --out graphllm/demo_model
  # fine-tune a saved model (keeps its tokenizer), e.g. to add the multiply tool flow:
  # (the shipped model: the 1200-step one, then this, 99.6% held out, exact multiply calls 100%)
  python scripts/train_demo.py --init graphllm/demo_model --steps 400 --batch-size 64 --lr 1e-3 --out graphllm/demo_model
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
    MULTIPLY_TOOL,
    Problem,
    chat_messages,
    extract_answer,
    held_out_multiply_problems,
    held_out_questions,
    make_multiply_problem,
    make_problem,
)

SEED = 0
VOCAB_SIZE = 512  # an upper bound: the generated corpus saturates below it
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
TOOL_CALL_TOKENS = ["<tool_call>", "</tool_call>"]  # single tokens, but kept on decode
# The fixed JSON of a call as single tokens too: byte-level BPE spells most of it a character at a
# time, and a whole call must fit the 48 tokens a client may allow (it takes ~30 with these).
CALL_JSON_TOKENS = ['{"name": "', '", "arguments": ']
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


def arithmetic_with_tools_chat(rng: random.Random) -> list[dict]:
    """Tools offered, but a plus/minus question is still answered directly."""
    return [{"tools": [MULTIPLY_TOOL]}] + arithmetic_chat(rng)


def tool_call_message(problem: Problem) -> dict:
    call = {"name": "multiply", "arguments": {"a": problem.a, "b": problem.b}}
    return {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": call}]}


def multiply_call_chat(rng: random.Random) -> list[dict]:
    """Tools offered; user asks a multiplication; assistant calls multiply(a, b)."""
    problem = make_multiply_problem(rng)
    messages = chat_messages(problem.question, system=rng.choice(SYSTEM_PROMPTS))
    return [{"tools": [MULTIPLY_TOOL]}] + messages + [tool_call_message(problem)]


def multiply_answer_chat(rng: random.Random) -> list[dict]:
    """... the call, the tool's result, then the assistant states it in a sentence."""
    problem = make_multiply_problem(rng)
    messages = chat_messages(problem.question, system=rng.choice(SYSTEM_PROMPTS))
    return [{"tools": [MULTIPLY_TOOL]}] + messages + [
        tool_call_message(problem),
        {"role": "tool", "content": str(problem.answer)},
        {"role": "assistant", "content": problem.reply},
    ]


# (weight, generator). A conversation may start with {"tools": [...]}: the tools offered to it.
CONVERSATIONS = [
    (0.55, arithmetic_chat),
    (0.15, arithmetic_with_tools_chat),
    (0.05, multiply_call_chat),
    (0.25, multiply_answer_chat),  # also teaches the call
]


def make_conversation(rng: random.Random) -> list[dict]:
    """One training conversation, its type drawn by weight from CONVERSATIONS."""
    weights = [w for w, _ in CONVERSATIONS]
    generator = rng.choices([g for _, g in CONVERSATIONS], weights=weights)[0]
    return generator(rng)


def render_plain(messages: list[dict]) -> str:
    """Conversation text for tokenizer training (the same layout the chat template makes)."""
    return "".join(f"<|{m['role']}|>{m.get('content') or ''}<|end|>" for m in messages if "role" in m)


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
    bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_CALL_TOKENS + CALL_JSON_TOKENS])
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
    """input_ids[B, S] right-padded and labels[B, S] (-100 outside assistant tokens).

    All conversations of one batch must offer the same tools (or none)."""
    tools = conversations[0][0]["tools"] if "tools" in conversations[0][0] else None
    conversations = [[m for m in c if "role" in m] for c in conversations]
    encoded = tokenizer.apply_chat_template(
        conversations, tools=tools, return_dict=True, return_assistant_tokens_mask=True
    )
    width = max(len(ids) for ids in encoded["input_ids"])
    input_ids = torch.full((len(conversations), width), tokenizer.pad_token_id)
    labels = torch.full((len(conversations), width), -100)
    for row, (ids, mask) in enumerate(zip(encoded["input_ids"], encoded["assistant_masks"])):
        ids, mask = torch.tensor(ids), torch.tensor(mask, dtype=torch.bool)
        input_ids[row, : len(ids)] = ids
        labels[row, : len(ids)] = torch.where(mask, ids, -100)
    return input_ids, labels


def group_loss(model, input_ids: torch.Tensor, labels: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Mean loss over the labelled tokens of one batch. A prompt prefix that every row shares (the
    tools system turn is ~330 tokens) goes through the model once, its KV cache is broadcast to the
    batch, and only the rest of each row is computed per row: same loss, several times less work."""
    attention_mask = (input_ids != pad_id).long()
    same = (input_ids == input_ids[:1]).all(dim=0)
    shared = int(same.long().cumprod(0).sum())
    first_label = int((labels != -100).any(dim=0).long().argmax())
    prefix = min(shared, first_label - 1)  # labels[:, : prefix + 1] are all -100
    if prefix < 32:
        return model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    cache = model(input_ids=input_ids[:1, :prefix], use_cache=True).past_key_values
    batch = input_ids.shape[0]
    for layer in cache.layers:
        layer.keys = layer.keys.expand(batch, -1, -1, -1)
        layer.values = layer.values.expand(batch, -1, -1, -1)
    return model(
        input_ids=input_ids[:, prefix:],
        attention_mask=attention_mask,
        past_key_values=cache,
        labels=labels[:, prefix:],
    ).loss


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
        conversations = [make_conversation(rng) for _ in range(batch_size)]
        # Conversations with and without tools go through separately (same tools, little padding);
        # the loss is the mean over all assistant tokens of the batch.
        groups = {}
        for c in conversations:
            key = ("tools" in c[0], c[1]["content"] if "tools" in c[0] and c[1]["role"] == "system" else None)
            groups.setdefault(key, []).append(c)
        groups = list(groups.values())
        encoded = [encode_batch(tokenizer, group) for group in groups if group]
        total = sum(int((labels[:, 1:] != -100).sum()) for _, labels in encoded)
        optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for input_ids, labels in encoded:
            input_ids, labels = input_ids.to(device), labels.to(device)
            part = group_loss(model, input_ids, labels, tokenizer.pad_token_id)
            weight = int((labels[:, 1:] != -100).sum()) / total
            (part * weight).backward()
            loss_sum += part.item() * weight
        loss = torch.tensor(loss_sum)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, peak_lr)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 20 == 0 or step == steps - 1:
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


def generate_replies(model, tokenizer, conversations: list[list[dict]], tools=None, max_new_tokens=48) -> list[str]:
    """Greedy replies (special tokens dropped, <tool_call> kept) to left-padded prompts."""
    inputs = tokenizer.apply_chat_template(
        conversations, tools=tools, add_generation_prompt=True, padding=True, return_tensors="pt", return_dict=True
    )
    output = model.generate(**inputs.to(model.device), max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


@torch.no_grad()
def evaluate_tools(model, tokenizer, problems: list[Problem], batch_size: int = 50) -> tuple[float, float, float]:
    """On held-out multiplications with MULTIPLY_TOOL offered: exact tool-call accuracy, follow-up
    answer accuracy (after the call and the tool's result: states the product, no call), and the
    share of held-out plus/minus questions (tools offered) still answered directly and correctly."""
    model.eval()
    calls = answers = 0
    for first in range(0, len(problems), batch_size):
        chunk = problems[first : first + batch_size]
        prompts = [chat_messages(p.question) for p in chunk]
        replies = generate_replies(model, tokenizer, prompts, tools=[MULTIPLY_TOOL])
        expected = [
            f'<tool_call>{{"name": "multiply", "arguments": {{"a": {p.a}, "b": {p.b}}}}}</tool_call>' for p in chunk
        ]
        calls += sum(r == e for r, e in zip(replies, expected))
        follow = [m + [tool_call_message(p), {"role": "tool", "content": str(p.answer)}] for m, p in zip(prompts, chunk)]
        finals = generate_replies(model, tokenizer, follow, tools=[MULTIPLY_TOOL])
        answers += sum("<tool_call>" not in f and extract_answer(f) == p.answer for f, p in zip(finals, chunk))
    print(f"sample: {chunk[0].question!r} -> {replies[0]!r} -> {finals[0]!r}", flush=True)
    questions = held_out_questions(200)
    direct = 0
    for first in range(0, len(questions), batch_size):
        chunk = questions[first : first + batch_size]
        replies = generate_replies(model, tokenizer, [chat_messages(q) for q, _ in chunk], tools=[MULTIPLY_TOOL])
        direct += sum("<tool_call>" not in r and extract_answer(r) == a for r, (_, a) in zip(replies, chunk))
    return calls / len(problems), answers / len(problems), direct / len(questions)


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
    parser.add_argument("--steps", type=int, default=1200)  # from scratch: 1200 steps, 97.8% held out
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--out", type=Path, default=DEMO_MODEL_DIR)
    parser.add_argument("--eval-only", action="store_true", help="evaluate the folder at --out")
    parser.add_argument("--init", type=Path, help="fine-tune this saved model (and keep its tokenizer)")
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
        if args.init:
            tokenizer = AutoTokenizer.from_pretrained(args.init)
            model = AutoModelForCausalLM.from_pretrained(args.init, dtype=torch.float32)
            missing = [t for t in TOOL_CALL_TOKENS + CALL_JSON_TOKENS if t not in tokenizer.get_vocab()]
            if missing:  # new tokens get new (mean-initialised) embedding rows; the rest stays
                tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in missing])
                model.resize_token_embeddings(len(tokenizer))
                print(f"added tokens {missing}", flush=True)
        else:
            tokenizer = build_tokenizer(rng)
            model = build_model(tokenizer)
        print(f"vocab {len(tokenizer)}, params {sum(p.numel() for p in model.parameters()):,}", flush=True)
        train(model, tokenizer, args.steps, args.batch_size, args.lr, rng)
        print(f"trained in {time.time() - start:.0f}s", flush=True)
        save(model, tokenizer, args.out)
    print(f"held-out accuracy {evaluate(model, tokenizer, questions):.4f} on {len(questions)}", flush=True)
    problems = held_out_multiply_problems(100)
    calls, answers, direct = evaluate_tools(model, tokenizer, problems)
    print(
        f"multiply tool (held out, {len(problems)}): exact call {calls:.4f}, follow-up answer {answers:.4f}; "
        f"plus/minus with tools offered answered directly {direct:.4f} on 200",
        flush=True,
    )


if __name__ == "__main__":
    main()
