"""``python -m mrl_llm ...`` (see :mod:`mrl_llm.cli`)."""

from mrl_llm.cli import main

raise SystemExit(main())
