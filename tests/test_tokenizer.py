"""Tokenizers: bytes by default, a checkpoint's tokenizer.json when it has one."""
from tokenizers import Tokenizer, models, pre_tokenizers

from engine.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer


def test_bytes_round_trip_including_multibyte_text():
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode("paged KV — 块")
    assert all(0 <= i < 256 for i in ids) and len(ids) > len("paged KV — 块")   # multi-byte characters
    assert tokenizer.decode(ids) == "paged KV — 块"
    assert tokenizer.decode(ids + [tokenizer.eos_token_id]) == "paged KV — 块"   # specials are not text


def test_no_tokenizer_json_means_bytes(tmp_path):
    assert isinstance(load_tokenizer(tmp_path), ByteTokenizer)
    assert isinstance(load_tokenizer(None), ByteTokenizer)


def test_a_checkpoints_tokenizer_json_is_used(tmp_path):
    vocab = {"[UNK]": 0, "blocks": 1, "are": 2, "pages": 3}
    inner = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    inner.save(str(tmp_path / "tokenizer.json"))
    tokenizer = load_tokenizer(tmp_path, eos_token_id=3)
    assert isinstance(tokenizer, HFTokenizer) and tokenizer.eos_token_id == 3
    assert tokenizer.encode("blocks are pages") == [1, 2, 3]
    assert tokenizer.encode("blocks are frames") == [1, 2, 0]
    assert tokenizer.decode([1, 2, 3]) == "blocks are pages"
