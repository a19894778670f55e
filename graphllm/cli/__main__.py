"""`python -m graphllm.cli ...`: the same as the `graphllm` command."""

import sys

from graphllm.cli.main import main

sys.exit(main())
