"""The trained tiny model (engine/tiny_model/): the committed checkpoint is the one `make tiny-model`
records, its training run reproduces, and it writes the course's words."""
import hashlib
import json
import re
import string

import pytest
import torch

from engine.cache.paged import PagedKVCache
from engine.checkpoint import TRAINED_DIR, trained_config, trained_model
from engine.config import ModelConfig
from engine.generate import generate, scratch_logits
from engine.sampling import SamplingParams
from engine.tokenizer import ByteTokenizer
from engine.tools import train_tiny

RECORD = json.loads((TRAINED_DIR / train_tiny.RECORD).read_text())
CORPUS = TRAINED_DIR / "corpus.txt"


@pytest.fixture(autouse=True)
def one_thread():
    """Models this small run fastest on one thread (on a shared CPU more threads only wait)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_committed_checkpoint_is_the_recorded_one():
    weights = TRAINED_DIR / "model.safetensors"
    assert sha256(weights) == RECORD["model_sha256"], "model.safetensors is not what make tiny-model recorded"
    assert weights.stat().st_size == RECORD["model_bytes"] <= 2_100_000
    assert sha256(CORPUS) == RECORD["corpus_sha256"], "corpus.txt changed since the model was trained on it"
    assert RECORD["settings"] == train_tiny.Settings().__dict__, "train_tiny's settings are not the recorded run's"
    assert RECORD["kernels"] == train_tiny.PINNED, "the recorded run did not pin the CPU kernels"
    hf = json.loads((TRAINED_DIR / "config.json").read_text())
    assert ModelConfig.from_json(TRAINED_DIR, strict=True) == trained_config()
    assert hf == trained_config().to_hf() | {"torch_dtype": "bfloat16"}


def test_the_corpus_is_plain_ascii_prose():
    text = CORPUS.read_text()
    assert text.isascii() and len(text) > 100_000
    assert "```" not in text and "import torch" not in text       # prose, the code cells left out


def test_the_training_run_reproduces_its_first_steps():
    """The first 3 steps of the recorded run, from the seed: the same losses (one thread, deterministic)."""
    settings = train_tiny.Settings(**(RECORD["settings"] | {"steps": 3}))
    torch.set_num_threads(2)
    _, losses = train_tiny.train(CORPUS, settings, progress=False)
    assert torch.get_num_threads() == 2 and not torch.are_deterministic_algorithms_enabled()   # restored
    assert losses == pytest.approx(RECORD["first_losses"][:3], abs=1e-4)
    assert losses[0] == pytest.approx(5.56, abs=0.1)    # ln(260): an untrained model guesses uniformly


def test_training_starts_again_with_the_kernels_pinned(monkeypatch):
    """torch reads the pins when it loads, so an unpinned run starts a fresh interpreter with them set."""
    started = []
    monkeypatch.setattr(train_tiny.os, "execve", lambda path, argv, env: started.append((argv, env)))
    monkeypatch.setattr(train_tiny, "has_avx2", lambda: True)
    for name in train_tiny.PINNED:
        monkeypatch.delenv(name, raising=False)
    train_tiny.pinned_or_restart(["--steps", "3"])
    (argv, env), = started
    assert argv[1:] == ["-m", "engine.tools.train_tiny", "--steps", "3"]
    assert {name: env[name] for name in train_tiny.PINNED} == train_tiny.PINNED
    for name, value in train_tiny.PINNED.items():
        monkeypatch.setenv(name, value)
    train_tiny.pinned_or_restart([])                  # pinned already: it goes on in this process
    assert len(started) == 1


def test_a_different_seed_is_a_different_run():
    settings = train_tiny.Settings(**(RECORD["settings"] | {"steps": 1, "seed": 1}))
    _, losses = train_tiny.train(CORPUS, settings, progress=False)
    assert losses[0] != pytest.approx(RECORD["first_losses"][0], abs=1e-6)


def test_it_predicts_the_course_far_better_than_chance():
    ids = list(CORPUS.read_bytes()[:512])
    logits = scratch_logits(trained_model(), [ids])[0][:-1]
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:])).item()
    assert loss < 2.0, f"loss {loss:.2f} nats per byte on its own corpus (chance: 5.56)"


@pytest.mark.parametrize("prompt", ["The block table maps", "A paged KV cache", "Copy-on-write"])
def test_greedy_text_is_words_of_the_course(prompt):
    model = trained_model()
    cache = PagedKVCache(model.config, num_blocks=8, block_size=16)        # the engine's own decode path
    out = generate(model, [ByteTokenizer().encode(prompt)], SamplingParams(max_tokens=48), cache)[0]
    text = ByteTokenizer().decode(out.tokens)
    assert all(c in string.printable for c in text), f"{text!r} is not printable ASCII"
    words = re.findall(r"[A-Za-z]+", text)
    vocabulary = set(re.findall(r"[A-Za-z]+", CORPUS.read_text()))
    known = [w for w in words[:-1] if w in vocabulary]        # the last word may be cut off
    assert len(words) >= 5 and len(known) >= 0.8 * (len(words) - 1), f"{prompt!r} -> {text!r}"


def test_the_readme_quotes_what_the_engine_writes(capsys):
    """The README's trained-model examples are the engine's output on the committed weights, not typed in."""
    import ast
    readme = (TRAINED_DIR.parents[1] / "README.md").read_text()
    quoted = re.findall(r"^('.*') -> (['\"].*['\"]) \(length, 48 tokens\)$", readme, flags=re.M)
    assert len(quoted) >= 3, "the README shows the trained model's text for three prompts"
    from engine.tools.cli import main
    argv = ["generate", "--max-tokens", "48"]
    for prompt, _ in quoted:
        argv += ["--prompt", ast.literal_eval(prompt)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    for prompt, text in quoted:
        assert f"{prompt} -> {text} (length, 48 tokens)" in printed, f"README: {prompt} -> {text}; engine: {printed}"
