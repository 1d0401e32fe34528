"""Judgement: from a health snapshot to findings.

`triage` computes the headline metrics, the OPTIMAL checks and the ordered hypotheses;
`investigator` turns hypotheses into findings, asking `followups` for more data; `evidence`
names the numbers a finding cites.
"""
