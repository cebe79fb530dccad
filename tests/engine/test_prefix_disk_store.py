"""The prefix cache's folder on disk, driven as the engine drives it: what gets written, what
supersedes what, and what the byte budget removes."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from mlxserve.engine.prefix_disk import MIN_TOKENS, DiskPrefixStore

FINGERPRINT = "ab" * 32


def kv(tokens: int, layers: int = 2, seed: int = 0) -> list[KVCache]:
    """A model's KV of `tokens` positions (2 heads of 8), as the batch hands it over."""
    mx.random.seed(seed)
    caches = []
    for _ in range(layers):
        cache = KVCache()
        cache.update_and_fetch(
            mx.random.normal((1, 2, tokens, 8)), mx.random.normal((1, 2, tokens, 8))
        )
        caches.append(cache)
    return caches


def ids(n: int, k: int = 0) -> list[int]:
    return [(i * 31 + k * 977) % 5000 for i in range(n)]


def store(folder, budget: int = 1 << 30) -> DiskPrefixStore:
    return DiskPrefixStore(folder, budget, FINGERPRINT)


def kept(disk: DiskPrefixStore, tokens: list[int], seed: int = 0) -> None:
    disk.put(tokens, kv(len(tokens), seed=seed))
    disk.hand_over()


def test_what_is_written_reads_back_the_same(tmp_path):
    tokens = ids(MIN_TOKENS + 10)
    cache = kv(len(tokens))
    disk = store(tmp_path)
    disk.put(tokens, cache)
    disk.close()
    again = store(tmp_path)
    entry, shared = again.best(tokens + [7, 8], beyond=0)
    assert shared == len(tokens)
    loaded = again.load(entry)
    assert [c.offset for c in loaded] == [len(tokens)] * 2
    for a, b in zip(loaded, cache):
        for x, y in ((a.keys, b.keys), (a.values, b.values)):
            assert mx.array_equal(x[..., : a.offset, :], y[..., : b.offset, :]).item()
    again.close()


def test_short_prompts_are_not_written(tmp_path):
    disk = store(tmp_path)
    kept(disk, ids(MIN_TOKENS - 1))
    disk.close()
    assert list(tmp_path.iterdir()) == []


def test_a_newer_prompt_supersedes_one_it_mostly_repeats(tmp_path):
    disk = store(tmp_path)
    first = ids(MIN_TOKENS + 100)
    kept(disk, first)
    kept(disk, first + ids(50, k=1))  # the same conversation, one turn on
    kept(disk, ids(MIN_TOKENS + 100, k=2))  # another one
    disk.close()
    again = store(tmp_path)
    assert again.entries == 2
    assert again.best(first, beyond=0)[1] == len(first)  # from the longer entry
    again.close()


def test_the_budget_removes_the_least_recently_used_of_our_files_only(tmp_path):
    other = tmp_path / "model.safetensors"  # not ours: a folder may hold anything
    other.write_bytes(b"x" * 4096)
    one = MIN_TOKENS * 2 * 2 * 2 * 8 * 4  # a file's arrays' bytes (2 layers, K and V, float32)
    disk = store(tmp_path, budget=int(2.5 * one))
    for k in range(4):
        kept(disk, ids(MIN_TOKENS, k=k), seed=k)
        disk.close()
        disk = store(tmp_path, budget=int(2.5 * one))
    assert disk.entries == 2
    assert disk.best(ids(MIN_TOKENS, k=3), beyond=0)[1] == MIN_TOKENS  # the newest stayed
    assert disk.best(ids(MIN_TOKENS, k=0), beyond=0) is None  # the oldest went
    assert other.exists()
    disk.close()


def test_a_prompt_a_file_already_holds_is_not_written_again(tmp_path):
    tokens = ids(MIN_TOKENS + 300)
    disk = store(tmp_path)
    kept(disk, tokens)
    disk.close()
    (written,) = tmp_path.iterdir()
    before = written.stat().st_mtime_ns
    disk = store(tmp_path)
    kept(disk, tokens[:-10])  # a repeat, its answer cut short
    kept(disk, tokens + ids(5, k=1))  # or a few tokens longer
    disk.close()
    assert list(tmp_path.iterdir()) == [written]
    assert disk.written == 0
    assert written.stat().st_mtime_ns >= before  # touched: recently used
