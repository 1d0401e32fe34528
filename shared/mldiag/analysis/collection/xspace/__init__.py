"""XSpace: what reads xprof's `.xplane.pb` files, event by event and column-wise.

The protobuf wire format (`protobuf`); the memory-mapped scan that decodes each line's events
as NumPy columns (`scan`, `events`) and its writing half, copies of an XSpace with a part of its
events (`write`); and the passes computed from the decoded lines: our step timeline
(`timeline`), xprof's async overlap (`async_overlap`) and event aggregates
(`event_aggregates`) computed column-wise, the instrumentation among a host's Python frames
(`instrumentation`) and the total time of the host op-metrics database (`host_activity`).
"""
