"""``python -m mrl_llm.thl report --source DIR --target DIR --data FILE.jsonl``."""

import sys

from mrl_llm.thl.report import main

sys.exit(main())
