"""The analysis engine: collection, triage, investigation and reports.

xprof's native converters log every step at INFO level through absl; the level is read once,
when the extension loads, so the default is set here, before any xprof import. Their
errors surface to us as exceptions, which each tool result records.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
