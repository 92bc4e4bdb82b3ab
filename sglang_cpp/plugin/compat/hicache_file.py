"""HiCache's L3 file backend under PP (`--hicache-storage-backend file`).

SGLang 0.5.23's `HiCacheFile.__init__` creates its directory with `if not os.path.exists(path) and
tp_rank == 0: os.makedirs(path)`. Under PP every stage has a TP rank 0, so two processes race between
the check and the create, and the loser dies at startup with `FileExistsError` (seen on the CPU PP=2
test server, about one start in two). Not CPU-specific: the hook runs on every device.
"""
from __future__ import annotations


def HiCacheFile_init(original_fn, self, *args, **kwargs):
    """AROUND HiCacheFile.__init__: when another PP stage created the directory between SGLang's check
    and its makedirs, build again; the directory now exists, so the check skips the create."""
    try:
        return original_fn(self, *args, **kwargs)
    except FileExistsError:
        return original_fn(self, *args, **kwargs)
