"""Judgement: from a health snapshot to findings.

`triage` computes the headline metrics, the OPTIMAL checks and the ordered hypotheses;
`rules/` holds one module per finding category (how it is detected, explained and fixed);
`investigator` turns hypotheses into findings, asking `followups` for more data; `evidence`
names the numbers a finding cites. `model`, `readings`, `roofline`, `detections` and
`context` are what triage and the rules share.
"""
