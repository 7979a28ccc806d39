"""Tokenizers: raw UTF-8 bytes by default, a checkpoint's tokenizer.json when it has one."""
from __future__ import annotations

from pathlib import Path


class ByteTokenizer:
    """Token id = byte value (0-255); ids 256 and 257 are begin and end of sequence."""

    bos_token_id, eos_token_id = 256, 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_bytes(self, raw: bytes) -> list[int]:
        """Bytes as they are, UTF-8 or not (a command line may carry any)."""
        return list(raw)

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A Hugging Face tokenizer.json, read with the `tokenizers` library."""

    def __init__(self, path: str | Path, eos_token_id: int | None = None):
        from tokenizers import Tokenizer
        self.inner = Tokenizer.from_file(str(path))
        self.eos_token_id = eos_token_id

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.inner.decode(ids)


def load_tokenizer(checkpoint: str | Path | None = None, eos_token_id: int | None = None):
    """The checkpoint's tokenizer.json if there is one, else bytes."""
    if checkpoint is not None and (Path(checkpoint) / "tokenizer.json").exists():
        return HFTokenizer(Path(checkpoint) / "tokenizer.json", eos_token_id)
    return ByteTokenizer()
