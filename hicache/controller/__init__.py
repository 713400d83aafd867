"""The controller: `HybridCacheController` turns "back up these slots" / "bring these back"
into launches (its parts: `hicache.controller.controller`).

Life of an operation (``write`` = backup D2H, ``load`` = H2D):

    write()/load()     validate (once, here; ``trusted=True`` skips it), allocate
         |             destination slots all-or-nothing,                       Slots
         |             queue (short on any pool -> free what this call took, return None;
         |             an allocator that raises -> free what this call took, re-raise);
         |             write_many()/load_many(): several ops, one allocator call per
         |             pool for all of them, their slots merged once         OpQueue
    start_writing()/start_loading()
         |             merge every queued op of that direction into one batch, derive
         |             its rows (from slots validated above: unchecked), find its size
         |             class's prepared object (the route of its pool set, decided at
         |             construction)                              BatchPlanner, Launcher
         |             launch (loads in groups of layers, each group's layer event
         |             recorded; a raising launch -> free the batch's destination slots,
         |             fail its acks; a load returns None)   Launcher, LayerDoneCounter
    poll()             finished batches -> Acks, in order per direction; a successful
                       write makes its host pages loadable            Slots, BatchStats

Internal hops trust what the controller produced: its own allocators' destination slots
(a server-supplied ``device_alloc`` is checked), and the rows and plan of a batch.

Acks, not CUDA events, say that data is valid: a rolled-back load still signals every
layer event of its consumer (so no waiter hangs), but its device slots were freed.
CPU mode (device ``cpu``) runs the same path synchronously, without streams. Threads:
every public call holds the controller's one re-entrant ``mutex`` (its tree's too), so
any number of threads may call it (docs/DESIGN.md §12).
"""
from hicache.controller.batch import Ack
from hicache.controller.controller import HybridCacheController
from hicache.controller.layer_sync import LayerDoneCounter

__all__ = ["Ack", "HybridCacheController", "LayerDoneCounter"]
