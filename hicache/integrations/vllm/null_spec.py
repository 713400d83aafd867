"""`NullOffloadingSpec`: vLLM's offloading connector with no host tier at all (a control).

vLLM 0.32 computes slightly differently (bf16 on CPU) whenever a KV connector is
configured, even one that never moves a byte: measured on SmolLM2, a fresh prompt's
top logprob moves by about 0.03 and near-tied greedy tokens flip against plain vLLM.
Comparing hicache with this spec isolates what hicache itself changes: nothing but
where a returning prefix's KV comes from. Used by the end-to-end test and the benchmark
through ``null_kv_transfer_config()``; imports vLLM (only vLLM's processes load it).
"""
from __future__ import annotations

from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    LookupResult,
    OffloadingManager,
    OffloadingSpec,
    OffloadingWorker,
    PrepareStoreOutput,
    RequestOffloadingContext,
)


class _Nowhere(BlockIDsLoadStoreSpec):
    """An empty destination."""


class _NoHostManager(OffloadingManager):
    def lookup(self, key, req_context):
        return LookupResult.MISS

    def prepare_load(self, keys, req_context):
        raise AssertionError("nothing is ever stored, so nothing can be loaded")

    def prepare_store(self, keys, req_context):
        return PrepareStoreOutput(keys_to_store=[], store_spec=_Nowhere([]), evicted_keys=[])

    def on_new_request(self, req_context):
        return RequestOffloadingContext()


class _NoHostWorker(OffloadingWorker):
    def submit_store(self, job_id, src_spec, dst_spec):
        raise AssertionError("the manager never plans a store")

    def submit_load(self, job_id, src_spec, dst_spec):
        raise AssertionError("the manager never plans a load")

    def get_finished(self):
        return []

    def wait(self, job_ids):
        return None


class NullOffloadingSpec(OffloadingSpec):
    def get_manager(self):
        return _NoHostManager()

    def get_worker(self, kv_caches):
        return _NoHostWorker()
