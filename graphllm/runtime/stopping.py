"""Decides whether a sequence is done after a new token was appended."""

from graphllm.runtime.sequence import Sequence


def check_stop(seq: Sequence, token: int, eos_token_ids: frozenset[int],
               max_model_len: int) -> tuple[str, int | str | None] | None:
    """(finish_reason, stop_reason) if seq must stop after `token`, else None.

    Stop strings are checked by the caller through the detokenizer (they need text).
    """
    params, num_output = seq.params, seq.num_output_tokens
    if num_output >= params.min_tokens:
        if token in eos_token_ids and not params.ignore_eos:
            return "stop", None
        if params.stop_token_ids and token in params.stop_token_ids:
            return "stop", token
    if reached_length(seq, max_model_len):
        return "length", None
    return None


def reached_length(seq: Sequence, max_model_len: int) -> bool:
    """seq holds as many tokens as it may: its max_tokens outputs, or max_model_len in all."""
    max_tokens = seq.params.max_tokens
    return (max_tokens is not None and seq.num_output_tokens >= max_tokens) or seq.num_tokens >= max_model_len
