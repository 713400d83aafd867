"""``OnStream`` and ``LayerDoneCounter`` on stand-in CUDA objects: the calls they make, in
order (what a GPU would see), on a machine without one."""
from __future__ import annotations

import pytest
import torch

from hicache.controller.layer_sync import LayerDoneCounter, OnStream
from transfer_kernels import runtime


class FakeEvent:
    def __init__(self, log: list) -> None:
        self.log = log

    def record(self, stream=None) -> None:
        self.log.append(("record", getattr(stream, "name", None)))


class FakeStream:
    def __init__(self, name: str, device: str, log: list) -> None:
        self.name, self.device, self.log = name, torch.device(device), log
        self.cuda_stream = 1000 + len(name)  # a raw handle

    def wait_event(self, event) -> None:
        self.log.append(("wait", self.name))


@pytest.fixture
def cuda(monkeypatch):
    """torch.cuda stand-ins: the compute stream on cuda:0 is current; calls are logged."""
    log: list = []
    current = {"cuda:0": FakeStream("compute", "cuda:0", log),
               "cuda:1": FakeStream("compute1", "cuda:1", log)}
    state = {"device": "cuda:0"}

    def current_stream(device=None):
        log.append(("current_stream", str(device) if device is not None else None))
        return current[str(device) if device is not None else state["device"]]

    def set_stream(stream):
        log.append(("set_stream", stream.name))
        current[str(stream.device)] = stream

    class Ctx:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            log.append(("ctx_enter", self.stream.name))

        def __exit__(self, *exc):
            log.append(("ctx_exit", self.stream.name))

    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    monkeypatch.setattr(torch.cuda, "set_stream", set_stream)
    monkeypatch.setattr(torch.cuda, "stream", Ctx)
    monkeypatch.setattr(torch.cuda, "Event", lambda: FakeEvent(log))
    return log, state


def test_on_stream_orders_switches_and_restores(cuda):
    log, _ = cuda
    copy = FakeStream("copy", "cuda:0", log)
    on = OnStream(copy)
    for _ in range(2):  # reusable: the same event recorded anew each time
        log.clear()
        with on:
            log.append(("work", None))
            # declared while current: launches take its handle without a lookup
            assert runtime.stream_handle(torch.device("cuda:0")) == copy.cuda_stream
            assert runtime.device_is_current(torch.device("cuda:0"))
        assert log == [("current_stream", None), ("record", "compute"), ("wait", "copy"),
                       ("set_stream", "copy"), ("work", None), ("set_stream", "compute")]
        assert on.outer.name == "compute"
        assert runtime.bind_stream(None) is None  # the declaration ended with the block


def test_on_stream_of_another_device_takes_the_full_switch(cuda):
    log, state = cuda
    state["device"] = "cuda:1"  # the scheduler's current device is not the stream's
    copy = FakeStream("copy", "cuda:0", log)
    with OnStream(copy) as on:
        log.append(("work", None))
    assert on.outer.name == "compute"  # cuda:0's current stream, not cuda:1's
    assert log == [("current_stream", None), ("current_stream", "cuda:0"), ("record", "compute"),
                   ("wait", "copy"), ("ctx_enter", "copy"), ("work", None), ("ctx_exit", "copy")]


def test_layer_records_go_to_the_bound_stream_without_a_lookup(cuda, monkeypatch):
    log, _ = cuda
    counter = LayerDoneCounter(5, "cpu")
    # the CUDA branch on stand-ins: events per slot, records on the bound load stream
    counter._cuda = True
    counter._events = [[FakeEvent(log) for _ in range(5)]]
    counter._waits = [list(counter._events[0])]
    counter.stream = FakeStream("load", "cuda:0", log)
    counter.record_span(0, 2, 0)
    counter.record_span(2, 5, 0)
    assert log == [("record", "load"), ("record", "load")]  # no current_stream lookup
    assert counter.event(1, 0) is counter._events[0][0] and counter.event(4, 0) is counter._events[0][2]
