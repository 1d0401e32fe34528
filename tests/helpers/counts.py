"""How a count of the collection tools reads in words, for the tests that hold prose and
code to the registry's count."""

from __future__ import annotations

import re

# "15 tools", "15 collection tools", "15-tool" (never "4 tool calls" or "4 follow-up tools").
TOOL_COUNT = re.compile(r"\b(\d+)(?: collection| xprof)?(?: tools\b|-tool\b)")
