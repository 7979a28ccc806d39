"""ModelConfig: parsing both rope forms, validation, and the KV bytes per token of real models."""
from pathlib import Path

import pytest
import torch

from engine.config import ModelConfig, known_config
from engine.errors import InputError

QWEN3_FIELDS = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, intermediate_size=128)


@pytest.mark.parametrize("name, fp16_bytes", [
    ("llama-2-13b", 819_200), ("llama-3-8b", 131_072), ("llama-3-70b", 327_680), ("qwen3-0.6b", 114_688)])
def test_kv_bytes_per_token_of_real_models(name, fp16_bytes):
    config = known_config(name)
    assert config.kv_bytes_per_token(torch.float16) == fp16_bytes
    assert config.kv_bytes_per_token(torch.float32) == 2 * fp16_bytes


def test_head_dim_defaults_to_hidden_over_heads_for_llama():
    assert known_config("llama-3-8b").head_dim == 128
    assert known_config("qwen3-0.6b").head_dim == 128          # Qwen3 states it explicitly


def test_rope_theta_top_level_and_inside_rope_parameters():
    top = ModelConfig.from_hf({**QWEN3_FIELDS, "rope_theta": 1234.0})
    nested = ModelConfig.from_hf({**QWEN3_FIELDS, "rope_parameters": {"rope_type": "default", "rope_theta": 4321.0}})
    assert top.rope_theta == 1234.0
    assert nested.rope_theta == 4321.0
    assert ModelConfig.from_hf(QWEN3_FIELDS).rope_theta == 10_000.0


def test_eos_list_takes_the_first_and_round_trip_through_hf_form():
    config = ModelConfig.from_hf({**QWEN3_FIELDS, "eos_token_id": [7, 8], "tie_word_embeddings": True})
    assert config.eos_token_id == 7 and config.tie_word_embeddings
    assert ModelConfig.from_hf(config.to_hf()) == config


def test_missing_field_is_named():
    fields = dict(QWEN3_FIELDS)
    del fields["hidden_size"]
    with pytest.raises(ValueError, match="hidden_size"):
        ModelConfig.from_hf(fields)


def test_heads_must_group_evenly():
    with pytest.raises(ValueError, match="not a multiple"):
        ModelConfig.from_hf({**QWEN3_FIELDS, "num_key_value_heads": 3})


def test_unknown_config_name_lists_the_known_ones():
    with pytest.raises(FileNotFoundError, match="llama-3-8b"):
        known_config("gpt-5")


def test_a_config_by_path_or_by_name():
    path = known_config("qwen3-0.6b")
    assert known_config(Path(__file__).parents[1] / "engine/configs/qwen3-0.6b.json") == path


@pytest.mark.parametrize("field", ["num_key_value_heads", "head_dim"])
def test_a_zero_head_count_or_size_is_refused_not_replaced_by_the_default(field):
    shape = {"vocab_size": 10, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 8}
    with pytest.raises(InputError, match=f"{field} must be positive, got 0"):
        ModelConfig.from_hf({**shape, field: 0})
    absent = ModelConfig.from_hf(shape)                  # absent, or null, is the default
    assert ModelConfig.from_hf({**shape, field: None}) == absent
    assert (absent.num_kv_heads, absent.head_dim) == (4, 16)
