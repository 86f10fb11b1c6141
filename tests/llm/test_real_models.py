"""``python -m mrl_llm models prepare`` on a tiny GGUF written in the test (mrl_llm.real_models).

The conversion (fp32 safetensors equal to the GGUF's weights, the chat template, the generation config), the
BOS fix (the saved tokenizer adds BOS exactly when the GGUF's ``tokenizer.ggml.add_bos_token`` says so),
idempotence, and the failures -- a missing package, a corrupt / truncated GGUF, a checksum mismatch, a full
disk -- each a one-line error naming the fix, with no model directory left behind.
"""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mrl_llm import real_models
from mrl_llm.cli import main
from mrl_llm.real_models import GGUFPart, ModelSource, prepare_models
from tests.llm.tiny_gguf import BOS_ID, CHAT_TEMPLATE, EOS_ID, sha256_of, write_tiny_gguf


def tiny_source(path: Path, name: str = "tiny", sha256: str | None = None) -> ModelSource:
    return ModelSource(name=name, parts=(GGUFPart(None, str(path)),), sha256=sha256 or sha256_of(path),
                       license="Apache-2.0", install="pip install tiny-gguf")


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def prepared(tiny_gguf, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("models")
    rows = prepare_models(root, [tiny_source(tiny_gguf)], progress=False)
    assert rows[0]["created"] and Path(rows[0]["path"]) == root / "tiny"
    return root / "tiny"


def test_tiny_gguf_is_small(tiny_gguf):
    assert tiny_gguf.stat().st_size < 5_000_000


def test_conversion_writes_an_fp32_hf_directory_equal_to_the_gguf(prepared, tiny_gguf):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json",
            real_models.MARKER} <= set(leftovers(prepared))
    assert not list(prepared.glob("*.gguf"))  # the assembled GGUF is not kept
    with safe_open(str(prepared / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}
    cfg = json.loads((prepared / "config.json").read_text())
    assert cfg["model_type"] == "llama" and "quantization_config" not in cfg
    assert cfg["hidden_size"] == 16 and cfg["num_hidden_layers"] == 1

    saved = AutoModelForCausalLM.from_pretrained(prepared, dtype=torch.float32)
    direct = AutoModelForCausalLM.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name,
                                                  dtype=torch.float32)
    ids = torch.tensor([[BOS_ID, 86, 260, 261, 70]])
    torch.testing.assert_close(saved(ids).logits, direct(ids).logits, rtol=0, atol=0)

    tok = AutoTokenizer.from_pretrained(prepared)
    assert tok.chat_template == CHAT_TEMPLATE
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "<s>user: hi</s>"
    assert tok.model_max_length == 64  # the GGUF's context length, not transformers' "unbounded" default
    gen = GenerationConfig.from_pretrained(prepared)
    assert (gen.bos_token_id, gen.eos_token_id) == (BOS_ID, EOS_ID)
    meta = json.loads((prepared / real_models.MARKER).read_text())
    assert meta["gguf_sha256"] == sha256_of(tiny_gguf) and meta["license"] == "Apache-2.0"


@pytest.mark.parametrize("add_bos", [True, False])
def test_saved_tokenizer_adds_bos_exactly_when_the_gguf_says_so(add_bos, tmp_path):
    """transformers builds a GGUF tokenizer that ignores ``tokenizer.ggml.add_bos_token`` (Gemma's says True)."""
    from transformers import AutoTokenizer

    gguf_file = write_tiny_gguf(tmp_path / "t.gguf", add_bos=add_bos)
    prepare_models(tmp_path / "models", [tiny_source(gguf_file)], progress=False)
    tok = AutoTokenizer.from_pretrained(tmp_path / "models" / "tiny")
    ids = tok("the the")["input_ids"]
    assert (ids[0] == BOS_ID) is add_bos
    assert ids[int(add_bos):] == [86, 260, 261]  # "t" "he" "Ġthe": the text itself is unchanged


def test_a_gguf_without_the_flag_keeps_the_tokenizer_transformers_builds(tmp_path):
    from transformers import AutoTokenizer

    gguf_file = write_tiny_gguf(tmp_path / "t.gguf", add_bos=None, chat_template=None)
    prepare_models(tmp_path / "models", [tiny_source(gguf_file)], progress=False)
    built = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="t.gguf")
    saved = AutoTokenizer.from_pretrained(tmp_path / "models" / "tiny")
    assert saved("the the")["input_ids"] == built("the the")["input_ids"]
    assert not (tmp_path / "models" / "tiny" / "chat_template.jinja").exists()


def test_prepare_is_idempotent(prepared, tiny_gguf, monkeypatch):
    before = {p.name: p.stat().st_mtime_ns for p in prepared.iterdir()}

    def boom(*a, **k):
        raise AssertionError("a complete directory must not be converted again")

    monkeypatch.setattr(real_models, "convert", boom)
    monkeypatch.setattr(real_models, "assemble", boom)
    rows = prepare_models(prepared.parent, [tiny_source(tiny_gguf)], progress=False)
    assert rows == [{"name": "tiny", "path": str(prepared), "created": False, "seconds": 0.0}]
    assert {p.name: p.stat().st_mtime_ns for p in prepared.iterdir()} == before


def test_cli_prepare_twice_says_nothing_to_do(prepared, tiny_gguf, monkeypatch, capsys):
    monkeypatch.setattr(real_models, "SOURCES", (tiny_source(tiny_gguf),))
    assert main(["models", "prepare", "--out", str(prepared.parent)]) == 0
    assert capsys.readouterr().out.strip() == f"tiny: already prepared in {prepared}; nothing to do"


def test_default_out_is_mrl_models_dir_or_models(monkeypatch, tmp_path):
    monkeypatch.delenv("MRL_MODELS_DIR", raising=False)
    assert real_models.default_out() == Path("models")
    monkeypatch.setenv("MRL_MODELS_DIR", str(tmp_path))
    assert real_models.default_out() == tmp_path


def test_empty_cases(tmp_path):
    assert prepare_models(tmp_path / "m", []) == []
    assert not (tmp_path / "m").exists()
    with pytest.raises(ValueError, match="no GGUF parts"):
        ModelSource("x", (), "0" * 64, "Apache-2.0", "pip install x")


def test_the_pinned_sources_match_the_packages():
    """The two real sources: directory names, checksums and package file paths as the packages ship them."""
    assert [s.name for s in real_models.SOURCES] == ["smollm2-135m-instruct", "gemma-3-270m"]
    assert real_models.SMOLLM2.sha256.startswith("b179c952") and real_models.GEMMA3.sha256.startswith("a5fd3b62")
    assert [p.path.rsplit(".", 1)[1] for p in real_models.GEMMA3.parts] == ["part00", "part01", "part02", "part03"]
    assert "--no-deps" in real_models.SMOLLM2.install


# --- failures: one line naming the fix, nothing half-written -------------------------------------------------

def one_line_error(capsys, argv) -> str:
    """The error line of a failing ``main(argv)`` (stderr also holds the progress bars)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("mrl_llm models: ")]
    assert len(lines) == 1, err
    return lines[0]


def test_missing_package(tmp_path, monkeypatch, capsys):
    src = ModelSource("ghost", (GGUFPart("no-such-distribution-mrl", "x/model.gguf"),), "0" * 64,
                      "Apache-2.0", "pip install no-such-distribution-mrl")
    monkeypatch.setattr(real_models, "SOURCES", (src,))
    err = one_line_error(capsys, ["models", "prepare", "--out", str(tmp_path / "m")])
    assert "'no-such-distribution-mrl' is not installed" in err and "scripts/setup.sh --real-models" in err
    assert leftovers(tmp_path / "m") == []


def test_checksum_mismatch(tiny_gguf, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(real_models, "SOURCES", (tiny_source(tiny_gguf, sha256="ab" * 32),))
    err = one_line_error(capsys, ["models", "prepare", "--out", str(tmp_path)])
    assert "sha256" in err and "expected abababab" in err and "--force-reinstall" in err
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_truncated_or_corrupt_gguf(damage, tiny_gguf, tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.gguf"
    data = tiny_gguf.read_bytes()
    bad.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"NOTAGGUF" + data[8:])
    out = tmp_path / "models"
    monkeypatch.setattr(real_models, "SOURCES", (tiny_source(bad),))  # the damaged bytes' own sha256 pinned
    err = one_line_error(capsys, ["models", "prepare", "--out", str(out)])
    assert "is not a readable GGUF" in err and "reinstall its package" in err
    assert leftovers(out) == []


@pytest.mark.parametrize("where", ["copy", "model", "tokenizer", "wrapped"])
def test_full_disk(where, tiny_gguf, tmp_path, monkeypatch, capsys):
    from transformers import PreTrainedModel

    full = OSError(errno.ENOSPC, "No space left on device")

    def raise_full(*a, **k):
        if where == "wrapped":  # safetensors reports a full disk as its own error type, with the OS text
            raise RuntimeError("Error while serializing: IoError(No space left on device)") from full
        raise full

    if where == "copy":
        monkeypatch.setattr(real_models, "hashlib", SimpleNamespace(sha256=lambda: _FullDiskDigest(full)))
    elif where == "tokenizer":
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", raise_full)
    else:
        monkeypatch.setattr(PreTrainedModel, "save_pretrained", raise_full)
    monkeypatch.setattr(real_models, "SOURCES", (tiny_source(tiny_gguf),))
    err = one_line_error(capsys, ["models", "prepare", "--out", str(tmp_path)])
    assert "no space left" in err and "pass --out DIR on a larger disk" in err
    assert leftovers(tmp_path) == []


class _FullDiskDigest:
    """A digest whose update raises ENOSPC: the copy loop writes then hashes each block, so the first block
    stands for a write that found the disk full."""

    def __init__(self, err: OSError) -> None:
        self.err = err

    def update(self, block: bytes) -> None:
        raise self.err


def test_an_unprepared_directory_in_the_way_is_not_overwritten(tiny_gguf, tmp_path, monkeypatch, capsys):
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "mine.txt").write_text("user data")
    monkeypatch.setattr(real_models, "SOURCES", (tiny_source(tiny_gguf),))
    err = one_line_error(capsys, ["models", "prepare", "--out", str(tmp_path)])
    assert "exists but is not a complete model" in err and "remove it" in err
    assert (tmp_path / "tiny" / "mine.txt").read_text() == "user data"


def test_a_killed_prepare_leaves_a_stage_that_the_next_one_removes(prepared, tiny_gguf, tmp_path):
    stale = tmp_path / f".tiny{real_models._STAGE_TAG}999999999-abc"  # no such process
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    live = tmp_path / f".tiny{real_models._STAGE_TAG}1-abc"  # pid 1 is alive: another prepare's stage
    live.mkdir()
    prepare_models(tmp_path, [tiny_source(tiny_gguf)], progress=False)
    assert leftovers(tmp_path) == sorted([live.name, "tiny"])
    shutil.rmtree(live)


def test_missing_gguf_library(tiny_gguf, tmp_path, monkeypatch, capsys):
    real_find = real_models.importlib.util.find_spec
    monkeypatch.setattr(real_models.importlib.util, "find_spec", lambda m: None if m == "gguf" else real_find(m))
    monkeypatch.setattr(real_models, "SOURCES", (tiny_source(tiny_gguf),))
    err = one_line_error(capsys, ["models", "prepare", "--out", str(tmp_path / "m")])
    assert "missing python packages: gguf (the llm extra)" in err and "scripts/setup.sh" in err
    assert leftovers(tmp_path / "m") == []
