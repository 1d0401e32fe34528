"""A session's op_stats from its hosts' op_stats, combined as xprof combines hosts.

xprof builds a multi-host session's op_stats by converting each host's XSpace in turn and
combining the results (`CombineAllOpStats`, after `StepIntersection`). A fanned-out session
whose hosts are too large for that build has each host's op_stats built elsewhere (in its
own `collect_host`, time window by time window: `op_stats_shards`); this module does xprof's
cross-host step on them, so the tools read the session's numbers as xprof would give them.
What it does, as xprof 2.24.2 does (`convert/op_stats_combiner.cc`,
`utils/step_intersection.cc`, unchanged since 2.23.1), checked field by field against
xprof's own multi-host build in `tests/integration/test_op_stats_hosts.py`:

- **Steps.** Only hosts with a device take part (a host without one is a coordinator,
  unless no host has one). The chief is the host whose steps span the least time; every
  other host's steps are aligned with the chief's by the offset whose steps overlap in time
  the most; the combined steps are those every host has (numbered from 0). Each combined
  step holds every host's per-core step info under a global core id
  (`host index * 1000 + core`), and its HLO metrics summed.
- **Op metrics.** The host, device and flat device databases add up op by op (keyed by
  module id and name, in order of first appearance); `num_cores` adds up on the device
  side; metadata comes from the first host that has it. The complete-steps HLO database is
  rebuilt from the combined steps.
- **Environment.** Host names united, core and task counts added, the device type and
  topology from the last host with a device; the perf environment's peaks and ridge point
  from the last host that has them (its other fields are not carried, as in xprof).
- **The rest.** Core details under global core ids; diagnostics and kernel reports
  concatenated (the reports sorted by total duration, at most 1,000 kept); program names
  united (first wins); performance-counter percentages averaged over the hosts.

Host order matters for ties and for what "first" and "last" mean: hosts are combined in
the order given, which callers keep as xprof's (its session lists XSpaces by file name).
Where xprof breaks a tie between chiefs of equal span by a hash map's order, this takes
the first such host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_DEVICES_PER_HOST = 1000
MAX_KERNEL_REPORTS = 1000
# xprof's HardwareType enum (hardware_types.proto): UNKNOWN_HARDWARE, CPU_ONLY, GPU, TPU.
_CPU_ONLY, _GPU, _TPU = 1, 2, 3


def hardware_type(device_type: str) -> int:
    """xprof's `ParseHardwareType`: the hardware type a run environment's device type names."""
    if "GPU" in device_type:
        return _GPU
    if device_type == "CPU":
        return _CPU_ONLY
    if "TPU" in device_type:
        return _TPU
    return 0


def _has_device(kind: int) -> bool:
    return kind > _CPU_ONLY


def global_core_id(host: int, core: int) -> int:
    return host * MAX_DEVICES_PER_HOST + core


# Steps


def _step_span(step: Any) -> tuple[int, int]:
    """(begin, end) in ps over every core of one step; (0, 0) when it has none or no length."""
    cores = list(step.step_info_per_core.values())
    if not cores:
        return (0, 0)
    begin = min(c.begin_ps for c in cores)
    end = max(c.begin_ps + c.duration_ps for c in cores)
    return (begin, end) if begin < end else (0, 0)


def _best_offset(sub: Sequence[tuple[int, int]], chief: Sequence[tuple[int, int]]) -> int:
    """The offset k (chief index - subordinate index) whose steps overlap in time the most:
    both sequences walked in time order, each overlap credited to its pair's offset. Ties go
    to the first of k = 0, 1, ..., then k = -1, -2, ... (xprof's order)."""
    score: dict[int, int] = {}
    i = j = 0
    while i < len(sub) and j < len(chief):
        (sb, se), (cb, ce) = sub[i], chief[j]
        if se - sb == 0:
            i += 1
            continue
        if ce - cb == 0:
            j += 1
            continue
        score[j - i] = score.get(j - i, 0) + max(0, min(se, ce) - max(sb, cb))
        if se < ce:
            i += 1
        elif ce < se:
            j += 1
        else:
            i, j = i + 1, j + 1
    order = [*range(len(chief)), *range(-1, -len(sub), -1)]
    best, best_score = 0, -1
    for k in order:
        if score.get(k, 0) > best_score:
            best, best_score = k, score.get(k, 0)
    return best


@dataclass
class StepIntersection:
    """The steps every host has: `num_steps` of them, starting at `first[host]` in each host's
    step sequence. `empty` when the hosts' steps do not intersect."""

    num_steps: int = 0
    first: dict[int, int] = field(default_factory=dict)
    empty: bool = False


def step_intersection(step_dbs: dict[int, Any]) -> StepIntersection:
    """xprof's `StepIntersection` (no limit on steps) of host index -> StepDatabaseResult."""
    if not step_dbs:
        return StepIntersection()
    spans = {h: [_step_span(s) for s in db.step_sequence] for h, db in step_dbs.items()}

    def total(h: int) -> int:
        real = [s for s in spans[h] if s[1] > s[0]]
        return max(e for _, e in real) - min(b for b, _ in real) if real else 0

    chief = min(step_dbs, key=lambda h: (total(h), list(step_dbs).index(h)))
    if not spans[chief]:
        return StepIntersection()
    # Per host: (its first aligned index, the chief's first aligned index, how many).
    aligned: dict[int, tuple[int, int, int]] = {}
    for h in step_dbs:
        if h == chief:
            aligned[h] = (0, 0, len(spans[h]))
        elif not spans[h]:
            aligned[h] = (0, 0, 0)
        else:
            k = _best_offset(spans[h], spans[chief])
            sub0, chief0 = (0, k) if k >= 0 else (-k, 0)
            aligned[h] = (sub0, chief0, min(len(spans[h]) - sub0, len(spans[chief]) - chief0))
    begin = max(a[1] for a in aligned.values())
    end = min(a[1] + a[2] for a in aligned.values())
    if begin > end:
        return StepIntersection(empty=True)
    return StepIntersection(num_steps=end - begin, first={
        h: sub0 + (begin - chief0) for h, (sub0, chief0, _) in aligned.items()})


# Op metrics


_ADDED = ("occurrences", "time_ps", "self_time_ps", "normalized_time_ps", "flops",
          "model_flops", "flops_v2", "model_flops_v2", "bytes_accessed", "dma_stall_ps")
_DB_ADDED = ("total_host_infeed_enq_duration_ps",
             "total_host_infeed_enq_start_timestamp_ps_diff", "total_time_ps",
             "total_op_time_ps", "idle_time_ps", "busy_time_ps", "normalized_total_op_time_ps",
             # Added up too in xprof 2.24.2 (not in its 2.23 sources).
             "busy_time_high_confidence_ps", "idle_time_high_confidence_ps")
_METADATA_TEXT = ("long_name", "category", "provenance", "deduplicated_name")
_METADATA_MESSAGES = ("layout", "children", "source_info")


class _DbCombiner:
    """Adds op-metrics databases into `db`, op by op (xprof's `OpMetricsDbCombiner`)."""

    def __init__(self, db: Any) -> None:
        db.SetInParent()  # present even when nothing is added, as in xprof's
        self.db = db
        self.ops: dict[tuple[int, str], Any] = {}

    def add(self, src: Any, update_num_cores: bool = True) -> None:
        db = self.db
        db.precision_stats.SetInParent()
        for name in _DB_ADDED:
            setattr(db, name, getattr(db, name) + getattr(src, name))
        db.precision_stats.compute_16bit_ps += src.precision_stats.compute_16bit_ps
        db.precision_stats.compute_32bit_ps += src.precision_stats.compute_32bit_ps
        for m in src.metrics_db:
            mine = self.ops.get((m.hlo_module_id, m.name))
            if mine is None:
                mine = self.ops[(m.hlo_module_id, m.name)] = db.metrics_db.add(
                    hlo_module_id=m.hlo_module_id, name=m.name)
            _copy_metadata(m, mine)
            _add_metrics(m, mine, update_num_cores)


def _copy_metadata(src: Any, dst: Any) -> None:
    for name in _METADATA_TEXT:
        if not getattr(dst, name):
            setattr(dst, name, getattr(src, name))
    if not dst.fingerprint:
        dst.fingerprint = src.fingerprint
    for name in _METADATA_MESSAGES:
        if not dst.HasField(name) and src.HasField(name):
            getattr(dst, name).CopyFrom(getattr(src, name))
    if not dst.core_type:
        dst.core_type = src.core_type


def _add_metrics(src: Any, dst: Any, update_num_cores: bool) -> None:
    dst.min_time_ps = src.min_time_ps if dst.occurrences == 0 else min(
        src.min_time_ps, dst.min_time_ps)
    dst.is_eager = dst.is_eager or src.is_eager
    dst.autotuned = dst.autotuned or src.autotuned
    for name in _ADDED:
        setattr(dst, name, getattr(dst, name) + getattr(src, name))
    if update_num_cores:
        dst.num_cores += src.num_cores
    _add_memory_accessed(src.memory_accessed_breakdown, dst.memory_accessed_breakdown)
    if src.HasField("vdd_energy_j") or dst.HasField("vdd_energy_j"):
        dst.vdd_energy_j = dst.vdd_energy_j + src.vdd_energy_j


def _add_memory_accessed(src: Any, dst: Any) -> None:
    if not len(src):
        return
    spaces = {(m.memory_space, m.operation_type): m for m in dst}
    for m in src:
        mine = spaces.get((m.memory_space, m.operation_type))
        if mine is None:
            mine = spaces[(m.memory_space, m.operation_type)] = dst.add(
                memory_space=m.memory_space, operation_type=m.operation_type)
        mine.bytes_accessed += m.bytes_accessed


_FLAT_TEXT = ("long_name", "category", "provenance", "deduplicated_name")
_FLAT_IDS = ("op_id", "parent_op_id", "symbol_id", "children_count")
_FLAT_FLAGS = ("has_sc_children", "is_eager", "autotuned")
_FLAT_ADDED = ("occurrences", "time_ps", "self_time_ps", "normalized_time_ps", "flops",
               "model_flops", "flops_v2", "model_flops_v2", "bytes_accessed", "dma_stall_ps")
_FLAT_DB_ADDED = ("total_time_ps", "total_op_time_ps", "idle_time_ps", "busy_time_ps",
                  "normalized_total_op_time_ps")


class _FlatCombiner:
    """Adds flat op-metrics databases (xprof's `FlatOpMetricsDbCombiner`): fusion children
    are appended as they are, the idle op only at the top level, other ops added by module
    id and name."""

    def __init__(self, db: Any) -> None:
        db.SetInParent()  # present even when nothing is added, as in xprof's
        self.db = db
        self.ops: dict[tuple[int, str], Any] = {}

    def add(self, src: Any) -> None:
        db = self.db
        for name in _FLAT_DB_ADDED:
            setattr(db, name, getattr(db, name) + getattr(src, name))
        for m in src.op_instances:
            if m.hlo_name == "IDLE" and m.parent_op_id:
                continue
            if m.is_fusion_child:
                db.op_instances.add().CopyFrom(m)
                continue
            mine = self.ops.get((m.hlo_module_id, m.hlo_name))
            if mine is None:
                mine = self.ops[(m.hlo_module_id, m.hlo_name)] = db.op_instances.add(
                    hlo_module_id=m.hlo_module_id, hlo_name=m.hlo_name)
            for name in _FLAT_IDS + _FLAT_TEXT:
                if not getattr(mine, name):
                    setattr(mine, name, getattr(m, name))
            for name in _FLAT_FLAGS:
                setattr(mine, name, getattr(mine, name) or getattr(m, name))
            if not mine.core_type:
                mine.core_type = m.core_type
            if not mine.HasField("source_info") and m.HasField("source_info"):
                mine.source_info.CopyFrom(m.source_info)
            mine.min_time_ps = m.min_time_ps if mine.occurrences == 0 else min(
                m.min_time_ps, mine.min_time_ps)
            mine.num_cores += m.num_cores
            for name in _FLAT_ADDED:
                setattr(mine, name, getattr(mine, name) + getattr(m, name))
            _add_memory_accessed(m.memory_accessed_breakdown, mine.memory_accessed_breakdown)


# Everything else


def _core_map(host: int, src: Any, dst: Any, message: bool = True) -> None:
    """Copy a core-id-keyed map under global core ids; an id already there stays."""
    for core, value in src.items():
        key = global_core_id(host, core)
        if key in dst:
            continue
        if message:
            dst[key].CopyFrom(value)
        else:
            dst[key] = value


def _run_environment(src: Any, dst: Any) -> None:
    _power_metrics(src, dst)
    for name in src.hostnames:
        dst.hostnames[name] = src.hostnames[name]
    dst.host_count = len(dst.hostnames)
    if src.device_type not in ("CPU", "Device"):
        dst.device_type = src.device_type
        dst.device_core_count += src.device_core_count
        dst.replica_count = max(dst.replica_count, src.replica_count)
        dst.num_cores_per_replica = max(dst.num_cores_per_replica, src.num_cores_per_replica)
        dst.system_topology.CopyFrom(src.system_topology)
    elif not dst.device_type:
        dst.device_type = src.device_type
    if src.hardware_type != dst.hardware_type:
        dst.hardware_type = max(src.hardware_type, dst.hardware_type)
    dst.task_count += src.task_count
    if (dst.host_independent_job_info.profile_duration_ms == 0
            and src.host_independent_job_info.profile_duration_ms > 0):
        dst.host_independent_job_info.CopyFrom(src.host_independent_job_info)
    dst.host_dependent_job_info.extend(src.host_dependent_job_info)
    dst.host_trace_level = src.host_trace_level
    dst.is_training = src.is_training


def _power_metrics(src: Any, dst: Any) -> None:
    mine = src.power_metrics.power_component_metrics
    if not src.HasField("power_metrics") or not len(mine):
        return
    if not dst.HasField("power_metrics") or not len(dst.power_metrics.power_component_metrics):
        dst.power_metrics.CopyFrom(src.power_metrics)
        return
    # Before the source's hosts join the destination's: each side weighted by its hosts.
    n_src, n_dst = len(src.hostnames), len(dst.hostnames)
    w_src, w_dst = n_src / (n_src + n_dst), n_dst / (n_src + n_dst)
    for s in mine:
        for d in dst.power_metrics.power_component_metrics:
            if s.component_name == d.component_name:
                d.max_power = max(s.max_power, d.max_power)
                d.avg_power = s.avg_power * w_src + d.avg_power * w_dst


def _perf_env(src: Any, dst: Any) -> None:
    if src.peak_tera_flops_per_second > 0:
        dst.peak_tera_flops_per_second = src.peak_tera_flops_per_second
    if len(src.peak_bws_giga_bytes_per_second) and not len(dst.peak_bws_giga_bytes_per_second):
        dst.peak_bws_giga_bytes_per_second.extend(src.peak_bws_giga_bytes_per_second)
    if src.ridge_point > 0:
        dst.ridge_point = src.ridge_point


def _tf_functions(src: Any, dst: Any) -> None:
    """TensorFlow functions of each host, by name. JAX traces have none; a name on several
    hosts keeps its first host's figures (xprof recomputes a combined expensive-call share
    that this does not)."""
    for name, fn in src.tf_functions.items():
        if name not in dst.tf_functions:
            dst.tf_functions[name].CopyFrom(fn)


def _kernel_key(r: Any) -> tuple[Any, ...]:
    dims = [*r.grid_dim, 0, 0, 0][:3] + [*r.block_dim, 0, 0, 0][:3]
    return (-r.total_duration_ns, r.name, *dims, r.registers_per_thread, r.static_shmem_bytes,
            r.dynamic_shmem_bytes, r.is_kernel_using_tensor_core, r.is_op_tensor_core_eligible,
            r.op_name)


def combine_hosts(hosts: Sequence[Any]) -> Any:
    """The session's OpStats from each host's (in xprof's host order); see the module notes."""
    from xprof.protobuf import op_stats_pb2

    if not hosts:
        raise ValueError("no op_stats to combine")
    out = op_stats_pb2.OpStats()
    if len(hosts) == 1:
        out.CopyFrom(hosts[0])
        return out
    kinds = [hardware_type(h.run_environment.device_type) for h in hosts]
    no_accelerator = not any(_has_device(k) for k in kinds)

    def worker(i: int) -> bool:
        return no_accelerator or _has_device(kinds[i])

    steps = step_intersection({i: h.step_db for i, h in enumerate(hosts) if worker(i)})
    for n in range(steps.num_steps):
        out.step_db.step_sequence.add(step_num=n)
    out.step_db.num_steps_dropped = 0
    out.step_db.empty_intersect = steps.empty
    # Present even when empty, as xprof's combiner leaves them.
    for present in (out.step_db, out.host_op_metrics_db, out.device_op_metrics_db,
                    out.flat_device_op_metrics_db, out.hlo_metrics_db_complete_steps_only,
                    out.run_environment, out.perf_env, out.diagnostics, out.kernel_stats_db,
                    out.source_stats, out.tf_function_db, out.performance_counter_result):
        present.SetInParent()
    host_db, device_db = _DbCombiner(out.host_op_metrics_db), _DbCombiner(
        out.device_op_metrics_db)
    flat_db = _FlatCombiner(out.flat_device_op_metrics_db)
    complete = _DbCombiner(out.hlo_metrics_db_complete_steps_only)
    per_step = [_DbCombiner(s.hlo_metrics_db) for s in out.step_db.step_sequence]
    for i, src in enumerate(hosts):
        host_db.add(src.host_op_metrics_db, update_num_cores=False)
        device_db.add(src.device_op_metrics_db)
        if src.HasField("flat_device_op_metrics_db"):
            flat_db.add(src.flat_device_op_metrics_db)
        if worker(i):
            if src.step_db.use_incomplete_step:
                out.step_db.use_incomplete_step = True
            first = steps.first.get(i, 0)
            for n, dst in enumerate(out.step_db.step_sequence):
                step = src.step_db.step_sequence[first + n]
                _core_map(i, step.step_info_per_core, dst.step_info_per_core)
                for info in dst.step_info_per_core.values():
                    info.step_num = dst.step_num
                if not src.step_db.use_incomplete_step:
                    complete.add(step.hlo_metrics_db)
                per_step[n].add(step.hlo_metrics_db)
                _core_map(i, step.all_reduce_db_per_core, dst.all_reduce_db_per_core)
                _core_map(i, step.core_id_to_replica_id_map, dst.core_id_to_replica_id_map,
                          message=False)
        _run_environment(src.run_environment, out.run_environment)
        _perf_env(src.perf_env, out.perf_env)
        for name in ("info", "warnings", "errors"):
            getattr(out.diagnostics, name).extend(getattr(src.diagnostics, name))
        out.kernel_stats_db.reports.extend(src.kernel_stats_db.reports)
        for program, name in src.program_id_to_name_map.items():
            if program not in out.program_id_to_name_map:
                out.program_id_to_name_map[program] = name
        out.source_stats.MergeFrom(src.source_stats)
        _tf_functions(src.tf_function_db, out.tf_function_db)
        _core_map(i, src.core_id_to_details, out.core_id_to_details)
        counters = out.performance_counter_result
        counters.matrix_unit_utilization_percent += (
            src.performance_counter_result.matrix_unit_utilization_percent)
        counters.hbm_utilization_percent += src.performance_counter_result.hbm_utilization_percent
        _serving_latency(src, out)
    reports = sorted(out.kernel_stats_db.reports, key=_kernel_key)[:MAX_KERNEL_REPORTS]
    del out.kernel_stats_db.reports[:]
    out.kernel_stats_db.reports.extend(reports)
    out.performance_counter_result.matrix_unit_utilization_percent /= len(hosts)
    out.performance_counter_result.hbm_utilization_percent /= len(hosts)
    return out


def _serving_latency(src: Any, out: Any) -> None:
    if not src.HasField("disaggregated_serving_latency"):
        return
    s, d = src.disaggregated_serving_latency, out.disaggregated_serving_latency
    d.SetInParent()
    if s.HasField("decode_step_time_us"):
        n = s.num_decode_steps + d.num_decode_steps
        if n > 0:
            d.decode_step_time_us.avg = (s.decode_step_time_us.avg * s.num_decode_steps
                                         + d.decode_step_time_us.avg * d.num_decode_steps) / n
            d.num_decode_steps = n
