"""Collection: reading a profile session and running xprof's tools and our own passes on it.

At the root, what runs a collection: `collect` builds the health snapshot from jobs (`jobs`)
that the planner (`plan`) schedules in worker processes (`workers`), from the tools' specs
(`registry`) and our passes' names (`passes`: the two leaves judgement reads too), on the
session `profile_input` finds, with xprof's converters (`xprof_tools`). The sub-packages hold
what the jobs read: `xspace/` the XSpace protobufs, event by event (the column-wise scan, the
timeline and the other passes over events); `hlo/` the HLO text and protos (the parser, the
detectors, facts and digests); `hosts/` one host's share of a fanned-out session and a large
host's time windows (their op_stats combined, the host copies xprof's converters read).
"""
