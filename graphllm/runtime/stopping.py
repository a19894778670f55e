"""Decides whether a sequence is done after a new token was appended."""

from graphllm.runtime.sequence import Sequence


def check_stop(seq: Sequence, token: int, eos_token_ids: frozenset[int],
               max_model_len: int) -> tuple[str, int | str | None] | None:
    """(finish_reason, stop_reason) if seq must stop after `token`, else None.

    Stop strings are checked by the caller through the detokenizer (they need text).
    """
    params = seq.params
    if seq.num_output_tokens >= params.min_tokens:
        if token in eos_token_ids and not params.ignore_eos:
            return "stop", None
        if params.stop_token_ids and token in params.stop_token_ids:
            return "stop", token
    if params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens:
        return "length", None
    if seq.num_tokens >= max_model_len:
        return "length", None
    return None
