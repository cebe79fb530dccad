"""The prefix cache's folder on disk, driven as the engine drives it: which segments get
written, what supersedes what, and what the byte budget removes."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache

from mlxserve.engine.prefix.disk import BLOCK, MIN_TOKENS, OUR_NAME, DiskPrefixStore

FINGERPRINT = "ab" * 32
LONG = MIN_TOKENS + 76  # four whole segments and a short last one


def kv(tokens: int, layers: int = 2, seed: int = 0, dtype=mx.float32) -> list[KVCache]:
    """A model's KV of `tokens` positions (2 heads of 8), grown as a model grows it (its
    buffers longer than what they hold)."""
    mx.random.seed(seed)
    caches = []
    for _ in range(layers):
        cache = KVCache()
        keys, values = (mx.random.normal((1, 2, tokens, 8)).astype(dtype) for _ in range(2))
        cache.update_and_fetch(keys, values)
        caches.append(cache)
    return caches


def ids(n: int, k: int = 0) -> list[int]:
    return [(i * 31 + k * 977) % 5000 for i in range(n)]


def store(folder, budget: int = 1 << 30) -> DiskPrefixStore:
    return DiskPrefixStore(folder, budget, FINGERPRINT)


def kept(disk: DiskPrefixStore, tokens: list[int], seed: int = 0) -> None:
    disk.put(tokens, kv(len(tokens), seed=seed))
    disk.hand_over()


def files(folder) -> list:
    return sorted(p for p in folder.iterdir() if OUR_NAME.fullmatch(p.name))


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_what_is_written_reads_back_the_same(tmp_path, dtype):
    tokens = ids(LONG)
    cache = kv(len(tokens), dtype=dtype)
    disk = store(tmp_path)
    disk.put(tokens, cache)
    disk.close()
    assert len(files(tmp_path)) == -(-LONG // BLOCK)
    again = store(tmp_path)
    chain, shared = again.best(tokens + [7, 8], beyond=0)
    assert shared == len(tokens)
    loaded, positions = again.load(chain, shared)
    assert positions == len(tokens)
    for a, b in zip(loaded, cache):
        assert a.keys.dtype == dtype and a.offset == len(tokens)
        for x, y in ((a.keys, b.keys), (a.values, b.values)):
            assert mx.array_equal(x[..., : a.offset, :], y[..., : b.offset, :]).item()
    part, shared = again.best(tokens[:600] + [9] * 400, beyond=0)  # a prefix, mid-segment
    loaded, positions = again.load(part, shared)
    assert positions == 600 and loaded[0].keys.shape[2] == 600
    again.close()


def test_short_prompts_are_not_written(tmp_path):
    disk = store(tmp_path)
    kept(disk, ids(MIN_TOKENS - 1))
    disk.close()
    assert list(tmp_path.iterdir()) == []


def test_a_conversations_next_turn_writes_only_what_it_added(tmp_path):
    turn = ids(LONG)
    disk = store(tmp_path)
    kept(disk, turn)
    disk.close()
    assert disk.written == 5
    before = {p.name: p.stat().st_mtime_ns for p in files(tmp_path)}
    disk = store(tmp_path)
    kept(disk, turn + ids(300, k=1))  # the answer and the next message
    disk.close()
    assert disk.written == 2  # the segment the old last one grew into, and a new last one
    after = {p.name: p.stat().st_mtime_ns for p in files(tmp_path)}
    assert len(after) == 6  # the old last segment, which the new one repeats, is gone
    assert sum(before.get(name) == when for name, when in after.items()) == 4
    again = store(tmp_path)
    assert again.best(turn + ids(300, k=1), beyond=0)[1] == LONG + 300
    assert again.best(turn, beyond=0)[1] == LONG
    again.close()


def test_a_prompt_already_on_disk_is_not_written_again(tmp_path):
    disk = store(tmp_path)
    kept(disk, ids(LONG))
    disk.close()
    disk = store(tmp_path)
    kept(disk, ids(LONG))  # a repeat
    kept(disk, ids(LONG - 10))  # a repeat cut short: a segment on disk holds its last one
    disk.close()
    assert disk.written == 0


def test_a_newer_prompt_supersedes_a_waiting_one_it_mostly_repeats(tmp_path):
    disk = store(tmp_path)
    first = ids(LONG)
    kept(disk, first)
    kept(disk, first + ids(50, k=1))  # before the first one was written
    disk.close()
    assert disk.written == 5  # the second's segments only: the first's last one never written


def test_the_budget_removes_chain_ends_first_and_only_our_files(tmp_path):
    other = tmp_path / "model.safetensors"  # not ours: a folder may hold anything
    other.write_bytes(b"x" * 4096)
    disk = store(tmp_path)
    kept(disk, ids(LONG, k=1), seed=1)
    disk.close()
    disk = store(tmp_path)  # later: its files are the more recently used
    kept(disk, ids(LONG, k=2), seed=2)
    disk.close()
    sizes = sorted((p.stat().st_mtime_ns, p.stat().st_size) for p in files(tmp_path))
    ours = sum(size for _, size in sizes)
    # room for all but the older chain's last three segments (its last one is the shortest)
    older = sorted(sizes)[:5]
    budget = ours - sum(size for _, size in older[2:])
    disk = store(tmp_path, budget=budget)  # a lowered budget applies at start
    assert disk.best(ids(LONG, k=2), beyond=0)[1] == LONG  # the newer chain whole
    assert disk.best(ids(LONG, k=1), beyond=0)[1] == 2 * BLOCK  # the older one's start
    assert other.exists()
    disk.close()
