"""The demo task: arithmetic questions in natural phrasing, answered in one sentence.

The demo model shipped in `demo_model/` (trained by `scripts/train_demo.py`) answers
  user:      "What is 23 plus 45?"      assistant: "23 plus 45 is 68."
  user:      "Subtract 9 from 71."      assistant: "71 minus 9 is 62."
Operands are 0..99. Subtraction always has a >= b, so answers are never negative.

Multiplication goes through a tool: offered `MULTIPLY_TOOL`, the model answers
  user:      "What is 7 times 8?"       assistant: <tool_call>{"name": "multiply", "arguments": {"a": 7, "b": 8}}</tool_call>
  tool:      "56"                       assistant: "7 times 8 is 56."
Factors are 0..20 (`MAX_FACTOR`), with the same kind of held-out split.

Held-out split: an operand pair (op, a, b) is held out when a CRC32 of it is 0 mod 10, so the
held-out questions share no operand pair with anything training sees, whatever the phrasing.
Plain Python: importing this module pulls in no torch.
"""

import random
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

DEMO_MODEL_DIR = Path(__file__).resolve().parent / "demo_model"
MAX_OPERAND = 99
HELD_OUT_SEED = 20261101
MAX_FACTOR = 20

MULTIPLY_TOOL = {
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "Multiply two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}

# op -> question phrasings; {a} and {b} are the operands in the order the answer states them.
PHRASINGS = {
    "plus": [
        "What is {a} plus {b}?",
        "What is {a} + {b}?",
        "How much is {a} + {b}?",
        "How much is {a} plus {b}?",
        "Add {a} and {b}.",
        "Add {b} to {a}.",
        "What's the sum of {a} and {b}?",
        "Calculate {a} + {b}.",
        "{a} + {b} = ?",
        "What do you get when you add {a} and {b}?",
    ],
    "minus": [
        "What is {a} minus {b}?",
        "What is {a} - {b}?",
        "How much is {a} - {b}?",
        "How much is {a} minus {b}?",
        "Subtract {b} from {a}.",
        "What's the difference between {a} and {b}?",
        "Calculate {a} - {b}.",
        "{a} - {b} = ?",
        "Take {b} away from {a}.",
        "What do you get when you subtract {b} from {a}?",
    ],
}

# Multiplication phrasings (answered through MULTIPLY_TOOL); kept out of PHRASINGS so the
# plain arithmetic task and its held-out questions stay plus/minus only.
MULTIPLY_PHRASINGS = [
    "What is {a} times {b}?",
    "What is {a} * {b}?",
    "What is {a} x {b}?",
    "How much is {a} times {b}?",
    "How much is {a} * {b}?",
    "Multiply {a} by {b}.",
    "Multiply {a} and {b}.",
    "What's the product of {a} and {b}?",
    "Calculate {a} * {b}.",
    "Calculate {a} times {b}.",
    "{a} * {b} = ?",
    "What do you get when you multiply {a} by {b}?",
]


@dataclass(frozen=True)
class Problem:
    """One arithmetic question with its answer; `reply` is the sentence the model should say."""

    op: str
    a: int
    b: int
    question: str

    @property
    def answer(self) -> int:
        if self.op == "times":
            return self.a * self.b
        return self.a + self.b if self.op == "plus" else self.a - self.b

    @property
    def reply(self) -> str:
        return f"{self.a} {self.op} {self.b} is {self.answer}."


def is_held_out(op: str, a: int, b: int) -> bool:
    """True for the ~10% of operand pairs reserved for evaluation (never trained on)."""
    return zlib.crc32(f"{op}:{a}:{b}".encode()) % 10 == 0


def make_problem(rng: random.Random, held_out: bool = False) -> Problem:
    """A random problem from the training pairs, or from the held-out pairs if `held_out`."""
    while True:
        op = rng.choice(sorted(PHRASINGS))
        a, b = rng.randint(0, MAX_OPERAND), rng.randint(0, MAX_OPERAND)
        if op == "minus" and a < b:
            a, b = b, a
        if is_held_out(op, a, b) == held_out:
            question = rng.choice(PHRASINGS[op]).format(a=a, b=b)
            return Problem(op, a, b, question)


def make_multiply_problem(rng: random.Random, held_out: bool = False) -> Problem:
    """A random multiplication problem (factors 0..MAX_FACTOR), training or held-out pairs."""
    while True:
        a, b = rng.randint(0, MAX_FACTOR), rng.randint(0, MAX_FACTOR)
        if is_held_out("times", a, b) == held_out:
            return Problem("times", a, b, rng.choice(MULTIPLY_PHRASINGS).format(a=a, b=b))


def held_out_multiply_problems(n: int = 200, seed: int = HELD_OUT_SEED) -> list[Problem]:
    """`n` multiplication problems drawn only from held-out factor pairs (deterministic)."""
    rng = random.Random(seed)
    return [make_multiply_problem(rng, held_out=True) for _ in range(n)]


def make_question(rng: random.Random, held_out: bool = False) -> tuple[str, int]:
    """(question text, integer answer) for one random problem."""
    problem = make_problem(rng, held_out)
    return problem.question, problem.answer


def held_out_questions(n: int = 500, seed: int = HELD_OUT_SEED) -> list[tuple[str, int]]:
    """`n` evaluation questions drawn only from held-out operand pairs (deterministic)."""
    rng = random.Random(seed)
    return [make_question(rng, held_out=True) for _ in range(n)]


_STATED = re.compile(r"\bis\s+(-?\d+)")
_NUMBER = re.compile(r"-?\d+")


def extract_answer(text: str) -> int | None:
    """The number the reply states: the last 'is N', else the last integer, else None."""
    stated = _STATED.findall(text)
    if stated:
        return int(stated[-1])
    numbers = _NUMBER.findall(text)
    return int(numbers[-1]) if numbers else None


def chat_messages(question: str, system: str | None = None) -> list[dict]:
    """The messages list used to prompt the demo model, optionally with a system prompt."""
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [{"role": "user", "content": question}]
