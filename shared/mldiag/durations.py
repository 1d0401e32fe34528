"""Durations as gcloud writes them (`gcloud topic datetimes`), for every flag that takes one:
a plain number of seconds, a run of number-unit pairs (`1h5m30s`, `500ms`, `2w`), or ISO 8601
(`PT1M30S`, `P7D`, `P1DT2H`)."""

from __future__ import annotations

import re

_NUMBER = r"(\d+(?:\.\d+)?|\.\d+)"
_COMPOUND = re.compile(rf"{_NUMBER}(us|ms|w|d|h|m|s)", re.IGNORECASE)
_ISO8601 = re.compile(rf"^P(?:{_NUMBER}W)?(?:{_NUMBER}D)?"
                      rf"(?:T(?:{_NUMBER}H)?(?:{_NUMBER}M)?(?:{_NUMBER}S)?)?$", re.IGNORECASE)
_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0,
           "w": 7 * 86400.0}


def parse_duration(text: str) -> float:
    """A duration in seconds: `5` (seconds), `90s`, `500ms`, `1m30s`, `1.5h`, `7d`, `2w`, or
    ISO 8601 such as `PT5S`, `PT1M30S`, `P7D`, `P1DT2H`; ValueError otherwise."""
    word = (text or "").strip()
    bad = ValueError(f"bad duration {text!r} (examples: 5, 2s, 500ms, 1m30s, 7d, PT5S, P7D)")
    if not word:
        raise bad
    if re.fullmatch(_NUMBER, word):
        return float(word)
    iso = _ISO8601.match(word)
    if iso and word.upper() not in ("P", "PT") and not word.upper().endswith("T"):
        weeks, days, hours, minutes, seconds = (float(g or 0) for g in iso.groups())
        return (((weeks * 7 + days) * 24 + hours) * 60 + minutes) * 60 + seconds
    pairs = list(_COMPOUND.finditer(word))
    if not pairs or "".join(m.group(0) for m in pairs) != word:
        raise bad
    return sum(float(m.group(1)) * _UNIT_S[m.group(2).lower()] for m in pairs)
