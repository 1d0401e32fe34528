"""terraform/ against functions/ and the event chain, read with python-hcl2 (no terraform needed).

A function added under functions/ without its terraform resource and trigger, a resource left
behind for a deleted function, a topic without its dead letter, or a push endpoint the
functions-framework would not turn into the right CloudEvent fails here, not at deploy time.
"""

from __future__ import annotations

import base64
import json
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import functions_framework
import hcl2
import pytest
from cloudevents.http import CloudEvent

from mldiag import entrypoints, stages
from mldiag.messages import TOPIC_OF, ProfileObjectFinalized
from mldiag.settings import Settings
from tests.helpers.fixtures import REPO

TERRAFORM = REPO / "terraform"
FUNCTION_NAMES = sorted(p.parent.name for p in (REPO / "functions").glob("*/main.py"))

# DESIGN.md "The event chain": the topic each Pub/Sub function is delivered from.
PUSHED_FROM = {
    "on_degradation_alert": "degradation-alerts",
    "on_capture_request": "capture-requests",
    "collect": "analysis-requests",
    "collect_host": "host-analysis-requests",
    "investigate": "investigation-requests",
    "render_report": "report-requests",
    "prebuild_viewer": "viewer-requests",
    "sweep": "sweep-ticks",
}
STORAGE_FUNCTION = "on_profile_object"
DEAD_LETTER_FUNCTION = "dead_letters"
# The one HTTP function: workloads call it (mldiag.registration), no topic or trigger does.
HTTP_FUNCTION = "register"
# Messages that GCP delivers without a topic of ours (Eventarc, from the bucket).
NOT_PUBSUB = {TOPIC_OF[ProfileObjectFinalized]}


@dataclass
class Terraform:
    resources: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    locals: dict[str, Any] = field(default_factory=dict)
    variables: dict[str, dict[str, Any]] = field(default_factory=dict)

    def resource(self, kind: str, name: str) -> dict[str, Any]:
        assert name in self.resources.get(kind, {}), f"terraform has no {kind}.{name}"
        return self.resources[kind][name]


def _unquote(value: Any) -> Any:
    """python-hcl2 >= 8 keeps the quotes of strings and labels; older versions strip them."""
    if isinstance(value, str):
        return value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value
    if isinstance(value, list):
        return [_unquote(v) for v in value]
    if isinstance(value, dict):
        return {_unquote(k): _unquote(v) for k, v in value.items()
                if k not in ("__is_block__", "__comments__", "__inline_comments__")}
    return value


def _load(path: Path) -> dict[str, Any]:
    with path.open() as f:
        options = getattr(hcl2, "SerializationOptions", None)
        if options is None:
            return dict(hcl2.load(f))
        return dict(hcl2.load(f, serialization_options=options(with_comments=False)))


@pytest.fixture(scope="module")
def tf() -> Terraform:
    parsed = Terraform()
    for path in sorted(TERRAFORM.glob("*.tf")):
        doc = _unquote(_load(path))
        for block in doc.get("resource", []):
            for kind, named in block.items():
                for name, body in named.items():
                    assert name not in parsed.resources.get(kind, {}), f"{kind}.{name} twice"
                    parsed.resources.setdefault(kind, {})[name] = body
        for block in doc.get("locals", []):
            parsed.locals.update(block)
        for block in doc.get("variable", []):
            parsed.variables.update(block)
    return parsed


def one(blocks: Any) -> dict[str, Any]:
    """A nested block (python-hcl2 gives a list of one)."""
    assert isinstance(blocks, list) and len(blocks) == 1, blocks
    return dict(blocks[0])


def expr(value: Any) -> str:
    """`${x}` → `x`, the expression of an interpolation-only string."""
    assert isinstance(value, str), value
    match = re.fullmatch(r"\$\{(.*)\}", value, re.S)
    return match.group(1) if match else value


def for_each_keys(tf: Terraform, body: dict[str, Any]) -> list[str]:
    """The instance keys of a `for_each` over a local (a map or a filtered comprehension)."""
    local = re.fullmatch(r"local\.(\w+)", expr(body["for_each"]))
    assert local, f"for_each {body['for_each']!r}: the test reads only `local.<map>`"
    value = tf.locals[local.group(1)]
    if isinstance(value, dict):
        return list(value)
    comprehension = re.fullmatch(
        r'\{for (\w+), \w+ in local\.(\w+) : \1 => \w+ if \1 != "(\w+)"\}', expr(value))
    if comprehension:
        source = tf.locals[comprehension.group(2)]
        return [k for k in source if k != comprehension.group(3)]
    excluding = re.fullmatch(
        r'\{for (\w+), \w+ in local\.(\w+) : \1 => \w+ if !contains\(\[([^\]]*)\], \1\)\}',
        expr(value))
    assert excluding, f"local.{local.group(1)} = {value!r}: teach the test this form"
    left_out = set(json.loads(f"[{excluding.group(3)}]"))
    return [k for k in tf.locals[excluding.group(2)] if k not in left_out]


def instances(tf: Terraform, kind: str) -> Iterator[tuple[str, str | None, dict[str, Any]]]:
    """(resource name, each.key or None, body) of every instance of a resource kind."""
    for name, body in tf.resources.get(kind, {}).items():
        if "for_each" in body:
            for key in for_each_keys(tf, body):
                yield name, key, body
        else:
            yield name, None, body


def at(value: str, key: str | None) -> str:
    """An expression with `each.key` substituted."""
    if key is None:
        return value
    return value.replace("[each.key]", f'["{key}"]').replace("${each.key}", key).replace(
        "each.key", f'"{key}"')


def deployed_functions(tf: Terraform) -> dict[str, tuple[str, str | None, dict[str, Any]]]:
    """Function entry point → (resource name, each.key, body) of its Cloud Function."""
    deployed: dict[str, tuple[str, str | None, dict[str, Any]]] = {}
    for name, key, body in instances(tf, "google_cloudfunctions2_function"):
        entry_point = at(one(body["build_config"])["entry_point"], key)
        assert entry_point not in deployed, f"{entry_point} is deployed twice"
        deployed[entry_point] = (name, key, body)
    return deployed


def test_every_function_directory_is_deployed_and_nothing_else(tf: Terraform) -> None:
    assert FUNCTION_NAMES, "no functions/<name>/main.py found"
    assert sorted(deployed_functions(tf)) == FUNCTION_NAMES
    assert sorted(tf.locals["functions"]) == FUNCTION_NAMES


def test_each_function_runs_its_own_source_on_python312(tf: Terraform) -> None:
    for function, (_, key, body) in deployed_functions(tf).items():
        build = one(body["build_config"])
        assert build["runtime"] == "python312", function
        source = one(one(build["source"])["storage_source"])
        assert at(source["object"], key) == (
            f'${{google_storage_bucket_object.source["{function}"].name}}'), function
    zips = tf.resource("google_storage_bucket_object", "source")
    assert for_each_keys(tf, zips) == list(tf.locals["functions"])
    assert "${each.key}.zip" in zips["source"]


def test_each_function_has_its_own_service_account(tf: Terraform) -> None:
    accounts = {}
    for function, (_, key, body) in deployed_functions(tf).items():
        accounts[function] = at(one(body["service_config"])["service_account_email"], key)
    assert accounts == {f: f'${{google_service_account.function["{f}"].email}}'
                        for f in FUNCTION_NAMES}
    runtime = tf.resource("google_service_account", "function")
    assert sorted(for_each_keys(tf, runtime)) == FUNCTION_NAMES
    # Distinct ids per function, within the 30-character limit with the longest prefix.
    suffixes = tf.locals["account_ids"]
    assert sorted(suffixes) == FUNCTION_NAMES
    assert len(set(suffixes.values())) == len(suffixes)
    longest_prefix = 12
    assert all(longest_prefix + len("fn-") + len(s) <= 30 for s in suffixes.values())


def test_storage_function_gets_finalize_events_with_retry(tf: Terraform) -> None:
    _, _, body = deployed_functions(tf)[STORAGE_FUNCTION]
    trigger = one(body["event_trigger"])
    assert trigger["event_type"] == entrypoints.STORAGE_FINALIZED
    assert trigger["retry_policy"] == "RETRY_POLICY_RETRY"
    assert one(trigger["event_filters"]) == {
        "attribute": "bucket", "value": "${google_storage_bucket.profiles.name}"}
    assert trigger["service_account_email"] == "${google_service_account.trigger.email}"
    # The GCS service agent publishes the events Eventarc delivers.
    agent = tf.resource("google_project_iam_member", "gcs_agent_publishes_events")
    assert agent["role"] == "roles/pubsub.publisher"


def test_pubsub_functions_are_pushed_from_their_topic_with_retry_and_dead_letter(
        tf: Terraform) -> None:
    deployed = deployed_functions(tf)
    # No Eventarc trigger besides the bucket's: it would deliver each message twice.
    assert [f for f, (_, _, b) in deployed.items() if "event_trigger" in b] == [STORAGE_FUNCTION]
    # Every function is pushed from a topic but the bucket's and the HTTP one.
    pushed = tf.resource("google_cloudfunctions2_function", "pubsub")
    assert sorted(for_each_keys(tf, pushed)) == sorted(
        set(FUNCTION_NAMES) - {STORAGE_FUNCTION, HTTP_FUNCTION})

    push = tf.resource("google_pubsub_subscription", "push")
    topics: dict[str, str] = tf.locals["topics"]
    assert for_each_keys(tf, push) == list(topics)
    assert {function: topic for topic, function in topics.items()} == PUSHED_FROM
    assert push["topic"] == "${google_pubsub_topic.topic[each.key].id}"

    config = one(push["push_config"])
    for function in topics.values():
        resource, key, _ = deployed[function]
        uri = f"google_cloudfunctions2_function.{resource}"
        uri += f'["{key}"]' if key else ""
        endpoint = config["push_endpoint"].replace("[each.value]", f'["{function}"]')
        assert endpoint.startswith(f"${{{uri}.service_config[0].uri}}/"), endpoint
    token = one(config["oidc_token"])
    assert token["service_account_email"] == "${google_service_account.trigger.email}"

    dead = one(push["dead_letter_policy"])
    assert dead["dead_letter_topic"] == "${google_pubsub_topic.dead_letter[each.key].id}"
    # Throttled pushes (429 while Cloud Run scales) count as delivery attempts: Pub/Sub's
    # own limit is its maximum, and the functions count their real failures themselves.
    assert tf.locals["max_delivery_attempts"] == 100
    assert dead["max_delivery_attempts"] == "${local.max_delivery_attempts}"
    assert 1 < tf.locals["max_function_attempts"] < tf.locals["max_delivery_attempts"]
    assert re.search(r"MLDIAG_MAX_ATTEMPTS\s*=\s*tostring\(local\.max_function_attempts\)",
                     (TERRAFORM / "functions.tf").read_text())
    retry = one(push["retry_policy"])
    assert retry["minimum_backoff"] != retry["maximum_backoff"]  # exponential, not fixed

    # A delivery is answered within the ack deadline, or Pub/Sub sends it again meanwhile.
    longest = max(tf.locals["functions"][f]["timeout"] for f in topics.values())
    assert tf.locals["ack_deadline_seconds"] >= longest
    assert push["ack_deadline_seconds"] == "${local.ack_deadline_seconds}"


def test_every_topic_has_a_dead_letter_topic_read_by_dead_letters(tf: Terraform) -> None:
    topics = tf.locals["topics"]
    topic = tf.resource("google_pubsub_topic", "topic")
    dead = tf.resource("google_pubsub_topic", "dead_letter")
    assert for_each_keys(tf, topic) == for_each_keys(tf, dead) == list(topics)
    assert topic["name"] == "${var.prefix}${each.key}"
    assert dead["name"] == "${var.prefix}${each.key}-dead-letter"

    reader = tf.resource("google_pubsub_subscription", "dead_letter")
    assert for_each_keys(tf, reader) == list(topics)
    assert reader["topic"] == "${google_pubsub_topic.dead_letter[each.key].id}"
    endpoint = one(reader["push_config"])["push_endpoint"]
    resource, key, _ = deployed_functions(tf)[DEAD_LETTER_FUNCTION]
    assert endpoint.startswith(
        f'${{google_cloudfunctions2_function.{resource}["{key}"].service_config[0].uri}}/')
    assert "dead_letter_policy" not in reader  # a dead letter's dead letter would go nowhere

    # The Pub/Sub service agent forwards: publisher on the dead-letter topics, subscriber on
    # the subscriptions they come from.
    publish = tf.resource("google_pubsub_topic_iam_member", "agent_publishes_dead_letters")
    assert publish["topic"] == "${google_pubsub_topic.dead_letter[each.key].id}"
    forward = tf.resource("google_pubsub_subscription_iam_member",
                          "agent_forwards_dead_letters")
    assert forward["subscription"] == "${google_pubsub_subscription.push[each.key].id}"
    assert for_each_keys(tf, publish) == for_each_keys(tf, forward) == list(topics)


def test_topics_cover_every_published_message(tf: Terraform) -> None:
    topics = tf.locals["topics"]
    assert set(TOPIC_OF.values()) - NOT_PUBSUB <= set(topics)
    # A message type with a stage is pushed to the function named after that stage.
    for message_type, handler in stages.HANDLERS.items():
        if TOPIC_OF[message_type] not in NOT_PUBSUB:
            assert topics[TOPIC_OF[message_type]] == handler.__name__
    # What each function may publish is a topic of ours.
    for function, spec in tf.locals["functions"].items():
        assert set(spec["publishes"]) <= set(topics), function


def test_scheduler_ticks_the_sweeper(tf: Terraform) -> None:
    job = tf.resource("google_cloud_scheduler_job", "sweep")
    target = one(job["pubsub_target"])
    assert target["topic_name"] == '${google_pubsub_topic.topic["sweep-ticks"].id}'
    assert tf.locals["topics"]["sweep-ticks"] == "sweep"
    assert tf.variables["sweep_schedule"]["default"] == "* * * * *"


def test_functions_are_configured_for_gcp(tf: Terraform) -> None:
    env = tf.locals["environment"]
    assert expr(env).startswith("merge(")
    match = re.search(r"merge\(\{(.*?)\}, var\.extra_environment\)", expr(env), re.S)
    assert match, env
    names = set(re.findall(r"(\w+)\s*=", match.group(1)))
    known = {f"MLDIAG_{f.name.upper()}" for f in fields(Settings)}
    assert {"MLDIAG_BACKEND", "MLDIAG_PROJECT", "MLDIAG_BUCKET", "MLDIAG_LOCATION",
            "MLDIAG_TOPIC_PREFIX", "MLDIAG_FIRESTORE_DATABASE"} <= names
    assert names - {"LOG_EXECUTION_ID"} <= known, "every MLDIAG_* variable is a Settings field"
    assert 'MLDIAG_BACKEND = "gcp"' in match.group(1)
    assert "MLDIAG_TOPIC_PREFIX = var.prefix" in re.sub(r"\s+", " ", match.group(1))
    investigator = tf.locals["investigator_environment"]
    assert set(investigator) == {"MLDIAG_INVESTIGATOR", "MLDIAG_GEMINI_MODEL"} <= known
    assert tf.variables["prefix"]["default"] == Settings().topic_prefix


def test_heavy_stages_get_time_and_memory(tf: Terraform) -> None:
    functions = tf.locals["functions"]
    from mldiag.settings import GIB, Settings

    for heavy in ("collect", "investigate"):
        assert functions[heavy]["timeout"] == 540
        # /tmp is memory on gen2: a host at the size cap must fit, plus xprof's own working set.
        memory_gib = int(functions[heavy]["memory"].removesuffix("Gi"))
        assert memory_gib >= 2 * Settings().max_host_bytes / GIB
    assert all(f["timeout"] <= 540 for f in functions.values())


def test_runtime_roles_are_least_privilege(tf: Terraform) -> None:
    # Project-level roles of the function accounts: Firestore (on mldiag's database only) and,
    # for investigate alone, a custom role that calls Gemini and nothing else.
    project_roles = {body["role"] for body in tf.resources["google_project_iam_member"].values()
                     if "google_service_account.function" in body["member"]}
    assert project_roles == {"roles/datastore.user",
                             "${google_project_iam_custom_role.gemini_predict[0].name}"}
    vertex = tf.resource("google_project_iam_member", "investigate_vertex")
    assert vertex["member"] == '${google_service_account.function["investigate"].member}'
    custom = tf.resource("google_project_iam_custom_role", "gemini_predict")
    assert custom["permissions"] == ["aiplatform.endpoints.predict"]
    assert not any("roles/aiplatform" in str(body) for named in tf.resources.values()
                   for body in named.values())
    firestore = tf.resource("google_project_iam_member", "function_firestore")
    assert "google_firestore_database.main.name" in one(firestore["condition"])["expression"]

    # Bucket-wide, a function at most reads; every write is a conditional grant (below).
    for function, spec in tf.locals["functions"].items():
        assert set(spec["storage"]) <= {"roles/storage.objectViewer"}, function
    # Nobody but the trigger identity invokes the event functions; only the workloads invoke
    # the register function.
    invoker = tf.resource("google_cloud_run_v2_service_iam_member", "trigger_invokes")
    assert invoker["member"] == "${google_service_account.trigger.member}"
    assert sorted(for_each_keys(tf, invoker)) == sorted(set(FUNCTION_NAMES) - {HTTP_FUNCTION})
    workloads = tf.resource("google_cloud_run_v2_service_iam_member", "workloads_register")
    assert workloads["name"] == "${google_cloudfunctions2_function.register.name}"
    assert workloads["member"] == "serviceAccount:${each.value}"
    for _, key, body in instances(tf, "google_cloudfunctions2_function"):
        ingress = one(body["service_config"])["ingress_settings"]
        if key is None and body["build_config"][0]["entry_point"] == HTTP_FUNCTION:
            assert ingress == "${var.registration_ingress}"
            assert tf.variables["registration_ingress"]["default"] == "ALLOW_INTERNAL_ONLY"
        else:
            assert ingress == "ALLOW_INTERNAL_ONLY", key
    # No secret, no share-link key, in plain text or in state; a rotation keeps the old
    # version (disabled), so revisions still serving can read it.
    version = tf.resource("google_secret_manager_secret_version", "share_link_key")
    assert "secret_data" not in version and "secret_data_wo" in version
    assert version["deletion_policy"] == "DISABLE"


def test_render_report_asks_prebuild_viewer_for_the_viewer_caches(tf: Terraform) -> None:
    functions = tf.locals["functions"]
    assert "viewer-requests" in functions["render_report"]["publishes"]
    assert tf.locals["topics"]["viewer-requests"] == "prebuild_viewer"
    # As heavy as collect: the session's xplanes in /tmp (memory) and xprof's conversions.
    prebuild = functions["prebuild_viewer"]
    assert (prebuild["memory"], prebuild["cpu"], prebuild["timeout"],
            prebuild["max_instances"]) == ("8Gi", "2", 540, 10)
    # It writes only the caches: no bucket-wide role that writes.
    assert functions["prebuild_viewer"]["storage"] == ["roles/storage.objectViewer"]
    grant = tf.resource("google_storage_bucket_iam_member", "function_viewer_cache")
    assert grant["role"] == "roles/storage.objectUser"
    assert one(grant["condition"])["expression"] == "${local.viewer_cache_condition.expression}"
    writers = re.fullmatch(r"toset\(\[for name, f in local\.functions : name if "
                           r"try\(f\.viewer_cache, false\)\]\)", expr(tf.locals[
                               "viewer_cache_writers"]))
    assert writers and grant["for_each"] == "${local.viewer_cache_writers}"
    assert [f for f, spec in functions.items() if spec.get("viewer_cache")] == ["prebuild_viewer"]


# The IAM condition on the viewer caches, evaluated the way Cloud Storage does on an object's
# resource name (projects/_/buckets/<bucket>/objects/<name>): the clauses this test knows.
BUCKET = "p-mldiag-profiles"


def _cache_condition(tf: Terraform, local: str = "viewer_cache_condition") -> list[str]:
    expression = expr(tf.locals[local]["expression"])
    match = re.fullmatch(r'join\(" && ", \[(.*)\]\)', expression, re.S)
    assert match, expression
    clauses = [json.loads(c) for c in re.findall(r'"(?:[^"\\]|\\.)*"', match.group(1))]
    return [c.replace("${google_storage_bucket.profiles.name}", BUCKET) for c in clauses]


def _extract(name: str, template: str) -> str:
    """IAM's resource.name.extract(): what `{x}` stands for after the template's prefix."""
    match = re.fullmatch(r"([^{]*)\{\w+\}(.*)", template)
    assert match, template
    before, after = match.groups()
    start = name.find(before)
    if start < 0:
        return ""
    rest = name[start + len(before):]
    if not after:
        return rest
    end = rest.find(after)
    return rest[:end] if end >= 0 else ""


def _allows(clauses: list[str], resource_name: str) -> bool:
    results = []
    for clause in clauses:
        if m := re.fullmatch(r'resource\.name\.startsWith\("(.*)"\)', clause):
            results.append(resource_name.startswith(m.group(1)))
        elif m := re.fullmatch(r'resource\.name\.extract\("(.*)"\) != ""', clause):
            results.append(_extract(resource_name, m.group(1)) != "")
        elif m := re.fullmatch(r'resource\.name\.extract\("(.*)"\) == ""', clause):
            results.append(_extract(resource_name, m.group(1)) == "")
        elif m := re.fullmatch(r'!resource\.name\.endsWith\("(.*)"\)', clause):
            results.append(not resource_name.endswith(m.group(1)))
        elif m := re.fullmatch(r'resource\.name\.endsWith\("(.*)"\)', clause):
            results.append(resource_name.endswith(m.group(1)))
        else:
            raise AssertionError(f"teach the test this clause: {clause}")
    return all(results)


def test_viewer_cache_writers_can_write_the_caches_and_nothing_else(tf: Terraform) -> None:
    from mldiag.model import XPLANE_SUFFIXES, HostRecord, SessionRecord
    from mldiag.viewer_cache import MANIFEST, cache_prefix

    clauses = _cache_condition(tf)
    session = SessionRecord(run="my_run", session="s1", state="REPORTED", hosts={
        "host0": HostRecord("team/my_run/plugins/profile/s1/host0.xplane.pb", "7", 10, 0.0)})
    prefix = cache_prefix(session)

    def obj(name: str, bucket: str = BUCKET) -> str:
        return f"projects/_/buckets/{bucket}/objects/{name}"

    for written in (f"{prefix}/{MANIFEST}", f"{prefix}/plugins/profile/s1/host0.trace.sstable",
                    f"{prefix}/responses/overview.json"):
        assert _allows(clauses, obj(written)), written
    for refused in ("team/my_run/plugins/profile/s1/host0.xplane.pb",
                    "team/my_run/plugins/profile/s1/analysis/summary.html",
                    "team/my_run/plugins/profile/s1/analysis/analysis.json",
                    "analysis/xprof_cache/k/manifest.json",
                    # a cache object must never be read as a profile by on_profile_object
                    *(f"{prefix}/plugins/profile/s1/host9{suffix}" for suffix in XPLANE_SUFFIXES)):
        assert not _allows(clauses, obj(refused)), refused
    assert not _allows(clauses, obj(f"{prefix}/{MANIFEST}", bucket="other-bucket"))
    # Listing is checked on the bucket itself: the condition never grants it.
    assert not _allows(clauses, f"projects/_/buckets/{BUCKET}")


# The console (console.tf)

def _console_members(tf: Terraform) -> dict[str, list[dict[str, Any]]]:
    """IAM resource kind → the grants to the console's service account."""
    return {kind: [b for b in named.values()
                   if b.get("member") == "${google_service_account.console[0].member}"]
            for kind, named in tf.resources.items() if kind.endswith("_iam_member")}


def test_console_is_a_cloud_run_service_with_its_own_service_account(tf: Terraform) -> None:
    console = tf.resource("google_cloud_run_v2_service", "console")
    account = tf.resource("google_service_account", "console")
    assert tf.variables["console_image"]["default"] == ""
    assert tf.locals["console"] == '${var.console_image != ""}'
    assert console["count"] == account["count"] == "${local.console ? 1 : 0}"
    assert account["account_id"] == "${var.prefix}console"
    assert 12 + len("console") <= 30  # the longest prefix still makes a valid account id

    template = one(console["template"])
    assert template["service_account"] == "${google_service_account.console[0].email}"
    assert template["timeout"] == "300s"
    assert template["max_instance_request_concurrency"] == 40
    assert one(template["scaling"])["max_instance_count"] == "${var.console_max_instances}"
    assert tf.variables["console_max_instances"]["default"] == 10
    container = one(template["containers"])
    assert container["image"] == "${var.console_image}"
    assert "command" not in container and "args" not in container  # the image's entrypoint
    assert one(container["resources"])["limits"] == {"memory": "8Gi", "cpu": "2"}
    assert one(container["ports"])["container_port"] == 8080

    # Behind the load balancer (and IAP), never straight from the internet by default.
    assert console["ingress"] == "${var.console_ingress}"
    assert tf.variables["console_ingress"]["default"] == "INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER"
    invokers = [b for b in tf.resources["google_cloud_run_v2_service_iam_member"].values()
                if "google_cloud_run_v2_service.console" in b["name"]]
    assert [b["member"] for b in invokers] == [
        "serviceAccount:service-${data.google_project.this.number}"
        "@gcp-sa-iap.iam.gserviceaccount.com"]


def test_console_signs_in_with_iap_and_shares_the_functions_settings(tf: Terraform) -> None:
    container = one(one(tf.resource("google_cloud_run_v2_service", "console")["template"])[
        "containers"])
    assert one(container["dynamic"])["env"]["for_each"] == "${local.console_environment}"
    environment = re.sub(r"\s+", " ", expr(tf.locals["console_environment"]))
    assert environment.startswith("merge(local.environment, ")
    assert '{MLDIAG_CONSOLE_AUTH = "iap"}' in environment.replace("{ ", "{").replace(" }", "}")
    assert "MLDIAG_IAP_AUDIENCE = var.console_iap_audience" in environment
    assert tf.variables["console_iap_audience"]["default"] == ""
    # One CSRF key for every instance, from Secret Manager, never in the plan.
    secret = one(container["env"])
    assert secret["name"] == "MLDIAG_CONSOLE_SECRET" and "value" not in secret
    ref = one(one(secret["value_source"])["secret_key_ref"])
    assert ref["secret"] == "${google_secret_manager_secret.share_link_key.secret_id}"

    known = {f"MLDIAG_{f.name.upper()}" for f in fields(Settings)}
    assert {"MLDIAG_CONSOLE_AUTH", "MLDIAG_IAP_AUDIENCE", "MLDIAG_CONSOLE_SECRET"} <= known


def test_console_holds_only_what_it_touches(tf: Terraform) -> None:
    grants = _console_members(tf)
    roles = {kind: sorted(b["role"] for b in bodies) for kind, bodies in grants.items() if bodies}
    assert roles == {
        "google_project_iam_member": ["roles/datastore.user"],
        "google_storage_bucket_iam_member": ["roles/storage.objectUser",
                                             "roles/storage.objectViewer"],
        "google_pubsub_topic_iam_member": ["roles/pubsub.publisher", "roles/pubsub.publisher"],
        "google_secret_manager_secret_iam_member": ["roles/secretmanager.secretAccessor"],
    }
    # No project-wide storage role at all, and Firestore on mldiag's database only.
    firestore = one(grants["google_project_iam_member"])
    assert "google_firestore_database.main.name" in one(firestore["condition"])["expression"]
    # Reads the bucket; writes only the viewer caches.
    for grant in grants["google_storage_bucket_iam_member"]:
        assert grant["bucket"] == "${google_storage_bucket.profiles.name}"
        if grant["role"] == "roles/storage.objectUser":
            assert one(grant["condition"])["expression"] == (
                "${local.viewer_cache_condition.expression}")
        else:
            assert "condition" not in grant
    # Publishes captures and the rebuilds of expired viewer caches, nothing else.
    assert sorted(g["topic"] for g in grants["google_pubsub_topic_iam_member"]) == [
        '${google_pubsub_topic.topic["capture-requests"].id}',
        '${google_pubsub_topic.topic["viewer-requests"].id}']
    assert one(grants["google_secret_manager_secret_iam_member"])["secret_id"] == (
        "${google_secret_manager_secret.share_link_key.id}")


def _members(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("member", "members"):
                yield from (item if isinstance(item, list) else [item])
            else:
                yield from _members(item)
    elif isinstance(value, list):
        for item in value:
            yield from _members(item)


def test_nothing_is_granted_to_the_public(tf: Terraform) -> None:
    members = [m for named in tf.resources.values() for body in named.values()
               for m in _members(body)]
    assert len(members) > 20
    public = [m for m in members if "allUsers" in m or "allAuthenticatedUsers" in m]
    assert public == []
    assert not [kind for kind in tf.resources if kind.endswith(("_iam_policy", "_iam_binding"))]


def test_firestore_indexes_are_the_state_adapters(tf: Terraform) -> None:
    state = pytest.importorskip("mldiag.adapters.gcp.state")
    index = tf.resource("google_firestore_index", "index")
    assert for_each_keys(tf, index) == list(tf.locals["firestore_indexes"])
    assert index["query_scope"] == "${local.firestore_index_scope}"
    scope = tf.locals["firestore_index_scope"]
    fields_block = one(index["dynamic"])["fields"]
    assert fields_block["for_each"] == "${each.value.fields}"
    assert one(fields_block["content"]) == {
        "field_path": "${fields.value.path}",
        "order": '${fields.value.order == "CONTAINS" ? null : fields.value.order}',
        "array_config": '${fields.value.order == "CONTAINS" ? "CONTAINS" : null}'}
    ours = sorted((i["collection"], scope, tuple((f["path"], f["order"]) for f in i["fields"]))
                  for i in tf.locals["firestore_indexes"].values())
    theirs = sorted((i["collectionGroup"], i["queryScope"],
                     tuple((f["fieldPath"], f.get("order") or f["arrayConfig"])
                           for f in i["fields"]))
                    for i in state.INDEXES["indexes"])
    assert ours == theirs

    unindexed = tf.resource("google_firestore_field", "unindexed")
    assert for_each_keys(tf, unindexed) == list(tf.locals["firestore_unindexed_fields"])
    assert sorted((f["collection"], f["field"])
                  for f in tf.locals["firestore_unindexed_fields"].values()) == sorted(
        (o["collectionGroup"], o["fieldPath"]) for o in state.INDEXES["fieldOverrides"]
        if o["indexes"] == [])

    # The collections the adapter stamps with a purge time have Firestore's TTL policy on it.
    ttl = tf.resource("google_firestore_field", "ttl")
    assert "ttl_config" in ttl
    fields = {f for _, f in state.TTL_FIELDS}
    assert ttl["field"] in fields and len(fields) == 1
    assert sorted(ttl["for_each"].removeprefix("${toset(").removesuffix(")}").strip("[]")
                  .replace('"', "").replace(" ", "").split(",")) == sorted(
        c for c, _ in state.TTL_FIELDS)


# The push endpoint against functions-framework: a raw push body must become the CloudEvent
# that mldiag.entrypoints parses, with the topic in its source.

CAPTURE = textwrap.dedent("""
    import json

    import functions_framework

    @functions_framework.cloud_event
    def capture(event):
        with open({out!r}, "w") as f:
            json.dump({{"attributes": dict(event.get_attributes()), "data": event.get_data()}}, f)
""")


def _push_path(tf: Terraform, resource: str, project: str, topic_name: str) -> str:
    """The URL path of the push endpoint terraform configures, for one topic."""
    endpoint = one(tf.resource("google_pubsub_subscription", resource)["push_config"])[
        "push_endpoint"]
    match = re.fullmatch(r"\$\{[^}]*\.service_config\[0\]\.uri\}(/.*)", endpoint)
    assert match, endpoint
    path = match.group(1).replace("${var.project}", project)
    return re.sub(r"\$\{google_pubsub_topic\.\w+\[each\.key\]\.name\}", topic_name, path)


# functions-framework 3.10.2 computes a default publishTime with datetime.utcnow() even when
# the message has one.
@pytest.mark.filterwarnings("ignore:datetime.datetime.utcnow:DeprecationWarning")
@pytest.mark.parametrize("resource, topic, attributes", [
    ("push", "mldiag-analysis-requests", {"origin": "test"}),
    ("dead_letter", "mldiag-analysis-requests-dead-letter", {
        "CloudPubSubDeadLetterSourceDeliveryCount": "5",
        "CloudPubSubDeadLetterSourceSubscription": "mldiag-analysis-requests-to-collect"}),
])
def test_push_delivery_reaches_the_function_as_a_message_published_event(
        tf: Terraform, tmp_path: Path, resource: str, topic: str,
        attributes: dict[str, str]) -> None:
    out = tmp_path / "event.json"
    source = tmp_path / "main.py"
    source.write_text(CAPTURE.format(out=str(out)))
    app = functions_framework.create_app("capture", str(source), "cloudevent")
    payload = {"kind": "analyze_session", "run": "r", "session": "s", "version": 1}
    body = {
        "message": {"data": base64.b64encode(json.dumps(payload).encode()).decode(),
                    "attributes": attributes, "messageId": "42",
                    "publishTime": "2026-01-01T00:00:00Z"},
        "subscription": f"projects/p/subscriptions/{topic}-sub",
    }
    response = app.test_client().post(_push_path(tf, resource, "p", topic), json=body)
    assert response.status_code == 200, response.get_data(as_text=True)

    received = json.loads(out.read_text())
    event = CloudEvent(received["attributes"], received["data"])
    assert event["type"] == entrypoints.PUBSUB_PUBLISHED
    delivery = entrypoints.PubSubDelivery.from_cloud_event(event)
    assert delivery.topic == topic
    assert json.loads(delivery.data) == payload
    assert delivery.attributes == attributes
    assert delivery.message_id == "42"


def test_the_share_access_log_has_its_composite_index(tf: Any) -> None:
    from mldiag.adapters.gcp import access

    index = tf.resource("google_firestore_index", "share_access")
    (wanted,) = access.INDEXES["indexes"]
    assert index["collection"] == wanted["collectionGroup"] == access.SHARE_ACCESS
    assert [(f["field_path"], f["order"]) for f in index["fields"]] == [
        (f["fieldPath"], f["order"]) for f in wanted["fields"]]


# Tenancy and least privilege (issue 12)

def _obj(name: str, bucket: str = BUCKET) -> str:
    return f"projects/_/buckets/{bucket}/objects/{name}"


def test_stages_write_only_analysis_artifacts_and_capture_only_xplanes(tf: Terraform) -> None:
    analysis = _cache_condition(tf, "analysis_condition")
    xplanes = _cache_condition(tf, "xplane_condition")
    session = "team/my_run/plugins/profile/s1"
    for written in ("analysis/summary.html", "analysis/v2/analysis.json",
                    "analysis/v1/hosts/host0.json", "analysis/v1/hosts/host0.converter-input.pb",
                    "analysis/xprof_cache/k/manifest.json"):
        assert _allows(analysis, _obj(f"{session}/{written}")), written
        assert not _allows(xplanes, _obj(f"{session}/{written}")), written
    for profile in (f"{session}/host0.xplane.pb", "my_run/plugins/profile/s1/host0.xplane.pb"):
        assert not _allows(analysis, _obj(profile)), profile
        assert _allows(xplanes, _obj(profile)), profile
    for neither in ("team/my_run/notes.txt", f"{session}/analysis/h.xplane.pb",
                    f"{session}/analysis/h.xplane.riegeli"):
        assert not _allows(analysis, _obj(neither)), neither
        assert not _allows(xplanes, _obj(neither)), neither
    assert not _allows(analysis, _obj(f"{session}/analysis/a.json", bucket="other"))
    functions = tf.locals["functions"]
    writers = {f for f, spec in functions.items() if spec.get("analysis_writer")}
    assert writers == {"collect", "collect_host", "investigate", "render_report"}
    assert {f for f, spec in functions.items() if spec.get("xplane_writer")} == {
        "on_capture_request", "register"}
    for resource, local in (("function_analysis", "analysis_condition"),
                            ("function_xplanes", "xplane_condition")):
        grant = tf.resource("google_storage_bucket_iam_member", resource)
        assert one(grant["condition"])["expression"] == f"${{local.{local}.expression}}"
    job = tf.resource("google_storage_bucket_iam_member", "collect_job_analysis")
    assert one(job["condition"])["expression"] == "${local.analysis_condition.expression}"
    assert tf.resource("google_storage_bucket_iam_member", "collect_job_storage")["role"] == (
        "roles/storage.objectViewer")
    # Nothing writes the whole bucket (function_storage holds the readers' roles, above).
    for name, body in tf.resources["google_storage_bucket_iam_member"].items():
        if body["bucket"] == "${google_storage_bucket.profiles.name}" and body["role"] not in (
                "roles/storage.objectViewer", "${each.value.role}"):
            assert "condition" in body, name


def test_workloads_reach_mldiag_only_through_the_register_function(tf: Terraform) -> None:
    grants = [(kind, name) for kind, named in tf.resources.items()
              for name, body in named.items()
              if "var.workload_service_accounts" in str(body.get("for_each", ""))]
    assert sorted(grants) == [("google_cloud_run_v2_service_iam_member", "workloads_register"),
                              ("google_pubsub_topic_iam_member", "workload_alerts")]
    register = tf.resource("google_cloudfunctions2_function", "register")
    assert "event_trigger" not in register
    env = one(register["service_config"])["environment_variables"]
    assert "MLDIAG_REGISTRATION_URL = local.registration_url" in env
    assert tf.locals["registration_url"] == (
        "https://${var.region}-${var.project}.cloudfunctions.net/${var.prefix}register")
    # It signs upload URLs as itself (signBlob), for the objects its xplane grant covers.
    signer = tf.resource("google_service_account_iam_member", "register_signs_urls")
    assert signer["role"] == "roles/iam.serviceAccountTokenCreator"
    assert signer["member"] == '${google_service_account.function["register"].member}'
    assert "iamcredentials.googleapis.com" in str(tf.locals["apis"])


def _depends(body: dict[str, Any]) -> str:
    return str(body.get("depends_on", ""))


def test_a_fresh_project_gets_apis_agents_and_grants_in_order(tf: Terraform) -> None:
    apis = str(tf.locals["apis"])
    for api in ("cloudresourcemanager.googleapis.com", "monitoring.googleapis.com",
                "iam.googleapis.com", "eventarc.googleapis.com"):
        assert api in apis, api
    # Every service account waits for the APIs (IAM members follow through their account).
    for name, body in tf.resources["google_service_account"].items():
        assert "google_project_service.apis" in _depends(body), name
    # The service agents exist before any grant to them.
    agents = tf.resource("google_project_service_identity", "agent")
    assert "google-beta" in str(agents["provider"])
    assert agents["for_each"] == "${local.agent_services}"
    for service in ("pubsub", "monitoring", "artifactregistry", "eventarc"):
        assert f"{service}.googleapis.com" in str(tf.locals["agent_services"]), service
    for agent in ("pubsub_agent", "monitoring_agent", "registry_agent"):
        assert "google_project_service_identity.agent" in tf.locals[agent], agent
    monitoring = tf.resource("google_pubsub_topic_iam_member", "monitoring_notifications")
    assert monitoring["member"] == "${local.monitoring_agent}"
    # The Eventarc trigger waits for the GCS agent's publisher grant to propagate.
    wait = tf.resource("time_sleep", "iam_propagation")
    assert "google_project_iam_member.gcs_agent_publishes_events" in _depends(wait)
    _, _, storage_function = deployed_functions(tf)[STORAGE_FUNCTION]
    assert "time_sleep.iam_propagation" in _depends(storage_function)
    # The build identity holds what Google documents for a custom Cloud Build account.
    assert tf.resource("google_project_iam_member", "build_writes_logs")["role"] == (
        "roles/logging.logWriter")
    assert tf.resource("google_artifact_registry_repository_iam_member",
                       "build_pushes_images")["role"] == "roles/artifactregistry.writer"
    assert tf.resource("google_storage_bucket_iam_member", "build_reads_sources")["role"] == (
        "roles/storage.objectAdmin")


def test_cmek_grants_every_agent_before_its_resources_use_the_key(tf: Terraform) -> None:
    kms = tf.resource("google_kms_crypto_key_iam_member", "agents")
    assert "local.kms_agents" in kms["for_each"]
    assert set(tf.locals["kms_agents"]) == {"storage", "pubsub", "registry"}
    assert "cloudkms.googleapis.com" in str(tf.locals["apis"])
    for kind, name in (("google_artifact_registry_repository", "functions"),
                       ("google_storage_bucket", "profiles"), ("google_storage_bucket", "sources"),
                       ("google_pubsub_topic", "topic"), ("google_pubsub_topic", "dead_letter")):
        assert "google_kms_crypto_key_iam_member.agents" in _depends(
            tf.resource(kind, name)), name


def test_the_deployer_acts_only_as_the_accounts_terraform_creates(tf: Terraform) -> None:
    acts = tf.resource("google_service_account_iam_member", "deployer_acts_as")
    assert acts["role"] == "roles/iam.serviceAccountUser"
    assert acts["member"] == "${var.deployer}"
    assert "google_service_account.function" in acts["for_each"]
    project_roles = {b["role"] for b in tf.resources["google_project_iam_member"].values()}
    assert "roles/iam.serviceAccountUser" not in project_roles
    for name, key, body in instances(tf, "google_cloudfunctions2_function"):
        assert "time_sleep.iam_propagation" in _depends(body), (name, key)
    for kind, name in (("google_cloud_run_v2_service", "console"),
                       ("google_cloud_run_v2_job", "collect")):
        assert "time_sleep.iam_propagation" in _depends(tf.resource(kind, name)), name
    assert "google_service_account_iam_member.deployer_acts_as" in _depends(
        tf.resource("time_sleep", "iam_propagation"))


def test_the_collect_job_runs_its_tasks_at_once_and_says_how_many(tf: Terraform) -> None:
    """A large host's windows are shared by the job's tasks (window_tasks.py): every task
    starts at once, and the count the job's settings read is the job's own."""
    job = tf.resource("google_cloud_run_v2_job", "collect")
    template = job["template"][0] if isinstance(job["template"], list) else job["template"]
    assert template["task_count"] == template["parallelism"] == "${var.collect_job_tasks}"
    assert "MLDIAG_COLLECT_JOB_TASKS" in str(job)
    tasks = tf.variables["collect_job_tasks"]["default"]
    assert tasks >= 2, "one task would leave every window to task 0"


def test_prebuild_viewer_may_hand_a_large_session_to_the_collect_job(tf: Terraform) -> None:
    """A session whose viewer conversions need more than the function's memory is prebuilt
    in the collect job (stages.prebuild_viewer): the function knows the job and may start
    it, and the job says how much memory a prebuild may use there."""
    functions = tf.resource("google_cloudfunctions2_function", "pubsub")
    assert 'each.key == "prebuild_viewer" ? local.viewer_environment' in str(functions)
    assert tf.locals["viewer_environment"]["MLDIAG_COLLECT_JOB"] == "${var.prefix}collect"
    runs = tf.resource("google_cloud_run_v2_job_iam_member", "viewer_runs_job")
    assert runs["role"] == "roles/run.developer"
    assert "prebuild_viewer" in runs["member"]
    assert "MLDIAG_VIEWER_MEMORY_BUDGET" in str(tf.resource("google_cloud_run_v2_job", "collect"))
    assert tf.variables["collect_job_viewer_memory_budget"]["default"] == "14Gi"


def test_the_bucket_s_lifecycle_selects_the_viewer_caches_and_the_raw_profiles_apart() -> None:
    """Each retention selects its objects by what GCS conditions can: the caches by their
    prefix (never a profile or a report), the raw profiles by their suffix (never a cache
    object: the cache's xplanes are gzipped)."""
    from mldiag import viewer_cache
    from mldiag.model import XPLANE_SUFFIXES, HostRecord, SessionRecord

    def text(v: Any) -> Any:
        return [text(x) for x in v] if isinstance(v, list) else (
            v.strip('"') if isinstance(v, str) else v)

    storage = hcl2.loads((TERRAFORM / "storage.tf").read_text())
    main = hcl2.loads((TERRAFORM / "main.tf").read_text())
    bucket = next(r['"google_storage_bucket"']['"profiles"'] for r in storage["resource"]
                  if '"profiles"' in r.get('"google_storage_bucket"', {}))
    rules = [d['"lifecycle_rule"']["content"][0] for d in bucket["dynamic"]
             if '"lifecycle_rule"' in d] + bucket["lifecycle_rule"]
    conditions = [{k: text(v) for k, v in r["condition"][0].items()} for r in rules]
    local = main["locals"][0]
    assert text(local["viewer_cache_root"]) == viewer_cache.CACHE_ROOT
    assert tuple(text(local["profile_suffixes"])) == XPLANE_SUFFIXES
    by_prefix = [c for c in conditions if c.get("matches_prefix")]
    assert {p for c in by_prefix for p in c["matches_prefix"]} == {"${local.viewer_cache_root}/"}
    assert any(c.get("age") == "${lifecycle_rule.value}" for c in by_prefix)
    assert [c for c in conditions if c.get("matches_suffix") == "${local.profile_suffixes}"]
    # Superseded objects: by the customTime the pipeline sets (Storage.supersede), alone.
    custom = [c for c in conditions if "days_since_custom_time" in c]
    assert len(custom) == 1 and set(custom[0]) - {"__is_block__"} == {
        "days_since_custom_time", "with_state"}
    session = SessionRecord(run="r", session="s", state="REPORTED", hosts={
        "h": HostRecord("team/r/plugins/profile/s/h.xplane.pb", "7", 10, 0.0)})
    prefix = viewer_cache.cache_prefix(session)
    assert prefix.startswith(f"{viewer_cache.CACHE_ROOT}/")
    for rel in ("manifest.json", "plugins/profile/s/h.window00.xplane.pb",
                "stubs/h.xplane.pb", "plugins/profile/s/h.window00.SSTABLE"):
        name = viewer_cache.object_name(prefix, rel)
        assert not name.endswith(XPLANE_SUFFIXES), name
    for kept in ("team/r/plugins/profile/s/h.xplane.pb", "team/r/plugins/profile/s/analysis/"
                 "summary.html"):
        assert not kept.startswith(f"{viewer_cache.CACHE_ROOT}/")
