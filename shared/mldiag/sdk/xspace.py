"""Merge consecutive XSpace captures of one host into one trace.

The continuous ring buffer records a host's activity as back-to-back windows, each one a
complete serialized `tensorflow.profiler.XSpace`. A snapshot is several windows merged into
one XSpace that XProf analyses like a single capture.

No generated `xplane_pb2` ships with jax or xprof, so the message classes are built at run
time from a descriptor written here (field numbers as in tsl/profiler/protobuf/xplane.proto),
in a private descriptor pool so they cannot clash with another registration of the same
proto in the process.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

_PACKAGE = "tensorflow.profiler"

_F = descriptor_pb2.FieldDescriptorProto
_INT64, _UINT64, _DOUBLE = _F.TYPE_INT64, _F.TYPE_UINT64, _F.TYPE_DOUBLE
_STRING, _BYTES, _MESSAGE = _F.TYPE_STRING, _F.TYPE_BYTES, _F.TYPE_MESSAGE
_OPTIONAL, _REPEATED = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

# (name, number, type, label, message type or None, oneof index or None)
_Field = tuple[str, int, int, int, str | None, int | None]

_MESSAGES: dict[str, tuple[list[_Field], list[str]]] = {
    "XSpace": ([
        ("planes", 1, _MESSAGE, _REPEATED, "XPlane", None),
        ("errors", 2, _STRING, _REPEATED, None, None),
        ("warnings", 3, _STRING, _REPEATED, None, None),
        ("hostnames", 4, _STRING, _REPEATED, None, None),
    ], []),
    "XPlane": ([
        ("id", 1, _INT64, _OPTIONAL, None, None),
        ("name", 2, _STRING, _OPTIONAL, None, None),
        ("lines", 3, _MESSAGE, _REPEATED, "XLine", None),
        ("event_metadata", 4, _MESSAGE, _REPEATED, "XPlane.EventMetadataEntry", None),
        ("stat_metadata", 5, _MESSAGE, _REPEATED, "XPlane.StatMetadataEntry", None),
        ("stats", 6, _MESSAGE, _REPEATED, "XStat", None),
    ], []),
    "XLine": ([
        ("id", 1, _INT64, _OPTIONAL, None, None),
        ("name", 2, _STRING, _OPTIONAL, None, None),
        ("timestamp_ns", 3, _INT64, _OPTIONAL, None, None),
        ("events", 4, _MESSAGE, _REPEATED, "XEvent", None),
        ("duration_ps", 9, _INT64, _OPTIONAL, None, None),
        ("display_id", 10, _INT64, _OPTIONAL, None, None),
        ("display_name", 11, _STRING, _OPTIONAL, None, None),
    ], []),
    "XEvent": ([
        ("metadata_id", 1, _INT64, _OPTIONAL, None, None),
        ("offset_ps", 2, _INT64, _OPTIONAL, None, 0),
        ("duration_ps", 3, _INT64, _OPTIONAL, None, None),
        ("stats", 4, _MESSAGE, _REPEATED, "XStat", None),
        ("num_occurrences", 5, _INT64, _OPTIONAL, None, 0),
    ], ["data"]),
    "XStat": ([
        ("metadata_id", 1, _INT64, _OPTIONAL, None, None),
        ("double_value", 2, _DOUBLE, _OPTIONAL, None, 0),
        ("uint64_value", 3, _UINT64, _OPTIONAL, None, 0),
        ("int64_value", 4, _INT64, _OPTIONAL, None, 0),
        ("str_value", 5, _STRING, _OPTIONAL, None, 0),
        ("bytes_value", 6, _BYTES, _OPTIONAL, None, 0),
        ("ref_value", 7, _UINT64, _OPTIONAL, None, 0),
    ], ["value"]),
    "XEventMetadata": ([
        ("id", 1, _INT64, _OPTIONAL, None, None),
        ("name", 2, _STRING, _OPTIONAL, None, None),
        ("metadata", 3, _BYTES, _OPTIONAL, None, None),
        ("display_name", 4, _STRING, _OPTIONAL, None, None),
        ("stats", 5, _MESSAGE, _REPEATED, "XStat", None),
        ("child_id", 6, _INT64, _REPEATED, None, None),
    ], []),
    "XStatMetadata": ([
        ("id", 1, _INT64, _OPTIONAL, None, None),
        ("name", 2, _STRING, _OPTIONAL, None, None),
        ("description", 3, _STRING, _OPTIONAL, None, None),
    ], []),
}
_MAP_ENTRIES = {"EventMetadataEntry": "XEventMetadata", "StatMetadataEntry": "XStatMetadata"}


def _add_fields(msg: descriptor_pb2.DescriptorProto, fields: Iterable[_Field]) -> None:
    for name, number, ftype, label, type_name, oneof in fields:
        f = msg.field.add(name=name, number=number, type=ftype, label=label)
        if type_name is not None:
            f.type_name = f".{_PACKAGE}.{type_name}"
        if oneof is not None:
            f.oneof_index = oneof


def _build_classes() -> dict[str, Any]:
    fdp = descriptor_pb2.FileDescriptorProto(
        name="mldiag/sdk/xplane.proto", package=_PACKAGE, syntax="proto3")
    for name, (fields, oneofs) in _MESSAGES.items():
        msg = fdp.message_type.add(name=name)
        _add_fields(msg, fields)
        for oneof in oneofs:
            msg.oneof_decl.add(name=oneof)
        if name == "XPlane":
            # proto3 `map<int64, V>` is a repeated nested entry message flagged map_entry.
            for entry, value in _MAP_ENTRIES.items():
                nested = msg.nested_type.add(name=entry)
                nested.options.map_entry = True
                _add_fields(nested, [("key", 1, _INT64, _OPTIONAL, None, None),
                                     ("value", 2, _MESSAGE, _OPTIONAL, value, None)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(
        f"{_PACKAGE}.{name}")) for name in _MESSAGES}


_CLASSES = _build_classes()
XSpace: Any = _CLASSES["XSpace"]
"""The `tensorflow.profiler.XSpace` message class."""


def parse_xspace(blob: bytes, what: str = "input") -> Any:
    """Parse serialized XSpace bytes; ValueError names `what` when they are not an XSpace."""
    if not blob:
        raise ValueError(f"{what} is empty (0 bytes), not an XSpace")
    space = XSpace()
    try:
        space.ParseFromString(blob)
    except DecodeError as e:
        raise ValueError(f"{what} is not a serialized XSpace ({len(blob)} bytes): {e}") from e
    # Arbitrary bytes can decode as unknown fields; a capture always has named planes.
    if not space.planes or not any(p.name for p in space.planes):
        raise ValueError(f"{what} is not a serialized XSpace ({len(blob)} bytes): no planes")
    return space


# The profiler stores line timestamps relative to the capture's start, which the
# "Task Environment" plane records; its stop time must span all windows once merged.
_TASK_ENV_PLANE = "Task Environment"
_PROFILE_START_STAT = "profile_start_time"
_PROFILE_STOP_STAT = "profile_stop_time"


def _profile_start_ns(space: Any) -> int | None:
    for plane in space.planes:
        if plane.name != _TASK_ENV_PLANE:
            continue
        for stat in plane.stats:
            md = plane.stat_metadata.get(stat.metadata_id)
            if md is not None and md.name == _PROFILE_START_STAT:
                return _stat_int(stat)
    return None


def _shift_lines(space: Any, delta_ns: int) -> None:
    for plane in space.planes:
        for line in plane.lines:
            line.timestamp_ns += delta_ns


class _PlaneMerger:
    """Folds planes of later windows into one plane of the first window, in place."""

    def __init__(self, plane: Any) -> None:
        self.plane = plane
        self.stat_by_name = {md.name: sid for sid, md in plane.stat_metadata.items()}
        self.event_by_key: dict[tuple[Any, ...], int] = {}
        for eid, md in plane.event_metadata.items():
            self.event_by_key.setdefault(_event_key(md), eid)
        self.next_stat_id = max(plane.stat_metadata.keys(), default=0) + 1
        self.next_event_id = max(plane.event_metadata.keys(), default=0) + 1
        self.lines: dict[tuple[int, str], Any] = {}
        for line in plane.lines:
            self.lines.setdefault((line.id, line.name), line)

    def merge(self, other: Any) -> None:
        stat_map = self._merge_stat_metadata(other)
        event_map = self._merge_event_metadata(other, stat_map)
        for line in other.lines:
            self._merge_line(line, stat_map, event_map)
        self._merge_plane_stats(other, stat_map)

    def _merge_stat_metadata(self, other: Any) -> dict[int, int]:
        stat_map: dict[int, int] = {}
        for sid, md in other.stat_metadata.items():
            new_id = self.stat_by_name.get(md.name)
            if new_id is None:
                new_id = self.next_stat_id
                self.next_stat_id += 1
                target = self.plane.stat_metadata[new_id]
                target.CopyFrom(md)
                target.id = new_id
                self.stat_by_name[md.name] = new_id
            stat_map[sid] = new_id
        return stat_map

    def _merge_event_metadata(self, other: Any, stat_map: dict[int, int]) -> dict[int, int]:
        event_map: dict[int, int] = {}
        added: list[tuple[Any, Any]] = []
        for eid, md in other.event_metadata.items():
            remapped = type(md)()
            remapped.CopyFrom(md)
            _remap_stats(remapped.stats, stat_map)
            key = _event_key(remapped)
            new_id = self.event_by_key.get(key)
            if new_id is None:
                new_id = self.next_event_id
                self.next_event_id += 1
                self.event_by_key[key] = new_id
                remapped.id = new_id
                self.plane.event_metadata[new_id].CopyFrom(remapped)
                added.append((md, self.plane.event_metadata[new_id]))
            event_map[eid] = new_id
        # child_id refers to other event metadata of the same plane, known only once all are
        # mapped; an id without metadata in its window is kept as it was.
        for src, target in added:
            del target.child_id[:]
            target.child_id.extend(event_map.get(c, c) for c in src.child_id)
        return event_map

    def _merge_line(self, line: Any, stat_map: dict[int, int], event_map: dict[int, int]) -> None:
        key = (line.id, line.name)
        target = self.lines.get(key)
        if target is None:
            target = self.plane.lines.add()
            target.CopyFrom(line)
            self.lines[key] = target
            self._remap_events(target.events, 0, stat_map, event_map)
            return
        if line.timestamp_ns < target.timestamp_ns:
            shift_ps = (target.timestamp_ns - line.timestamp_ns) * 1000
            _shift_events(target.events, shift_ps)
            if target.duration_ps:
                target.duration_ps += shift_ps
            target.timestamp_ns = line.timestamp_ns
        delta_ps = (line.timestamp_ns - target.timestamp_ns) * 1000
        if target.duration_ps or line.duration_ps:
            target.duration_ps = max(target.duration_ps, delta_ps + line.duration_ps)
        last = _max_offset(target.events)
        start = len(target.events)
        target.events.extend(line.events)
        first = self._remap_events(target.events[start:], delta_ps, stat_map, event_map)
        if first is not None and last is not None and first < last:
            _sort_events(target)

    @staticmethod
    def _remap_events(events: Sequence[Any], delta_ps: int, stat_map: dict[int, int],
                      event_map: dict[int, int]) -> int | None:
        """Rebase and re-key copied events in place; returns the smallest offset."""
        remap_events = any(k != v for k, v in event_map.items())
        remap_stats = any(k != v for k, v in stat_map.items())
        smallest: int | None = None
        for event in events:
            if remap_events:
                event.metadata_id = event_map.get(event.metadata_id, event.metadata_id)
            if event.WhichOneof("data") == "offset_ps":
                if delta_ps:
                    event.offset_ps += delta_ps
                if smallest is None or event.offset_ps < smallest:
                    smallest = event.offset_ps
            if remap_stats and event.stats:
                _remap_stats(event.stats, stat_map)
        return smallest

    def _merge_plane_stats(self, other: Any, stat_map: dict[int, int]) -> None:
        present = {s.metadata_id: s for s in self.plane.stats}
        stop_id = self.stat_by_name.get(_PROFILE_STOP_STAT)
        for stat in other.stats:
            new_id = stat_map.get(stat.metadata_id, stat.metadata_id)
            existing = present.get(new_id)
            if existing is None:
                new = self.plane.stats.add()
                new.CopyFrom(stat)
                _remap_stats([new], stat_map)
                present[new_id] = new
            elif new_id == stop_id and (_stat_int(stat) or 0) > (_stat_int(existing) or 0):
                # The merged capture ends when the last window does.
                existing.CopyFrom(stat)
                existing.metadata_id = new_id


def _stat_int(stat: Any) -> int | None:
    # Integers kept exact: epoch nanoseconds do not fit a double.
    kind = stat.WhichOneof("value")
    if kind in ("uint64_value", "int64_value"):
        return int(getattr(stat, kind))
    if kind == "double_value":
        return int(stat.double_value)
    return None


def _event_key(md: Any) -> tuple[Any, ...]:
    # Metadata is shared only when it is the same in every respect, so an op's stats
    # (program id, HLO op text...) can never be attributed to a different op of the same name.
    return (md.name, md.display_name, md.metadata,
            tuple(s.SerializeToString(deterministic=True) for s in md.stats))


def _remap_stats(stats: Iterable[Any], stat_map: dict[int, int]) -> None:
    for stat in stats:
        stat.metadata_id = stat_map.get(stat.metadata_id, stat.metadata_id)
        if stat.WhichOneof("value") == "ref_value":
            # A ref_value names a stat metadata entry whose name is the string value.
            stat.ref_value = stat_map.get(stat.ref_value, stat.ref_value)


def _shift_events(events: Iterable[Any], delta_ps: int) -> None:
    for event in events:
        if event.WhichOneof("data") == "offset_ps":
            event.offset_ps += delta_ps


def _max_offset(events: Iterable[Any]) -> int | None:
    offsets = [e.offset_ps for e in events if e.WhichOneof("data") == "offset_ps"]
    return max(offsets, default=None)


def _sort_events(line: Any) -> None:
    # Only when a window starts before the end of the one merged before it (clock steps).
    line.events.sort(key=lambda e: e.offset_ps if e.WhichOneof("data") == "offset_ps" else -1)


def _extend_unique(target: Any, values: Iterable[str]) -> None:
    seen = set(target)
    for v in values:
        if v not in seen:
            target.append(v)
            seen.add(v)


def merge_xspaces(blobs: Sequence[bytes]) -> bytes:
    """Merge serialized XSpaces of one host, given in time order, into one serialized XSpace.

    Planes are matched by name and lines by (id, name); the events of later windows are
    rebased onto the first window's line timestamps, and event/stat metadata are re-keyed so
    ids do not collide. Raises ValueError when there is no input or a blob is not an XSpace.
    """
    if not blobs:
        raise ValueError("no XSpace to merge")
    spaces = [parse_xspace(b, f"window {i}") for i, b in enumerate(blobs)]
    merged = spaces[0]
    if len(spaces) == 1:
        return bytes(blobs[0])
    mergers: dict[str, list[_PlaneMerger]] = {}
    for plane in merged.planes:
        mergers.setdefault(plane.name, []).append(_PlaneMerger(plane))
    next_plane_id = max((p.id for p in merged.planes), default=0) + 1
    used_plane_ids = {p.id for p in merged.planes}
    base_ns = _profile_start_ns(merged)
    for space in spaces[1:]:
        start_ns = _profile_start_ns(space)
        if base_ns is not None and start_ns is not None:
            _shift_lines(space, start_ns - base_ns)
        seen: dict[str, int] = {}
        for plane in space.planes:
            # Same-named planes of one window pair up with the first window's in order.
            index = seen.get(plane.name, 0)
            seen[plane.name] = index + 1
            candidates = mergers.setdefault(plane.name, [])
            if index < len(candidates):
                candidates[index].merge(plane)
                continue
            new = merged.planes.add()
            new.CopyFrom(plane)
            if new.id in used_plane_ids:
                new.id = next_plane_id
            used_plane_ids.add(new.id)
            next_plane_id = max(next_plane_id, new.id + 1)
            candidates.append(_PlaneMerger(new))
        _extend_unique(merged.errors, space.errors)
        _extend_unique(merged.warnings, space.warnings)
        _extend_unique(merged.hostnames, space.hostnames)
    hostnames = list(dict.fromkeys(merged.hostnames))
    del merged.hostnames[:]
    merged.hostnames.extend(hostnames)
    result: bytes = merged.SerializeToString()
    return result
