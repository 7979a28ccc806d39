"""Bad input gets a clear, named error before any state changes; what the engine does not implement
is refused at load time; what loaded before still loads (checkpoints saved by transformers included)."""
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.cache.paged import PagedKVCache
from engine.checkpoint import load_model, tiny_model, write_tiny_checkpoint
from engine.errors import InputError
from engine.generate import generate, pack, scratch_logits
from engine.sampling import SamplingParams
from engine.serve.engine import Engine

transformers = pytest.importorskip("transformers")
IDS = [[1, 2, 3, 4, 5]]


def edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("field, value, shown", [
    ("rope_scaling", {"rope_type": "linear", "factor": 2.0}, '"linear"'),
    ("rope_scaling", {"type": "dynamic", "factor": 4.0}, '"dynamic"'),
    ("rope_parameters", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}, '"yarn"'),
    ("hidden_act", "gelu", '"gelu"'),
    ("use_sliding_window", True, "true"),
    ("layer_types", ["full_attention", "sliding_attention"], '"sliding_attention"'),
    ("attention_bias", True, "true"),
])
def test_unimplemented_features_are_refused_naming_the_field_and_value(tmp_path, field, value, shown):
    write_tiny_checkpoint(tmp_path)
    edit_config(tmp_path, **{field: value})
    with pytest.raises(InputError, match=f"{field} = .*not supported") as info:
        load_model(tmp_path)
    assert shown in str(info.value) and str(tmp_path / "config.json") in str(info.value)


def test_what_qwen3_checkpoints_carry_keeps_loading(tmp_path):
    write_tiny_checkpoint(tmp_path, seed=2)
    edit_config(tmp_path, rope_scaling=None, use_sliding_window=False, sliding_window=None, max_window_layers=28,
                layer_types=["full_attention"] * 2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    assert torch.equal(scratch_logits(load_model(tmp_path), IDS)[0], scratch_logits(tiny_model(seed=2), IDS)[0])


@pytest.mark.parametrize("tied", [False, True])
def test_checkpoints_saved_by_transformers_load_and_match(tmp_path, tied):
    hf_config = transformers.Qwen3Config(vocab_size=260, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=16, intermediate_size=128,
                                         tie_word_embeddings=tied, max_position_embeddings=512)
    torch.manual_seed(0)
    hf_model = transformers.Qwen3ForCausalLM(hf_config).eval()
    hf_model.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    with torch.no_grad():
        expected = hf_model(torch.tensor(IDS)).logits[0]
    assert (scratch_logits(ours, IDS)[0] - expected).abs().max() < 1e-5


def test_a_tied_checkpoint_that_also_stores_its_head(tmp_path):
    write_tiny_checkpoint(tmp_path, seed=3, tie_word_embeddings=True)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    assert torch.equal(scratch_logits(load_model(tmp_path), IDS)[0],
                       scratch_logits(tiny_model(seed=3, tie_word_embeddings=True), IDS)[0])
    tensors["lm_head.weight"][0, 0] += 1.0
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(InputError, match="lm_head.weight differs from model.embed_tokens.weight"):
        load_model(tmp_path)


@pytest.mark.parametrize("text, message", [
    ("{not json", "config.json is not valid JSON"),
    (json.dumps({"vocab_size": "260"}), "field 'vocab_size' must be an integer, got '260'"),
    (json.dumps({"hidden_size": None}), "field 'hidden_size' must be an integer, got None"),
    (json.dumps({"rms_norm_eps": "1e-6"}), "field 'rms_norm_eps' must be a number"),
])
def test_bad_config_json_names_the_file_and_field(tmp_path, text, message):
    write_tiny_checkpoint(tmp_path)
    if text.startswith("{not"):
        (tmp_path / "config.json").write_text(text)
    else:
        edit_config(tmp_path, **json.loads(text))
    with pytest.raises(InputError, match=message) as info:
        load_model(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value)


@pytest.mark.parametrize("cut", [0, 100])
def test_an_empty_or_truncated_safetensors_file_is_named(tmp_path, cut):
    write_tiny_checkpoint(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:cut])
    with pytest.raises(InputError, match=r"model\.safetensors is not a readable safetensors file"):
        load_model(tmp_path)


def test_token_ids_outside_the_vocabulary_are_refused_before_any_state_changes():
    model = tiny_model()
    token_ids, positions = pack([[5, 6, 7], [8, -1]], [0, 0])
    with pytest.raises(InputError, match=r"token id -1 in row 1 at position 1 is outside the vocabulary \[0, 260\)"):
        model(token_ids, positions)
    token_ids, positions = pack([[5, 6], [8]], [0, 0])
    token_ids[1, 1] = -7                               # padding (position -1) may hold anything
    model(token_ids, positions)

    cache = PagedKVCache(model.config, num_blocks=8, block_size=4, dtype=torch.float32)
    with pytest.raises(InputError, match=r"prompt 1: token 260 at position 2"):
        generate(model, [[1, 2], [3, 4, 260]], SamplingParams(max_tokens=2), cache=cache)
    assert cache.allocator.num_free == 8 and not cache.tables

    engine = Engine(model, PagedKVCache(model.config, num_blocks=8, block_size=4, dtype=torch.float32))
    with pytest.raises(InputError, match=r"request 7: token 9999 at position 1"):
        engine.add_request([1, 9999], SamplingParams(max_tokens=2), request_id=7)
    assert not engine.requests and not engine.has_unfinished()


def test_abort_of_an_unknown_request_names_it():
    model = tiny_model()
    engine = Engine(model, PagedKVCache(model.config, num_blocks=8, block_size=4, dtype=torch.float32))
    engine.add_request([1, 2], SamplingParams(max_tokens=2), request_id=3)
    with pytest.raises(KeyError) as info:
        engine.abort(12345)
    assert str(info.value) == "abort: no request 12345 (known ids: 3)"


@pytest.mark.parametrize("temperature, top_p", [(float("nan"), 1.0), (float("inf"), 1.0), (0.5, float("nan"))])
def test_sampling_params_must_be_finite(temperature, top_p):
    with pytest.raises(InputError, match="must be a finite number"):
        SamplingParams(temperature=temperature, top_p=top_p)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "engine", "generate", *args], capture_output=True)


@pytest.mark.parametrize("args, message", [
    (["--prompt", "hi", "--max-tokens", str(10**12), "--cache", "static"], b"past the model's trained context of 4096"),
    (["--prompt", "hi", "--max-tokens", str(10**12), "--cache", "paged"], b"lower --max-tokens to at most 4094"),
    (["--prompt", "hi", "--max-tokens", "0"], b"argument --max-tokens: 0 is not a whole number >= 1"),
    (["--prompt", "hi", "--temperature", "nan"], b"argument --temperature: nan is not a finite number >= 0"),
    (["--prompt", "hi", "--model", "/no/such/checkpoint"], b"no config.json at /no/such/checkpoint"),
])
def test_the_cli_prints_one_error_line_and_exits_2(args, message):
    result = run_cli(*args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(b"error: ") and message in result.stderr
    assert b"Traceback" not in result.stderr and result.stderr.count(b"\n") == 1


def test_the_cli_takes_a_prompt_that_is_not_utf8():
    result = subprocess.run([sys.executable, "-m", "engine", "generate", "--prompt", b"a\xffb", "--max-tokens", "3"],
                            capture_output=True)
    assert result.returncode == 0, result.stderr
    assert b"(length, 3 tokens)" in result.stdout


def test_the_cli_help_documents_the_limits():
    result = run_cli("--help")
    assert b"max_position_embeddings" in result.stdout and b"exits with status 2" in result.stdout
