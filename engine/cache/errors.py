"""The cache's exceptions: each names the problem and the numbers behind it."""


class CacheFull(MemoryError):
    """There is no room for the tokens a sequence asked to reserve."""


class OutOfBlocks(CacheFull):
    """The block pool cannot hand out as many blocks as were asked for."""

    def __init__(self, wanted: int, free: int, what: str = "KV block pool exhausted"):
        self.wanted, self.free = wanted, free
        super().__init__(f"{what}: wanted {wanted} block(s), {free} free")


class BlockRefError(RuntimeError):
    """A block was released or shared while it was free (a double free or a use after free)."""

    def __init__(self, block: int, message: str):
        self.block = block
        super().__init__(message)
