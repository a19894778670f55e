"""SpecDecodeStats: how well speculation pays, since the engine started (vLLM's spec-decode counters)."""

from dataclasses import dataclass, field, replace


@dataclass
class SpecDecodeStats:
    num_drafts: int = 0  # verified proposals (a sequence with >= 1 proposed token in a verify step)
    num_draft_tokens: int = 0  # proposed tokens verified
    num_accepted_tokens: int = 0  # of those, accepted by the target
    accepted_per_position: list[int] = field(default_factory=list)  # [k]: accepted at proposal position j
    draft_seconds: float = 0.0  # proposing (the draft model's steps, or the n-gram lookups)
    verify_seconds: float = 0.0  # verify steps: the target step, acceptance, roll-back

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed tokens (0 before any proposal)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a verified proposal yields on average: its accepted tokens plus the target's own (vLLM's
        mean acceptance length; 1 before any proposal)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    def record(self, num_proposed: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_proposed
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_position) < num_proposed:
            self.accepted_per_position += [0] * (num_proposed - len(self.accepted_per_position))
        for j in range(num_accepted):
            self.accepted_per_position[j] += 1

    def snapshot(self) -> "SpecDecodeStats":
        return replace(self, accepted_per_position=list(self.accepted_per_position))
