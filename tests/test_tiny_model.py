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
