import sys

from bandit_sim.cli import main

sys.exit(main())
