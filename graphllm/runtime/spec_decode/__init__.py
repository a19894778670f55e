"""Speculative decoding: propose k tokens per sequence cheaply, verify them in one target step.

    (graphllm/speculative_config.py: SpeculativeConfig, vLLM's speculative_config, validated; a base module
    beside graphllm/config.py, which holds it)
    ngram.py             NgramProposer: prompt lookup over the sequence's own tokens
    draft_model.py       DraftModelProposer: a second, small model run greedily k steps
    rejection_sampler.py which proposals the target accepts (greedy: its argmax; else rejection sampling)
    decoder.py           SpeculativeDecoder: propose before a step, verify and roll back after it
    stats.py             SpecDecodeStats: drafts, accepted tokens, draft and verify time

The step loop runs speculative engines synchronously (no async scheduling), and a verify step (k + 1
query tokens per sequence) runs un-graphed; plain decode steps still replay their CUDA graphs.
"""
