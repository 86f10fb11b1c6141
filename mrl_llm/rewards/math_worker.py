"""The math-verify worker process (run as a script by :mod:`mrl_llm.rewards.sandbox`; imports only
the standard library and ``math_verify``).

Protocol: one JSON object per line on stdin, one reply per line on the protocol channel (the original
stdout; anything else the libraries print goes to stderr). First reply: ``{"ready": true}``.

* ``{"id": n, "op": "gold", "gold": G}`` → ``{"id": n, "gold_ok": bool}``
* ``{"id": n, "op": "verify", "gold": G, "pred": P}`` → ``{"id": n, "gold_ok": bool, "equal": bool}``

``G`` and ``P`` are extracted answers (LaTeX, the content of a box); each is parsed as
``\\boxed{...}`` by ``math_verify.parse`` with math-verify's own (signal-based) timeouts turned off:
the parent enforces the deadline by killing this process. ``gold_ok`` is False when the gold parses
to no mathematical object (nothing, or only math-verify's raw-string fallback). Parsed golds are cached (a gold repeats for every sample of a group). Each request's
``kill_after_s`` arms ``SIGALRM`` with its default action: the kernel terminates this process if the
request runs that long, even when it is stuck in C and its parent is gone.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import sys


def main() -> None:
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)  # run as a script: do not let this package's files shadow top-level modules
    channel = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.ERROR)
    from math_verify import LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig()]
    cache: dict[str, list] = {}

    def parsed(text: str) -> list:
        return parse("\\boxed{" + text + "}", extraction_config=config, parsing_timeout=None)

    def parsed_gold(text: str) -> list:
        if text not in cache:
            if len(cache) > 20000:
                cache.clear()
            cache[text] = parsed(text)
        return cache[text]

    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    channel.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        signal.alarm(max(1, math.ceil(float(req.get("kill_after_s", 60.0)))))
        reply: dict = {"id": req.get("id")}
        try:
            gold = parsed_gold(req["gold"])
            reply["gold_ok"] = any(not isinstance(g, str) for g in gold)
            if req["op"] == "verify":
                reply["equal"] = reply["gold_ok"] and bool(
                    verify(gold, parsed(req["pred"]), timeout_seconds=None, raise_on_error=False)
                )
        except Exception as err:  # noqa: BLE001 - reported to the parent, which counts it
            reply["error"] = f"{type(err).__name__}: {err}"[:500]
        signal.alarm(0)
        channel.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
