"""A tiny Llama-architecture GGUF (~50 KB) written with the ``gguf`` package's GGUFWriter, for the prepare tests.

Byte-level BPE vocabulary: three control tokens (``<|endoftext|>`` 0, ``<s>`` 1 = BOS, ``</s>`` 2 = EOS), the 256
byte symbols and three merges ("Ġt", "he", "Ġthe"); one decoder layer of width 16; fp32 tensors, so the HF
model ``transformers`` builds from it holds exactly these numbers (up to llama.cpp's q/k row permutation).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

BOS_ID, EOS_ID, PAD_ID = 1, 2, 0
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant: {% endif %}")


def write_tiny_gguf(path: Path, *, add_bos: bool | None = True, chat_template: str | None = CHAT_TEMPLATE,
                    seed: int = 0) -> Path:
    """Write the tiny GGUF to ``path``; ``add_bos`` None leaves ``tokenizer.ggml.add_bos_token`` out."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    rng = np.random.default_rng(seed)
    tokens = ["<|endoftext|>", "<s>", "</s>", *bytes_to_unicode().values(), "Ġt", "he", "Ġthe"]
    types = [3, 3, 3] + [1] * (len(tokens) - 3)  # 3: CONTROL, 1: NORMAL
    vocab, hidden, inter, heads, kv_heads = len(tokens), 16, 32, 2, 1
    head_dim = hidden // heads

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_block_count(1)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["Ġ t", "h e", "Ġt he"])
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_pad_token_id(PAD_ID)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    w.add_tensor("token_embd.weight", rand(vocab, hidden))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(hidden, np.float32))
    w.add_tensor("blk.0.attn_q.weight", rand(hidden, hidden))
    w.add_tensor("blk.0.attn_k.weight", rand(kv_heads * head_dim, hidden))
    w.add_tensor("blk.0.attn_v.weight", rand(kv_heads * head_dim, hidden))
    w.add_tensor("blk.0.attn_output.weight", rand(hidden, hidden))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(hidden, np.float32))
    w.add_tensor("blk.0.ffn_gate.weight", rand(inter, hidden))
    w.add_tensor("blk.0.ffn_up.weight", rand(inter, hidden))
    w.add_tensor("blk.0.ffn_down.weight", rand(hidden, inter))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.add_tensor("output.weight", rand(vocab, hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
