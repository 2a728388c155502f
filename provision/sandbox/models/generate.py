"""Writes the tiny fixture models (run once; the outputs are checked in): real safetensors, by hand."""

from __future__ import annotations

import json
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIZES = {"F16": 2, "BF16": 2, "F32": 4}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """8-byte little-endian header length, the JSON header, then the raw bytes (a counting pattern)."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (dtype, shape) in tensors.items():
        count = 1
        for dim in shape:
            count *= dim
        size = count * SIZES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        blobs.append(bytes(i % 251 for i in range(size)))
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the header is padded to 8 bytes, as the safetensors writer does
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_model(name: str, config: dict, shards: dict[str, dict[str, tuple[str, list[int]]]]) -> None:
    root = HERE / name
    root.mkdir(exist_ok=True)
    (root / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    weight_map, total = {}, 0
    for shard, tensors in shards.items():
        write_safetensors(root / shard, tensors)
        for tensor, (dtype, shape) in tensors.items():
            weight_map[tensor] = shard
            count = 1
            for dim in shape:
                count *= dim
            total += count * SIZES[dtype]
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


H, V, FF = 16, 64, 32  # hidden, vocab, intermediate

write_model(
    "tiny-target",
    {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": H,
        "intermediate_size": FF,
        "moe_intermediate_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "n_routed_experts": 2,
        "n_shared_experts": 1,
        "num_experts_per_tok": 1,
        "first_k_dense_replace": 1,
        "kv_lora_rank": 8,
        "q_lora_rank": 8,
        "qk_nope_head_dim": 4,
        "qk_rope_head_dim": 4,
        "v_head_dim": 4,
        "vocab_size": V,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    },
    {
        "model-00001-of-00002.safetensors": {
            "model.embed_tokens.weight": ("BF16", [V, H]),
            "model.layers.0.input_layernorm.weight": ("BF16", [H]),
            "model.layers.0.mlp.gate_proj.weight": ("BF16", [FF, H]),
        },
        "model-00002-of-00002.safetensors": {
            "model.layers.0.mlp.down_proj.weight": ("BF16", [H, FF]),
            "model.norm.weight": ("BF16", [H]),
            "lm_head.weight": ("BF16", [V, H]),
        },
    },
)

write_model(
    "tiny-drafter",
    {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": H,
        "intermediate_size": FF,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 8,
        "vocab_size": V,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "torch_dtype": "bfloat16",
        "num_target_layers": 1,
        "dflash_config": {"block_size": 8, "mask_token_id": 63, "target_layer_ids": [0]},
    },
    {
        "model-00001-of-00002.safetensors": {
            "layers.0.self_attn.q_proj.weight": ("BF16", [H, H]),
            "layers.0.input_layernorm.weight": ("BF16", [H]),
        },
        "model-00002-of-00002.safetensors": {
            "layers.0.mlp.down_proj.weight": ("BF16", [H, FF]),
            "fc.weight": ("BF16", [H, 2 * H]),
            "norm.weight": ("BF16", [H]),
        },
    },
)


def write_tokenizer(name: str, words: list[str]) -> None:
    """A word-level tokenizer of V entries: <unk>, the words, <mask> (the drafter's mask_token_id, 63).

    bench_serving loads it with transformers' AutoTokenizer (tokenizer.json through PreTrainedTokenizerFast),
    samples ids below vocab_size for its random-ids dataset and decodes them to text: one word, one token,
    as the stand-in counts prompt tokens (whitespace-separated pieces)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {"<unk>": 0, **{w: i + 1 for i, w in enumerate(words[: V - 2])}, "<mask>": V - 1}
    assert len(vocab) == V, len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with single spaces
    root = HERE / name
    tokenizer.save(str(root / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "mask_token": "<mask>",
              "model_max_length": 256, "clean_up_tokenization_spaces": False}  # fmt: skip
    (root / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


# the stand-in's reply words, then common English ones (the sweep's own load client's prompts)
WORDS = list(dict.fromkeys(
    "the model answers with placeholder words from a fixed list so that tests can compare them draft tokens verify "
    "block accept tree budget kernel cache prefill decode stream chunk token server request reply check value result "
    "number string list item field state ready done of and to in is it was for on are as his they at be this have "
    "or by one had not but what all were when we there".split()
))  # fmt: skip
write_tokenizer("tiny-target", WORDS)
