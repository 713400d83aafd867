"""The auto backend: its decision table, the decision cache, the table file."""
from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

from tests.transfer_kernels.pools import DEVICE, assert_copied, make_pool, random_map, snapshot
from transfer_kernels import AutoBackend, CopyJob, CopyPlan, RowTable, copy_rows_batch, make_plan
from transfer_kernels.backends import auto as auto_mod
from transfer_kernels import tuning
from transfer_kernels.backends import auto_table
from transfer_kernels.backends.auto import choose
from transfer_kernels.backends.auto_table import SEED, AutoTable, Rule

MIXED = [((8,), torch.bfloat16), ((3, 4), torch.float32), ((5,), torch.uint8)]


def _job(gen, row_bytes, src_rows, dst_rows, layout="layer_first"):
    # CPU tables on every machine: these tests are about the rule and pure arithmetic.
    pool = make_pool(gen, 2, 16, [((row_bytes,), torch.uint8)], layout, device="cpu", pin=False)
    return pool, CopyJob(pool.host_table, pool.device_table, src_rows, dst_rows)


def test_cpu_routes_by_row_bytes_not_runs_nor_page_spans(gen):
    # No run analysis: a run of small rows is still small pieces; big rows take memcpy.
    small = tuning.CPU_COPY_ENGINE_MIN_PIECE_BYTES // 4
    _, scattered = _job(gen, small, [0, 5, 9], [1, 2, 3])
    _, run = _job(gen, small, [4, 5, 6, 7], [0, 1, 2, 3])
    _, big = _job(gen, tuning.CPU_COPY_ENGINE_MIN_PIECE_BYTES, [3, 1], [0, 9])
    _, spans = _job(gen, small, [3, 1], [0, 9], "page_first")  # 2-layer pages: spans of 2 rows
    plan = make_plan([scattered, run, big, spans])
    assert [choose(j, plan) for j in plan.jobs] == ["torch", "torch", "copy_engine", "torch"]
    assert auto_mod.traits(plan.jobs[3], plan)[2:5] == ("stage", small, 2 * small)


def test_mixed_batch_uses_each_backend_once(gen):
    small_pool, small = _job(gen, 64, [0, 5, 9], [1, 2, 3])
    big_pool, big = _job(gen, tuning.CPU_COPY_ENGINE_MIN_PIECE_BYTES, [3, 1], [0, 9])
    befores = [(snapshot(j.src), snapshot(j.dst)) for j in (small, big)]
    auto = AutoBackend(table=SEED)
    copy_rows_batch([small, big], backend=auto)
    assert auto.launches == 1  # one launch (group) of auto's, counted once (`Launches.launch`)
    assert auto.inner["torch"].launches == 1 and auto.inner["copy_engine"].launches == 1
    for job, (sb, db) in zip((small, big), befores):
        assert_copied(job.src, job.dst, sb, db, job.src_rows, job.dst_rows)


@pytest.mark.parametrize("row_bytes,rows,dense,want", [
    (1152, [0, 3, 7], True, "triton"),  # small scattered pieces: SM kernel
    (4096, list(range(16)), True, "triton"),  # one 64 KiB run: runs are not analysed
    (256 * 1024, [0, 3], True, "triton"),  # big dense rows: not the host-bound copy engine
    (256 * 1024, [0, 3], False, "triton"),  # strided host rows (the device side is no GPU)
])
def test_cuda_rule_without_a_gpu(gen, monkeypatch, row_bytes, rows, dense, want):
    # The CUDA branch of the rule is pure arithmetic: exercise it with pinned-looking tables.
    monkeypatch.setattr(RowTable, "is_pinned", property(lambda self: True))
    _, job = _job(gen, row_bytes, rows, rows, "layer_first" if dense else "page_first")
    plan = make_plan([job])
    fake_cuda = CopyPlan(jobs=plan.jobs, device=torch.device("cuda", 0))
    assert choose(fake_cuda.jobs[0], fake_cuda) == want


def test_size_class_bounds(gen):
    # A rule bounded by job bytes: rows 1 and 2-3 are different size classes.
    table = AutoTable((Rule("cpu", "copy_engine", max_job_bytes=2 * 64), Rule("cpu", "torch")))
    _, one = _job(gen, 32, [0], [1])  # 1 row x 64 B (2 layers)
    _, three = _job(gen, 32, [0, 2, 4], [1, 3, 5])  # class of 2 rows: 128 B
    _, four = _job(gen, 32, [0, 2, 4, 6], [1, 3, 5, 7])  # class of 4 rows: 256 B
    plan = make_plan([one, three, four])
    assert [choose(j, plan, table) for j in plan.jobs] == ["copy_engine", "copy_engine", "torch"]


@pytest.mark.parametrize("use", auto_table.CHOICES[torch.device(DEVICE).type])
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
@pytest.mark.parametrize("via", ["execute", "prepare"])
def test_every_choice_copies_the_reference_bytes(gen, use, direction, via):
    pool = make_pool(gen, 3, 12, MIXED, "page_first")
    src, dst = ((pool.host_table, pool.device_table) if direction == "h2d"
                else (pool.device_table, pool.host_table))
    src_rows, dst_rows = random_map(gen, 12, 12, 5)
    auto = AutoBackend(table=AutoTable((Rule(torch.device(DEVICE).type, use),)))
    before = snapshot(src), snapshot(dst)
    if via == "execute":
        copy_rows_batch([(src, dst, src_rows, dst_rows)], backend=auto)
    else:
        plan = make_plan([(src, dst, src_rows, dst_rows)])
        prepared = auto.prepare(plan, [[(0, 0)], [(0, 1), (0, 2)]])
        for g in range(prepared.num_groups):
            prepared.launch(g)
    assert_copied(src, dst, *before, src_rows, dst_rows)
    staged = auto.inner["dma"].copies > 0
    assert staged == (use == "dma")  # a page_first host side is staged when dma is chosen


def test_second_identical_batch_is_a_cache_hit(gen, monkeypatch):
    pool = make_pool(gen, 3, 12, MIXED, "page_first")
    auto = AutoBackend()
    copy_rows_batch([(pool.host_table, pool.device_table, [1, 4, 7], [0, 2, 3])], backend=auto)
    assert auto.analyses == 1

    def no_analysis(*args):
        raise AssertionError("analysed again")

    monkeypatch.setattr(auto_mod, "traits", no_analysis)
    monkeypatch.setattr(auto_mod, "decide", no_analysis)
    before = snapshot(pool.host_table), snapshot(pool.device_table)
    # other rows, same tables and size class (3 rows): served from the cache
    copy_rows_batch([(pool.host_table, pool.device_table, [9, 2, 5], [6, 8, 11])], backend=auto)
    assert auto.analyses == 1
    assert_copied(pool.host_table, pool.device_table, *before, [9, 2, 5], [6, 8, 11])


def test_table_json_round_trip(tmp_path):
    table = AutoTable(SEED.rules + (Rule("cuda", "triton", path="strided", min_piece_bytes=1,
                                         max_piece_bytes=9, min_span_bytes=0, max_span_bytes=0,
                                         min_job_bytes=0, max_job_bytes=5, dir="d2h"),),
                      source="test")
    path = table.save(tmp_path / "t.json")
    assert auto_table.load(path) == table
    assert auto_table.load(SEED.save(tmp_path / "seed.json")) == SEED


@pytest.mark.parametrize("doc,field", [
    ({"format": "x", "version": 1, "rules": []}, "format/version"),
    ({"format": "hicache-auto-table", "version": 1, "rules": []}, "rules"),
    ({"format": "hicache-auto-table", "version": 1, "rules": [{"device": "tpu", "use": "dma"}]},
     "rules[0].device"),
    ({"format": "hicache-auto-table", "version": 1,
      "rules": [{"device": "cpu", "use": "torch"}, {"device": "cuda", "use": "torch"}]}, "rules[1].use"),
    ({"format": "hicache-auto-table", "version": 1,
      "rules": [{"device": "cuda", "use": "dma", "min_piece_bytes": -1}]}, "rules[0].min_piece_bytes"),
    ({"format": "hicache-auto-table", "version": 1,
      "rules": [{"device": "cuda", "use": "dma", "pth": "stage"}]}, "rules[0].pth"),
    ({"format": "hicache-auto-table", "version": 1,
      "rules": [{"device": "cuda", "use": "dma", "dir": "up"}]}, "rules[0].dir"),
    ({"format": "hicache-auto-table", "version": 1,
      "rules": [{"device": "cuda", "use": "dma", "min_job_bytes": 9, "max_job_bytes": 3}]},
     "rules[0].max_job_bytes"),
    ({"format": "hicache-auto-table", "version": 1,
      "rules": [{"device": "cuda", "use": "dma", "max_span_bytes": True}]}, "rules[0].max_span_bytes"),
])
def test_bad_table_refused_naming_file_and_field(tmp_path, doc, field):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}: {field}:")):
        auto_table.load(path)


def test_env_names_the_table_and_refuses_a_bad_one(tmp_path, monkeypatch):
    good = AutoTable((Rule("cpu", "copy_engine"),), source="env").save(tmp_path / "good.json")
    monkeypatch.setenv(auto_table.ENV, str(good))
    assert AutoBackend().table.source == "env"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    monkeypatch.setenv(auto_table.ENV, str(bad))
    with pytest.raises(ValueError, match="^" + re.escape(f"HICACHE_AUTO_TABLE: {bad}: line 1: not valid JSON")):
        AutoBackend()


def test_direction_rules(gen, monkeypatch):
    # A host table facing a (claimed) CUDA table: h2d one way, d2h the other.
    monkeypatch.setattr(RowTable, "is_pinned", property(lambda self: True))
    pool = make_pool(gen, 2, 8, [((64,), torch.uint8)], "layer_first", device="cpu", pin=False)
    dev = dataclasses.replace(pool.device_table, device=torch.device("cuda", 0), _cache={})
    table = AutoTable((Rule("cuda", "copy_engine", dir="d2h"), Rule("cuda", "triton")))
    cuda = torch.device("cuda", 0)
    for src, dst, want in ((pool.host_table, dev, ("h2d", "triton")),
                           (dev, pool.host_table, ("d2h", "copy_engine"))):
        job = make_plan([(pool.host_table, pool.device_table, [1, 2], [3, 4])]).jobs[0]
        job = dataclasses.replace(job, src=src, dst=dst)
        plan = CopyPlan(jobs=(job,), device=cuda)
        assert (auto_mod.traits(job, plan).dir, choose(job, plan, table)) == want
