"""`graphllm bench`: measurements anyone can rerun on their own machine."""
