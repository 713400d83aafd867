"""Time, not only hits: device profiles, prefill FLOPs, link backlogs and the load-or-recompute gate.

    profile.py    `DeviceProfile`: links, stores and prefill rates of a device (shipped JSON)
    prefill.py    `PrefillModel`: seconds to prefill n new tokens after c cached ones
    footprint.py  `Footprint`: bytes a load moves per token and per snapshot
    decide.py     `LoadCost` (a load plan's time) and `LoadGate` (the cut that pays)
    links.py      the links' backlog: a server's (`LiveBacklog`) or simulated (`LinkClocks`)
    timeline.py   `Timeline`: a replay's per-request estimates of time to first token
    make.py       `make_cost`: the cost model of a preset on a profile; `live_gate`: a server tree's gate
"""
from hicache.cost.decide import LOAD_POLICIES, Cut, LoadCost, LoadGate
from hicache.cost.footprint import Footprint
from hicache.cost.links import LinkClocks, LiveBacklog
from hicache.cost.make import live_gate, make_cost, preset_shape
from hicache.cost.prefill import PrefillModel
from hicache.cost.profile import (DEFAULT_PROFILE, PROFILE_NAMES, DeviceProfile, Link, PrefillRates, Store,
                                  load_profile, profile_dict, profile_from_dict, save_profile)
from hicache.cost.timeline import SUMMARY_KEYS, RequestTime, Timeline

__all__ = ["Cut", "DEFAULT_PROFILE", "DeviceProfile", "Footprint", "LOAD_POLICIES", "Link", "LinkClocks",
           "LiveBacklog", "LoadCost", "LoadGate", "PROFILE_NAMES", "PrefillModel", "PrefillRates", "RequestTime",
           "SUMMARY_KEYS", "Store", "Timeline", "live_gate", "load_profile", "make_cost", "preset_shape",
           "profile_dict", "profile_from_dict", "save_profile"]
