"""Shared by the storage-tier tests of the tree: a cache + tree on a file store, one request
served end to end with every used byte checked, and a backend whose reads wait on a gate."""
from __future__ import annotations

import threading

import torch

from hicache import HiCacheConfig, build
from hicache.models import deepseek_v4, mha, mla
from hicache.radix import HiRadixCache
from hicache.radix.store import TierStore, store_namespace
from hicache.replay.content import ContentModel, prefix_hashes, state_seed
from hicache.storage import FileBackend
from tests.hicache.radix.test_cache import BIG, seq

MODEL_ID = "test/weights@rev1"  # the served model's identity (--hicache-storage-model-id)
STACKS = {
    "mha_int8": lambda: mha(2, 2, 16, kv_quant="int8", page_size=4),
    "mla": lambda: mla(2, kv_lora_rank=128, rope_dim=64, page_size=4),
    "dsv4": lambda: deepseek_v4([4, 128, 0, 4]),
}


def config(store_dir, **kw) -> HiCacheConfig:
    # write-through: a page reaches the host (then storage) at its insert, as these tests follow it
    base = dict(hicache_ratio=2.0, io_backend="torch", write_policy="write_through", swa_full_tokens_ratio=0.5,
                storage_backend="file",
                storage_dir=str(store_dir), storage_prefetch_policy="wait_complete", storage_model_id=MODEL_ID)
    return HiCacheConfig(**{**base, **kw})


def make(stack, store_dir, device_pages: int = 8, backend_cls=None, **kw):
    """A cache + tree on a file store; ``backend_cls`` swaps in a FileBackend subclass."""
    cfg = config(store_dir, **kw)
    cache = build(stack, device_pages * stack.page_size, cfg, device="cpu", budget=BIG, backend="torch")
    if backend_cls is None:
        return cache, HiRadixCache(cache)  # opens the store the config names
    backends = {p.name: backend_cls(store_namespace(cfg, stack, p.name), store_dir) for p in stack.data_pools()}
    return cache, HiRadixCache(cache, storage=TierStore(cache, backends))


class Served:
    """A request's outcome: where each token of its prefix came from."""

    def __init__(self) -> None:
        self.device = self.host = self.storage = 0
        self.prefetch = None


def serve(cache, tree, content, tokens, snap: bool = True) -> Served:
    """One request: match, prefetch the rest from storage, load back, check every byte
    of the prefix it uses on the device, compute and insert the rest (+ end snapshot)."""
    out, ps, anchor = Served(), tree.page_size, tree.anchor
    hashes = prefix_hashes(tokens, ps)
    m = tree.match_prefix(tokens)
    out.device, first_end = m.device_hit_length, m.last_host_node.end
    p = tree.prefetch(tokens)
    if p is not None:
        out.prefetch = tree.wait_prefetch(p)
        m = tree.match_prefix(tokens)
    tree.inc_lock_ref(m.last_host_node)
    end = m.last_device_node
    if m.last_host_node is not end and tree.load_back(m.last_host_node) is not None:
        tree.wait()
        end = tree.match_prefix(tokens).last_device_node
    prefix = tree.device_slots(end)
    out.host = min(end.end, first_end) - out.device
    out.storage = max(0, end.end - first_end)
    content.verify(anchor, prefix, hashes[:end.end // ps], "prefix")
    if end.state_device:
        content.verify("swa", end.state_device["swa"], [state_seed(hashes[end.end // ps - 1])], "snapshot")
    if tokens.size > prefix.numel():
        new = cache.device_pools[anchor].alloc(tokens.size - prefix.numel())
        if new is None:
            tree.evict(tokens.size - prefix.numel())
            new = cache.device_pools[anchor].alloc(tokens.size - prefix.numel())
        content.fill(anchor, new, hashes[prefix.numel() // ps:])
        extra = None
        if tree.hybrid and snap:
            extra = {"swa": cache.device_pools["swa"].alloc(tree.state_sizes["swa"])}
            content.fill("swa", extra["swa"], [state_seed(hashes[-1])])
        tree.insert(tokens, torch.cat([prefix, new]), extra=extra)
    tree.dec_lock_ref(m.last_host_node)
    tree.wait()
    return out


def forget_all(tree) -> None:
    """Write everything, then empty device and host (the store keeps the pages)."""
    tree.drain_storage()
    tree.evict(1 << 30)
    tree.evict_host(1 << 30)
    assert not tree.root.children


class GatedBackend(FileBackend):
    """A FileBackend whose reads wait on a class-wide gate (a store slower than the scheduler)."""

    gate = threading.Event()
    entered = threading.Event()

    def _get(self, keys, pages):
        type(self).entered.set()
        assert type(self).gate.wait(120), "the test never opened the gate"
        return super()._get(keys, pages)


def reset_gate() -> type[GatedBackend]:
    GatedBackend.gate.clear()
    GatedBackend.entered.clear()
    return GatedBackend


def poll_until_reading(tree, gate) -> None:
    """Poll (the lookup's result starts the reads) until a read waits at the gate."""
    for _ in range(20000):
        tree.poll()
        if gate.entered.wait(0.0005):
            return
    raise AssertionError("no read reached the gate")


def stored(tmp_path, num_pages: int, **kw):
    """A 1-layer MHA tree (page 4) on a store that already holds ``num_pages`` pages of a
    prompt (written by another tree); returns (cache, tree, prompt). ``kw`` go to `make`."""
    stack = mha(1, 1, 8, page_size=4)
    tokens = seq(0, num_pages, 4)
    store_pages(tmp_path, stack, tokens)
    cache, tree = make(stack, tmp_path, **kw)
    return cache, tree, tokens


def store_pages(tmp_path, stack, tokens, device_pages=8):
    cache, tree = make(stack, tmp_path, device_pages=device_pages)
    serve(cache, tree, ContentModel(cache), tokens)
    tree.close()
    cache.close()
