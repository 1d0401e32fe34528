"""Diff: what changed between two analysed sessions, and why.

`compare` builds the diff (`build_diff`, `kpi`) from two `sides`; `explain` names the causes;
`xprof` runs xprof's own diff tool in a worker.
"""
