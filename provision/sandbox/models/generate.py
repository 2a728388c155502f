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
