"""The command line (`graphllm ...`): the top of the house, and the only place the environment is read.

  main.py         the parser and the entry point (pyproject's `graphllm` script)
  args.py         flags shared by the commands, and the EngineConfig / CompileConfig they build
  environment.py  every environment variable graphllm reads, documented
  commands.py     generate, compile, inspect;  serve.py  serve;  the benches live in graphllm/bench
"""
