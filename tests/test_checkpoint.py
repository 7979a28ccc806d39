"""Loading Hugging Face checkpoint directories, and the errors a broken one gives."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.checkpoint import load_model, tiny_model, write_tiny_checkpoint
from engine.generate import scratch_logits

IDS = [[1, 2, 3, 4, 5]]


@pytest.mark.parametrize("tied", [False, True])
def test_round_trip_keeps_the_logits(tmp_path, tied):
    write_tiny_checkpoint(tmp_path, seed=4, tie_word_embeddings=tied)
    saved = set(load_file(str(tmp_path / "model.safetensors")))
    assert ("lm_head.weight" in saved) is not tied          # a tied head is stored once
    a, b = scratch_logits(tiny_model(seed=4, tie_word_embeddings=tied), IDS), scratch_logits(load_model(tmp_path), IDS)
    assert torch.equal(a[0], b[0])


def test_seeds_give_different_models():
    assert not torch.equal(scratch_logits(tiny_model(seed=1), IDS)[0], scratch_logits(tiny_model(seed=2), IDS)[0])


def test_sharded_checkpoint_loads(tmp_path):
    write_tiny_checkpoint(tmp_path, seed=5)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / shard))
    weight_map = {k: shard for shard, keys in shards.items() for k in keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert torch.equal(scratch_logits(load_model(tmp_path), IDS)[0], scratch_logits(tiny_model(seed=5), IDS)[0])


def rewrite(path, change):
    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def test_missing_tensor_is_named_with_its_shape(tmp_path):
    write_tiny_checkpoint(tmp_path)
    rewrite(tmp_path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(KeyError, match=r"model.layers.1.mlp.up_proj.weight.*\(128, 64\)"):
        load_model(tmp_path)


def test_misshapen_tensor_names_both_shapes(tmp_path):
    write_tiny_checkpoint(tmp_path)
    rewrite(tmp_path, lambda t: t.update({"model.norm.weight": torch.ones(65)}))
    with pytest.raises(ValueError, match=r"model.norm.weight.*\(65,\).*\(64,\)"):
        load_model(tmp_path)


def test_stray_tensor_and_missing_files_are_reported(tmp_path):
    write_tiny_checkpoint(tmp_path)
    rewrite(tmp_path, lambda t: t.update({"model.layers.9.extra": torch.ones(1)}))
    with pytest.raises(KeyError, match="model.layers.9.extra"):
        load_model(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_model(tmp_path)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path / "nowhere")
