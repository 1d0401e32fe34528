"""HLO: what reads the compiled programs, as HLO text and as HLO protos.

The parser of HLO module text (`text`); what is read from that text: the detectors of
data-movement bottlenecks (`detectors`), the facts beside them (`facts`: asynchronous copies,
custom calls) and each module's digest for comparing sessions (`digest`); and where each
instruction came from, read from the OpMetadata of xprof's `<module>.hlo_proto.pb` files
(`meta`).
"""
