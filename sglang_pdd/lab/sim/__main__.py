import sys

from sglang_pdd.lab.sim.cli import main

sys.exit(main())
