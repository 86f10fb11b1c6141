"""A policy actor keeps the Rust tokenizers' thread pool to its CPUs (as torch.set_num_threads does)."""

from __future__ import annotations

import pytest

from mrl_llm.distributed.actors import limit_tokenizer_threads


@pytest.mark.parametrize(("threads", "rayon", "parallel"), [(1, "1", "false"), (0, "1", "false"), (3, "3", None)])
def test_tokenizer_threads_follow_the_actor_cpus(monkeypatch, threads, rayon, parallel):
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    limit_tokenizer_threads(threads)
    import os

    assert os.environ["RAYON_NUM_THREADS"] == rayon
    assert os.environ.get("TOKENIZERS_PARALLELISM") == parallel


def test_a_users_setting_wins(monkeypatch):
    import os

    monkeypatch.setenv("RAYON_NUM_THREADS", "8")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    limit_tokenizer_threads(1)
    assert os.environ["RAYON_NUM_THREADS"] == "8" and os.environ["TOKENIZERS_PARALLELISM"] == "true"
