import sys

from sglang_pdd.sim.cli import main

sys.exit(main())
