"""`HintWork`: the hints whose work runs after they return — demote, prefetch, persist —
as jobs through the tree's own transfers and storage side, advanced at each poll.

    demote    backup   the prefix's pages lacking a host copy are backed up (top-down,
                       the write policies' prefix rule); when every one is on the host
                       (acked) the unshared device copies are dropped -> DONE
    persist   backup   the same, for pages neither on the host nor in storage; then
              write    one storage write of them; when the store acks it -> DONE
    prefetch  storage  the part past the tree is read from storage into host slots (a
                       storage prefetch; cancellable) -> to="host": DONE
              load     the host chain is loaded to the device (`load_back`); its ack -> DONE

A ticket is DONE only when the bytes it promises are in place (an ack, never a queued
op); a backup, load or write that fails makes it REFUSED with what stays where it was.
The jobs take no lock of their own: a backup or load in flight freezes its nodes, and a
storage prefetch holds its own lock. A job whose step raises is refused and logged; the
tree's other work goes on. At most `MAX_HINTS_IN_FLIGHT` jobs live at once.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Container

import numpy as np

from hicache.radix.hints.envelope import MAX_HINTS_IN_FLIGHT
from hicache.radix.hints.retains import path_of, private_chain
from hicache.radix.hints.ticket import HintState, HintTicket
from hicache.radix.hybrid import select_match_end
from hicache.radix.node import TreeNode
from hicache.radix.tiers import has_device_child

logger = logging.getLogger(__name__)
_NO_HOST = "{}: the host could not take the prefix (no room, or its backup failed); {}"


@dataclass(slots=True, eq=False)
class Job:
    """One async hint in flight (scheduler thread)."""

    ticket: HintTicket
    action: str
    node: TreeNode | None  # demote / persist: the prefix's last node; prefetch: the load's target
    stage: str  # "backup", "write", "storage", "load" or "wait" (another load of the prefix in flight)
    nodes: list = field(default_factory=list)  # demote: to drop (deepest first); persist: to write
    key: Any = None  # prefetch: the prompt's pages
    to: str = "device"
    prefetch: Any = None  # the storage prefetch
    written: dict = field(default_factory=dict)  # persist: node -> whether its write succeeded
    queued: bool = False  # its backups were queued


class HintWork:
    """The async hints of one tree (module docstring).

    Args:
        transfers: the tree's `Transfers` (backups, loads); evictor: its `Evictor` (demote).
        index: the node structure; storage: returns the `StorageSide` or ``None``.
        may_prefetch: whether a storage prefetch may start at a node (the tree's rule).
        hybrid: the stack has state snapshots; counters: the tree's counters.
        retained: the retains' last nodes (a demote stops below a shorter retained prefix).
    """

    def __init__(self, transfers: Any, evictor: Any, index: Any, storage: Callable[[], Any],
                 may_prefetch: Callable[[TreeNode], bool], hybrid: bool, counters: Counter,
                 retained: Container[TreeNode] = ()) -> None:
        self.transfers, self.evictor, self.index, self.storage = transfers, evictor, index, storage
        self.retained = retained
        self.may_prefetch, self.hybrid, self.counters = may_prefetch, hybrid, counters
        self.jobs: dict[HintTicket, Job] = {}

    def full(self) -> bool:
        return len(self.jobs) >= MAX_HINTS_IN_FLIGHT

    # ---- starting ------------------------------------------------------------------------------
    def demote(self, node: TreeNode, ticket: HintTicket) -> None:
        """Start a demote of the prefix ending at ``node`` (module docstring; the tree has a host tier)."""
        chain = [n for n in private_chain(node, self.retained) if n._device is not None]
        if not chain:
            return _finish(ticket, "no-op: the prefix is not on the device", noop=True)
        if has_device_child(chain[0]) or chain[0].lock_ref:
            return _refuse(ticket, "demote: a running request or a longer prefix on the device holds it")
        job = Job(ticket, "demote", node, "backup", chain)
        self._start(job, lambda: self._demote_step(job))

    def persist(self, node: TreeNode, ticket: HintTicket) -> None:
        """Start a persist of the prefix ending at ``node`` (module docstring; the tree has a storage tier)."""
        storage = self.storage()
        todo = [n for n in reversed(path_of(node)) if not storage.stored(n)]
        if not todo:
            return _finish(ticket, "no-op: the prefix is in storage already", noop=True)
        job = Job(ticket, "persist", node, "backup", todo)
        self._start(job, lambda: self._persist_step(job))

    def prefetch(self, key: np.ndarray, node: TreeNode | None, to: str, ticket: HintTicket) -> None:
        """Start bringing ``key``'s pages up to ``to`` (module docstring; the tree has a host tier)."""
        storage = self.storage()
        job = Job(ticket, "prefetch", node, "storage", key=key, to=to)
        covered = node.end if node is not None else 0
        if covered < key.size and storage is not None:
            job.prefetch = storage.prefetches.start(key, self.may_prefetch)
        if job.prefetch is None and (to == "host" or node is None):
            return _finish(ticket, _nothing_to_read(covered, key.size, storage is not None), noop=True)
        self._start(job, lambda: self._prefetch_step(job))

    def _start(self, job: Job, step: Callable[[], bool]) -> None:
        """Register ``job`` and take its first step (a raising step refuses it, then raises)."""
        self.jobs[job.ticket] = job
        try:
            if step():
                self.jobs.pop(job.ticket, None)
        except BaseException as exc:
            self.jobs.pop(job.ticket, None)
            _refuse(job.ticket, f"{job.action}: failed: {exc}")
            raise

    # ---- each poll -----------------------------------------------------------------------------
    def poll(self) -> None:
        """Advance every job (acks, store writes and prefetches have been taken in)."""
        steps = {"demote": self._demote_step, "persist": self._persist_step, "prefetch": self._prefetch_step}
        for job in list(self.jobs.values()):
            try:
                finished = steps[job.action](job)
            except Exception as exc:  # one job's fault: refused and reported, the others go on
                logger.error("hint %d (%s): a step raised; the hint is refused: %s", job.ticket.id, job.action,
                             exc, exc_info=exc)
                _refuse(job.ticket, f"{job.action}: failed: {exc}")
                finished = True
            if finished:
                self.jobs.pop(job.ticket, None)

    def written(self, segments: list, ok: list[bool]) -> None:
        """A storage write finished: ``segments`` (node, tokens, with snapshot) with each one's success."""
        waiting = [job for job in self.jobs.values() if job.action == "persist" and job.stage == "write"]
        for (node, _tokens, _snap), good in zip(segments, ok):
            for job in waiting:
                if node in job.nodes:
                    job.written.setdefault(node, good)

    # ---- demote --------------------------------------------------------------------------------
    def _backed_up(self, job: Job, then: str) -> bool:
        """Backups of the job's nodes (and of ancestors the prefix rule needs; queued once,
        top-down): whether every one is on the host. One refused or failed refuses the
        ticket (``then``: what that leaves) and the job ends."""
        if not job.queued:
            job.queued = True
            for n in reversed(path_of(job.node)):
                if self.transfers.needs_backup(n) and self.transfers.backup(n) is None:
                    return not _refuse(job.ticket, _NO_HOST.format(job.action, then))
        if any(n.pending is not None for n in job.nodes):
            return False
        if all(n.dead or n._device is None or self.transfers.holds(n) for n in job.nodes):
            return True
        return not _refuse(job.ticket, _NO_HOST.format(job.action, then))

    def _demote_step(self, job: Job) -> bool:
        if not self._backed_up(job, "it stays on the device"):
            return job.ticket.final
        freed = 0
        for n in job.nodes:  # deepest first: each drop makes its parent a device leaf
            if n._device is not None:
                got = self.evictor.demote(n)
                if not got:
                    break
                freed += got
        left = sum(n.num_tokens for n in job.nodes if n._device is not None)
        self.counters["hints_demoted_tokens"] += freed
        return _finish(job.ticket, f"{left} tokens stay on the device: in use" if left else "")

    # ---- persist -------------------------------------------------------------------------------
    def _persist_step(self, job: Job) -> bool:
        storage = self.storage()
        if storage is None:
            return _refuse(job.ticket, "persist: the storage tier was closed")
        if job.stage == "backup":
            if not self._backed_up(job, "nothing was written"):
                return job.ticket.final
            job.stage = "write"
            # a write already running is awaited; a client's persist passes any storage admission
            storage.save([n for n in job.nodes if not n.dead and not storage.holds(n)], frozenset(job.nodes))
            for n in job.nodes:
                if storage.stored(n) or n.dead or n._host is None:  # nothing (more) to write of it
                    job.written.setdefault(n, storage.stored(n))
        if len(job.written) < len(job.nodes):
            return False
        failed = sum(not ok for ok in job.written.values())
        if failed:
            return _refuse(job.ticket, f"persist: {failed} of {len(job.nodes)} nodes were not written "
                                       "(the store refused them, or they left the host first)")
        self.counters["hints_persisted_tokens"] += sum(n.num_tokens for n in job.nodes)
        return _finish(job.ticket)

    # ---- prefetch ------------------------------------------------------------------------------
    def _prefetch_step(self, job: Job) -> bool:
        if job.stage == "storage":
            p = job.prefetch
            if p is not None and not p.done:
                return False
            added = p.result.added_tokens if p is not None else 0
            if job.to == "host":
                why = "" if p is None else p.result.outcome.value
                return _finish(job.ticket, "" if why == "complete" else f"storage: {why}", noop=not added)
            job.stage = "wait"
        if job.stage == "load" and job.node.pending is not None:
            return False
        if job.stage == "load":
            if job.node.dead or job.node._device is None:
                return _refuse(job.ticket, "prefetch: the load to the device failed; the prefix stays on the host")
            self.counters["hints_prefetched_tokens"] += job.node.end
            return _finish(job.ticket)
        return self._load(job)

    def _load(self, job: Job) -> bool:
        """Queue the load of the prefix's host part (the tree as it is now)."""
        path, _ = self.index.walk(job.key)
        d, e = select_match_end(path, self.hybrid)
        if e < 0:
            return _finish(job.ticket, "no-op: not in the tree", noop=True)
        target = path[e]
        if d == e:
            return _finish(job.ticket, "" if job.prefetch else "no-op: on the device already",
                           noop=job.prefetch is None)
        if any(n.pending is not None for n in path[d + 1:e + 1]):
            return False  # another load (or backup) of it in flight: load what is left after it
        if self.transfers.load_back(target) is None:
            return _refuse(job.ticket, "prefetch: the device has no room for the prefix (everything else "
                                       "is in use)")
        job.node, job.stage = target, "load"
        return False

    # ---- the client's calls ----------------------------------------------------------------------
    def cancel(self, ticket: HintTicket) -> bool:
        """Cancel a prefetch (`HintTicket.cancel`)."""
        job = self.jobs.get(ticket)
        if job is None or job.action != "prefetch":
            return False
        if job.stage == "storage" and job.prefetch is not None and not job.prefetch.done:
            self.storage().prefetches.stop(job.prefetch)
            why = "cancelled; the storage read stops (pages read so far land on the host)"
        else:
            why = "cancelled; the load already queued still lands"
        del self.jobs[ticket]
        ticket.settle(HintState.EXPIRED, why)
        return True

    def wait(self, ticket: HintTicket, timeout_s: float | None, step: Callable[[], None]) -> None:
        """Run scheduler steps (``step``: launch queued copies and poll) until ``ticket`` is
        not busy (`HintTicket.wait`)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while ticket.busy:
            step()
            if not ticket.busy:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"hint {ticket.id} ({ticket.action}): still running after {timeout_s} s")
            time.sleep(0.0005)  # storage I/O runs on its threads


def _nothing_to_read(covered: int, tokens: int, storage: bool) -> str:
    """Why a prefetch with no storage read has nothing to bring to the host."""
    if not covered:
        return "no-op: not in the tree" + (" or storage" if storage else "")
    if covered < tokens and not storage:
        return f"no-op: {covered} of {tokens} tokens cached, no storage tier for the rest"
    return "no-op: cached already"


def _refuse(ticket: HintTicket, reason: str) -> bool:
    ticket.settle(HintState.REFUSED, reason)
    return True


def _finish(ticket: HintTicket, reason: str = "", noop: bool = False) -> bool:
    ticket.noop = noop
    ticket.settle(HintState.DONE, reason)
    return True
