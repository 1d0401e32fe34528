"""Hosts and windows: what reads one host of a session, or one time window of a large host.

One host's share of a fanned-out collection (`share`, its jobs `jobs`) and the session's
op_stats combined from the hosts' as xprof combines hosts (`op_stats_hosts`); a large host's
time windows, their op_stats combined as one host (`op_stats_shards`) and shared by the collect
job's tasks (`window_tasks`); and the copies of a host's XSpace that xprof's converters read
instead of its whole trace (`copies`), among them its allocators' peak events (`memory_peaks`),
whose memory profile is read allocator by allocator (`memory_allocators`).
"""
