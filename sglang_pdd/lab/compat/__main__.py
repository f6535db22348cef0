"""`python -m sglang_pdd.lab.compat install|check`: set up / verify the CPU compat of this environment."""

import sys

from sglang_pdd.lab.compat.cpu import main

sys.exit(main(sys.argv[1:]))
