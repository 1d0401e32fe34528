"""`mldiag kube-webhook --cert C --key K`: the mutating admission webhook that gives
labelled pods the SDK's settings (`mldiag.kube.webhook`)."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from mldiag.kube import webhook


def register(sub: Any) -> None:
    p = sub.add_parser(
        "kube-webhook", help="serve the admission webhook that injects the SDK's settings "
        "(run name, host name, registration URL) into labelled GKE pods",
        description="Serve AdmissionReview v1 on https://HOST:PORT/mutate: pods labelled "
        "mldiag.dev/run=RUN (or managed-mldiagnostics-gke=true) get MLDIAG_RUN, "
        "MLDIAG_HOST_NAME and MLDIAG_REGISTRATION_URL; see docs/deploy-gke.md.")
    p.add_argument("--cert", required=True, help="the TLS certificate (PEM)")
    p.add_argument("--key", required=True, help="its private key (PEM)")
    p.add_argument("--host", default="0.0.0.0", help="the address to listen on")
    p.add_argument("--port", type=int, default=8443)
    p.add_argument("--registration-url", default="", metavar="URL",
                   help="the register function's URL the SDK calls (default: none injected)")


def run(args: argparse.Namespace) -> int:
    log = logging.getLogger("mldiag.kube")
    log.setLevel(logging.INFO)
    log.addHandler(logging.StreamHandler())
    httpd = webhook.server(args.host, args.port, args.cert, args.key,
                           webhook.Injection(registration_url=args.registration_url))
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
    return 0
