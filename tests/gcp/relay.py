"""What Eventarc and Pub/Sub push do in production, played on loopback for the emulators.

- Each function of `functions/` is served by functions-framework over real HTTP (werkzeug, in
  a thread), as Cloud Run serves it.
- `Relay` pulls each subscription from the Pub/Sub emulator and POSTs every message to its
  function as a binary-mode CloudEvent: `messagePublished` for pipeline topics, and for GCS
  notifications the `google.cloud.storage.object.v1.finalized` event Eventarc would send
  (fake-gcs-server publishes the JSON-API object in a Pub/Sub message, as a bucket
  notification does). A 2xx acks the message; anything else nacks it, so Pub/Sub redelivers
  it and, after the subscription's max attempts, dead-letters it.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import functions_framework
import requests
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from mldiag.entrypoints import PUBSUB_PUBLISHED, STORAGE_FINALIZED

LOOPBACK = "127.0.0.1"


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # one access line per delivery would bury a failing test's own output


class FunctionServer:
    """One function of `functions/`, served on a free loopback port."""

    def __init__(self, source: Path, target: str) -> None:
        app = functions_framework.create_app(target=target, source=str(source / "main.py"),
                                             signature_type="cloudevent")
        self.name = target
        self._server: BaseWSGIServer = make_server(LOOPBACK, 0, app, threaded=True,
                                                      request_handler=_QuietHandler)
        self.url = f"http://{LOOPBACK}:{self._server.server_port}/"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name=f"fn-{target}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join(10)


@dataclass
class Delivery:
    """One POST of a message to a function, and what the function answered."""

    function: str
    message_id: str
    status: int
    attempt: int
    data: bytes
    attributes: dict[str, str]


def pubsub_cloud_event(message: Any, topic: str, subscription: str) -> tuple[dict[str, str],
                                                                             bytes]:
    """Headers and body of the messagePublished CloudEvent for a pulled Pub/Sub message."""
    published = message.publish_time.isoformat().replace("+00:00", "Z")
    headers = {
        "ce-specversion": "1.0", "ce-type": PUBSUB_PUBLISHED,
        "ce-source": f"//pubsub.googleapis.com/{topic}", "ce-id": message.message_id,
        "ce-time": published, "Content-Type": "application/json",
    }
    body = {"message": {"data": base64.b64encode(message.data).decode(),
                        "attributes": dict(message.attributes),
                        "messageId": message.message_id, "message_id": message.message_id,
                        "publishTime": published, "publish_time": published},
            "subscription": subscription}
    return headers, json.dumps(body).encode()


def storage_cloud_event(message: Any) -> tuple[dict[str, str], bytes] | None:
    """The Eventarc finalize CloudEvent for a GCS notification; None for other events."""
    attributes = dict(message.attributes)
    if attributes.get("eventType") != "OBJECT_FINALIZE":
        return None
    obj = json.loads(message.data)
    bucket, name = obj["bucket"], obj["name"]
    headers = {
        "ce-specversion": "1.0", "ce-type": STORAGE_FINALIZED,
        "ce-source": f"//storage.googleapis.com/projects/_/buckets/{bucket}",
        "ce-subject": f"objects/{name}", "ce-id": message.message_id,
        "ce-time": obj.get("updated") or attributes.get("eventTime", ""),
        "ce-bucket": bucket, "Content-Type": "application/json",
    }
    return headers, json.dumps(obj).encode()


@dataclass
class Route:
    """Deliver a subscription to a function; `storage` routes carry GCS notifications."""

    subscription: str
    topic: str
    function: FunctionServer
    storage: bool = False


@dataclass
class Relay:
    """Streaming-pulls each route's subscription and pushes its messages to the function."""

    subscriber: Any
    routes: list[Route]
    # Post every finalize this many times, concurrently: at-least-once delivery, duplicated.
    storage_copies: int = 1
    deliveries: list[Delivery] = field(default_factory=list)
    _futures: list[Any] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        from google.cloud.pubsub_v1.types import FlowControl

        for route in self.routes:
            future = self.subscriber.subscribe(route.subscription, self._callback(route),
                                               flow_control=FlowControl(max_messages=8))
            self._futures.append(future)

    def stop(self) -> None:
        for future in self._futures:
            future.cancel()
        for future in self._futures:
            try:
                future.result(timeout=10)
            except Exception:  # noqa: BLE001 - a cancelled stream ends with an error
                pass

    def post(self, route: Route, headers: dict[str, str], body: bytes, message_id: str,
             attempt: int, data: bytes, attributes: dict[str, str]) -> int:
        """POST one CloudEvent to the route's function and record the delivery."""
        response = requests.post(route.function.url, data=body, headers=headers, timeout=300)
        with self._lock:
            self.deliveries.append(Delivery(route.function.name, message_id,
                                            response.status_code, attempt, data, attributes))
        return response.status_code

    def _callback(self, route: Route) -> Callable[[Any], None]:
        def deliver(message: Any) -> None:
            if route.storage:
                event = storage_cloud_event(message)
                if event is None:
                    message.ack()
                    return
                copies = self.storage_copies
            else:
                event = pubsub_cloud_event(message, route.topic, route.subscription)
                copies = 1
            headers, body = event
            attempt = message.delivery_attempt or 1
            statuses: list[int] = []

            def once() -> None:
                statuses.append(self.post(route, headers, body, message.message_id, attempt,
                                          message.data, dict(message.attributes)))

            threads = [threading.Thread(target=once) for _ in range(copies)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if statuses and all(200 <= s < 300 for s in statuses):
                message.ack()
            else:
                message.nack()

        return deliver

    def to(self, function: str, **match: Any) -> list[Delivery]:
        """Deliveries to `function` whose JSON payload has every `match` field."""
        with self._lock:
            found = [d for d in self.deliveries if d.function == function]
        out = []
        for d in found:
            try:
                body = json.loads(d.data)
            except ValueError:
                body = None
            if all(isinstance(body, dict) and body.get(k) == v for k, v in match.items()):
                out.append(d)
        return out

    def of_message(self, message_id: str) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries if d.message_id == message_id]
