"""`python -m sglang_pdd.compat install|check`: set up / verify the CPU compat of this environment."""

import sys

from sglang_pdd.compat.cpu import main

sys.exit(main(sys.argv[1:]))
