"""`mldiag machine-learning-run create|update|delete|list|describe|start-continuous-profiling|
stop-continuous-profiling`: gcloud's names for `runs create|list|describe`, a run's deletion
and `continuous start|stop`, with gcloud's flags.

What a flag sets in mldiag: `--run-group` the run group; `--gcs-path` the storage prefix;
`--configs-hardware|software|user K=V,...` the run's configs; `--display-name`, `--labels`,
`--orchestrator`, `--run-phase`, `--tools` and the `--gke-*` workload details are kept among
the configs under those names (mldiag has no separate fields for them). `--labels
on_demand_xprof=enabled` marks the run on-demand, as upstream's SDK does. `update` replaces
the registration (gcloud's full update); `--etag` is accepted and, as mldiag keeps no etags,
not compared. `delete` forgets the run, its targets and sessions; the profiles stay in the
bucket.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from mldiag.bootstrap import control_plane
from mldiag.cli import _control, _gcloud, continuous, runs
from mldiag.cli._home import add_home
from mldiag.errors import MldiagError
from mldiag.model import RunRecord, check_name

VERBS = {"start-continuous-profiling": "start", "stop-continuous-profiling": "stop"}
# gcloud flags kept among the configs, by the names upstream's runs carry them.
DETAILS = ("display_name", "orchestrator", "run_phase", "tools", "gke_cluster_name", "gke_kind",
           "gke_namespace", "gke_workload_create_time", "gke_workload_name")


def register(sub: Any) -> None:
    p = sub.add_parser("machine-learning-run", help="create, update, delete, list and "
                       "describe runs, start and stop continuous profiling (gcloud alpha "
                       "mldiagnostics machine-learning-run)")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    _add_write_arguments(verbs.add_parser("create", help="register a run"))
    u = verbs.add_parser("update", help="replace a run's registration (a full update)")
    _add_write_arguments(u)
    u.add_argument("--etag", default="", help="accepted for gcloud's command lines; mldiag "
                   "keeps no etags")
    d = verbs.add_parser("delete", help="forget a run, its targets and sessions (its "
                         "profiles stay in the bucket)")
    add_home(d, repeated=True)
    d.add_argument("name", metavar="MACHINE_LEARNING_RUN")
    d.add_argument("--force", "--quiet", "-q", dest="force", action="store_true",
                   help="no confirmation (mldiag asks none; accepted for gcloud's lines)")
    _gcloud.add_async(d)
    _gcloud.add_scope(d)
    runs.add_list_arguments(ls := verbs.add_parser("list", help="list runs"))
    ls.add_argument("--limit", type=int, default=None, help="at most this many runs")
    runs.add_describe_arguments(verbs.add_parser("describe", help="one run and its sessions"))
    for verb, short in VERBS.items():
        v = verbs.add_parser(verb, help=f"{short} continuous profiling on a run's targets",
                             description=continuous.DESCRIPTION)
        continuous.add_arguments(v, short)


def _pairs(text: str | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise MldiagError(f"{flag} wants KEY=VALUE[,KEY=VALUE...], not {item!r}")
        out[key.strip().strip("'\"")] = value.strip().strip("'\"")
    return out


def _add_write_arguments(c: argparse.ArgumentParser) -> None:
    add_home(c, repeated=True)
    c.add_argument("name", metavar="MACHINE_LEARNING_RUN", help="the run's name, or its full "
                   "resource name")
    c.add_argument("--run-group", "--run-set", dest="run_group", default=None)
    c.add_argument("--gcs-path", default=None, help="gs://BUCKET/PREFIX where its profiles go")
    c.add_argument("--display-name", default=None)
    c.add_argument("--labels", default=None, metavar="KEY=VALUE,...")
    c.add_argument("--orchestrator", default=None)
    c.add_argument("--run-phase", default=None)
    c.add_argument("--tools", default=None)
    for kind in ("hardware", "software", "user"):
        c.add_argument(f"--configs-{kind}", default=None, metavar="KEY=VALUE,...")
    # The documented example repeats the cluster's name; the same name twice is one name.
    c.add_argument("--gke-cluster-name", nargs="+", default=None, metavar="CLUSTER")
    for flag in ("kind", "namespace", "workload-create-time", "workload-name"):
        c.add_argument(f"--gke-{flag}", default=None)
    _gcloud.add_async(c)
    _gcloud.add_format(c)
    _gcloud.add_scope(c)


def _write(args: argparse.Namespace) -> int:
    try:
        check_name("run", args.name)
    except ValueError as e:
        raise MldiagError(str(e)) from e
    plane = control_plane(_control.settings_of(args))
    existing = plane.state.get_run(args.name)
    if args.verb == "create" and existing is not None and not existing.discovered:
        raise MldiagError(f"run {args.name!r} already exists (use machine-learning-run update)")
    if args.verb == "update" and existing is None:
        raise MldiagError(f"unknown run {args.name!r} (create it first)")
    clusters = sorted(set(args.gke_cluster_name or []))
    if len(clusters) > 1:
        raise MldiagError(f"--gke-cluster-name names {len(clusters)} clusters: "
                          f"{', '.join(clusters)}")
    args.gke_cluster_name = clusters[0] if clusters else None
    configs: dict[str, Any] = {}
    for kind in ("hardware", "software", "user"):
        configs.update(_pairs(getattr(args, f"configs_{kind}"), f"--configs-{kind}"))
    labels = _pairs(args.labels, "--labels")
    configs.update({f"label.{k}": v for k, v in labels.items()})
    configs.update({k: getattr(args, k) for k in DETAILS if getattr(args, k) is not None})
    prefix = ""
    if args.gcs_path:
        if not args.gcs_path.startswith("gs://"):
            raise MldiagError(f"--gcs-path must look like gs://BUCKET[/PREFIX], not "
                              f"{args.gcs_path!r}")
        prefix = args.gcs_path[len("gs://"):].partition("/")[2].strip("/")
    record = plane.state.register_run(RunRecord(
        name=args.name, run_group=args.run_group, configs=configs, storage_prefix=prefix,
        on_demand=labels.get("on_demand_xprof") == "enabled" or bool(
            existing and existing.on_demand and args.verb == "update"),
        created_at=existing.created_at if existing else time.time()))
    if args.format:
        _gcloud.emit(record.to_dict(), args.format)
    else:
        print(f"{'Updated' if args.verb == 'update' else 'Created'} machine_learning_run "
              f"[{record.name}].")
    return 0


def _delete(args: argparse.Namespace) -> int:
    plane = control_plane(_control.settings_of(args))
    if not plane.state.delete_run(args.name):
        raise MldiagError(f"unknown run {args.name!r}")
    print(f"Deleted machine_learning_run [{args.name}].")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.verb in VERBS:
        args.verb = VERBS[args.verb]
        return continuous.run(args)
    if args.verb in ("create", "update"):
        return _write(args)
    if args.verb == "delete":
        return _delete(args)
    return runs.run(args)
