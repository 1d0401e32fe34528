"""Collection: reading a profile session and running xprof's tools and our own passes on it.

`collect` builds the health snapshot from jobs (`jobs`) run in worker processes (`workers`):
xprof's converters (`xprof_tools`), the column-wise XSpace scan (`xspace_scan`), the timeline
(`timeline`) and the HLO passes (`hlo`, `hlo_meta`, `hlo_digest`, `detectors`).
"""
