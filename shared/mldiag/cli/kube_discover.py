"""`mldiag kube-discover --run R --namespace NS`: the pods of a labelled JobSet or Job become
push targets of R, and stop being ones, by themselves (`mldiag.kube.discover`)."""

from __future__ import annotations

import argparse
import logging
import signal
from typing import Any

from mldiag.cli import _control
from mldiag.cli._home import add_home
from mldiag.errors import MldiagError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "kube-discover", help="register a run's GKE pods (label mldiag.dev/run=RUN) as its "
        "profiler targets, and follow them as they come, move and go",
        description="Watch the pods labelled mldiag.dev/run=RUN (or --selector) in each "
        "--namespace with the Kubernetes API and keep RUN's push targets equal to them: "
        "podIP:9999 (or the pod's mldiag.dev/profiler-port annotation), named after the "
        "JobSet/Job completion index. Runs until interrupted; see docs/deploy-gke.md.")
    add_home(p)
    p.add_argument("--machine-learning-run", "--run", dest="run", required=True,
                   metavar="RUN", help="the run whose pods to register")
    p.add_argument("--namespace", "-n", dest="namespaces", action="append", required=True,
                   metavar="NS", help="a namespace to watch (repeat for more); pods of other "
                   "namespaces are never registered")
    p.add_argument("--selector", default="", metavar="LABELS",
                   help="the pods' label selector (default: mldiag.dev/run=RUN; "
                   "managed-mldiagnostics-gke=true takes the product's label, the run then "
                   "being the JobSet's or Job's name)")
    p.add_argument("--kubeconfig", default="", help="a kubeconfig file (default: in the "
                   "cluster, its service account; else ~/.kube/config)")
    p.add_argument("--context", default="", help="the kubeconfig context")
    p.add_argument("--server", default="", metavar="URL",
                   help="a plain-HTTP API server instead (kubectl proxy, a test's fake)")
    p.add_argument("--watch-timeout", type=int, default=300, metavar="SECONDS",
                   help="how long one watch request lasts before it is renewed")
    p.add_argument("--heartbeat-file", default="", metavar="PATH",
                   help="touch PATH after every list and every watch that ends in time (a "
                   "liveness probe checks its age)")


def run(args: argparse.Namespace) -> int:
    try:
        from mldiag.kube import discover
    except ImportError as e:  # pragma: no cover (the extra is installed in the tests)
        raise MldiagError("kube-discover needs the kubernetes client: "
                          "pip install 'mldiag[kube]'") from e
    # Every registration, move and problem is one log line: the discoverer's own record.
    log = logging.getLogger("mldiag.kube")
    log.setLevel(logging.INFO)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.propagate = False
    plane = _control.connect(_control.settings_of(args), need_runtime=False)
    _control.get_run(plane, args.run)
    api = discover.connect(args.kubeconfig, args.context, args.server)
    d = discover.Discoverer(plane, args.run, args.namespaces, api,
                            label_selector=args.selector, watch_timeout_s=args.watch_timeout,
                            heartbeat=args.heartbeat_file)
    # SIGTERM (a pod's end on Kubernetes) and SIGINT stop it, even where the signal came
    # ignored from a parent (a background job of a shell ignores SIGINT).
    def stop(_signum: int, _frame: Any) -> None:
        d.stopping.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    threads = d.run_forever()
    # The namespaces' threads are daemons: the process ends when this returns.
    while not d.stopping.wait(1.0) and any(t.is_alive() for t in threads):
        pass
    if not d.stop(grace_s=20.0):
        logging.getLogger("mldiag.kube").warning(
            "stopping with a registration still in flight after 20 s")
    return 0
