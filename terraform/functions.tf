# One Cloud Function gen2 per directory of functions/, each with its own service account that
# holds only what its stage touches. tests/deploy/test_terraform.py checks that this table and
# functions/ name the same functions, and each one's trigger.
locals {
  # memory/cpu/timeout: collect runs the collection tools in parallel on whole profiles, and
  # investigate its follow-up tools and the Gemini call; both get the Cloud Functions maximum
  # for event functions (540 s). on_capture_request waits for the profiler's capture window.
  # storage: bucket-wide roles on the profile bucket (reading only). Writes are conditional
  # grants: analysis_writer writes (and rewrites, such as analysis/summary.html of the latest
  # version) only under <session>/analysis/ (local.analysis_condition); xplane_writer only
  # <session>/<host>.xplane.pb (local.xplane_condition). publishes: the topics it publishes to.
  functions = {
    on_profile_object = {
      memory    = "1Gi", cpu = "1", timeout = 300, max_instances = 20
      storage   = ["roles/storage.objectViewer"]
      publishes = ["analysis-requests"]
    }
    on_degradation_alert = {
      memory    = "512Mi", cpu = "1", timeout = 60, max_instances = 5
      storage   = []
      publishes = ["capture-requests"]
    }
    # Writes each target's xplane (a redelivered capture rewrites its host's object) and
    # completes the session when its last host failed (analysis-requests).
    on_capture_request = {
      memory        = "2Gi", cpu = "1", timeout = 540, max_instances = 10
      storage       = ["roles/storage.objectViewer"]
      xplane_writer = true
      publishes     = ["analysis-requests"]
    }
    # /tmp is memory on gen2: a 2 GiB host (the default cap) is 2 GiB of RAM before xprof
    # parses it. Raise memory with MLDIAG_MAX_HOST_BYTES and the hosts per session.
    # Sessions over var.collect_function_max_host_bytes per host (or max hosts) go to the
    # collect Cloud Run job (job.tf); many-host and large sessions fan out to collect_host
    # (host-analysis-requests) and come back here to be combined.
    collect = {
      memory          = "8Gi", cpu = "2", timeout = 540, max_instances = 10
      storage         = ["roles/storage.objectViewer"]
      analysis_writer = true
      publishes       = ["investigation-requests", "report-requests", "host-analysis-requests"]
    }
    # One instance per host of a fanned-out session; the last one asks for the combine.
    collect_host = {
      memory          = "8Gi", cpu = "2", timeout = 540, max_instances = 50
      storage         = ["roles/storage.objectViewer"]
      analysis_writer = true
      publishes       = ["analysis-requests"]
    }
    investigate = {
      memory          = "8Gi", cpu = "2", timeout = 540, max_instances = 10
      storage         = ["roles/storage.objectViewer"]
      analysis_writer = true
      publishes       = ["report-requests"]
    }
    # Asks for the viewer's caches once the session is REPORTED (viewer-requests).
    render_report = {
      memory          = "1Gi", cpu = "1", timeout = 300, max_instances = 10
      storage         = ["roles/storage.objectViewer"]
      analysis_writer = true
      publishes       = ["viewer-requests"]
    }
    # Builds the XProf viewer's caches (trace viewer, overview) of a REPORTED session, so the
    # first open in the console is warm: the session's xplanes in /tmp (memory) and xprof's
    # conversions, like collect. It reads the bucket and writes only under the sessions'
    # xprof-cache/ (viewer_cache: local.viewer_cache_condition).
    prebuild_viewer = {
      memory       = "8Gi", cpu = "2", timeout = 540, max_instances = 10
      storage      = ["roles/storage.objectViewer"]
      viewer_cache = true
      publishes    = []
    }
    # Settles quiet sessions (analysis-requests) and re-queues stuck ones (analysis- and
    # investigation-requests). One instance: ticks never overlap. Once an hour it lists the
    # bucket (objectViewer) for profiles whose finalize event was lost (stages.rescan).
    sweep = {
      memory    = "512Mi", cpu = "1", timeout = 300, max_instances = 1
      storage   = ["roles/storage.objectViewer"]
      publishes = ["analysis-requests", "investigation-requests"]
    }
    dead_letters = {
      memory    = "512Mi", cpu = "1", timeout = 60, max_instances = 5
      storage   = []
      publishes = []
    }
    # The workloads' way in (mldiag.registration): HTTP, called by var.workload_service_accounts
    # with their Google ID tokens. It holds what workloads used to: Firestore (runs, targets,
    # run owners) and the creation of xplanes, which it hands out as signed upload URLs for one
    # object each.
    register = {
      memory        = "512Mi", cpu = "1", timeout = 60, max_instances = 20
      storage       = []
      xplane_writer = true
      http          = true
      publishes     = []
    }
  }

  # Every function but on_profile_object (Eventarc) and register (HTTP) is pushed from a
  # subscription (pubsub.tf).
  pubsub_functions = { for name, f in local.functions : name => f if !contains(["on_profile_object", "register"], name) }
  # The functions the trigger identity invokes: all but register, which workloads call.
  event_functions = { for name, f in local.functions : name => f if name != "register" }

  # Its URL, known before it exists: the audience of the workloads' ID tokens.
  registration_url = "https://${var.region}-${var.project}.cloudfunctions.net/${var.prefix}register"

  # Service account ids are at most 30 characters: short, stable suffixes.
  account_ids = {
    on_profile_object    = "objects"
    on_degradation_alert = "alerts"
    on_capture_request   = "capture"
    collect              = "collect"
    collect_host         = "collect-host"
    investigate          = "investigate"
    render_report        = "report"
    prebuild_viewer      = "viewer"
    sweep                = "sweep"
    dead_letters         = "dead-letters"
    register             = "register"
  }

  environment = merge({
    MLDIAG_BACKEND            = "gcp"
    MLDIAG_PROJECT            = var.project
    MLDIAG_BUCKET             = google_storage_bucket.profiles.name
    MLDIAG_LOCATION           = local.vertex_location
    MLDIAG_TOPIC_PREFIX       = var.prefix
    MLDIAG_FIRESTORE_DATABASE = google_firestore_database.main.name
    MLDIAG_MAX_ATTEMPTS       = tostring(local.max_function_attempts)
    # Hosts of one dropped multi-host session upload seconds apart: wait longer than locally
    # before analysing a session that expects no particular hosts.
    MLDIAG_SETTLE_S = tostring(var.settle_seconds)
    # Where on_capture_request may connect (mldiag.capture.egress): the workloads' networks
    # and ports, never loopback, link-local or the metadata server.
    MLDIAG_CAPTURE_ALLOWED_NETWORKS = join(",", var.capture_allowed_networks)
    MLDIAG_CAPTURE_ALLOWED_PORTS    = var.capture_allowed_ports
    MLDIAG_CAPTURE_ALLOW_LOOPBACK   = "0"
    LOG_EXECUTION_ID                = "true"
  }, var.extra_environment)

  # Only investigate calls Gemini (and only it holds roles/aiplatform.user); the others keep
  # the rule-based default.
  investigator_environment = {
    MLDIAG_INVESTIGATOR = var.investigator
    MLDIAG_GEMINI_MODEL = var.gemini_model
  }

  # Where collect sends what it cannot take on (job.tf).
  collect_environment = {
    MLDIAG_COLLECT_JOB             = "${var.prefix}collect"
    MLDIAG_FUNCTION_MAX_HOST_BYTES = tostring(var.collect_function_max_host_bytes)
    MLDIAG_FUNCTION_MAX_HOSTS      = tostring(var.collect_function_max_hosts)
  }

  # Where prebuild_viewer sends a session whose viewer conversions need more memory than it
  # has (job.tf: the job sets its own MLDIAG_VIEWER_MEMORY_BUDGET).
  viewer_environment = {
    MLDIAG_COLLECT_JOB = "${var.prefix}collect"
  }

  # objectUser on the XProf viewer's caches only (mldiag.viewer_cache.cache_prefix:
  # xprof-cache/<session dir>/analysis/<key>/...), for prebuild_viewer and the console. Their
  # own top-level prefix is what the bucket's lifecycle expires (storage.tf); xplane names are
  # refused there (the cache's xplanes are stored gzipped): a cache object can never pass for
  # a profile (on_profile_object). Listing is checked on the bucket, not on an object: it
  # comes with objectViewer.
  viewer_cache_condition = {
    title       = "xprof-viewer-cache"
    description = "Objects under xprof-cache/ of the profile bucket, except xplanes."
    expression = join(" && ", [
      "resource.name.startsWith(\"projects/_/buckets/${google_storage_bucket.profiles.name}/objects/xprof-cache/\")",
      "!resource.name.endsWith(\".xplane.pb\")",
      "!resource.name.endsWith(\".xplane.riegeli\")",
    ])
  }
  viewer_cache_writers = toset([for name, f in local.functions : name if try(f.viewer_cache, false)])

  # The stages' artifacts: objects under <session>/analysis/ (mldiag.model: analysis_dir, and
  # its v<n>/ and hosts/ below), never an xplane, so a stage can neither rewrite nor delete a
  # profile, nor write one that on_profile_object would take for a profile.
  analysis_condition = {
    title       = "mldiag-analysis"
    description = "Objects under <session>/analysis/ of the profile bucket, except xplanes."
    expression = join(" && ", [
      "resource.name.startsWith(\"projects/_/buckets/${google_storage_bucket.profiles.name}/objects/\")",
      "resource.name.extract(\"/plugins/profile/{session}/analysis/\") != \"\"",
      "!resource.name.endsWith(\".xplane.pb\")",
      "!resource.name.endsWith(\".xplane.riegeli\")",
    ])
  }
  analysis_writers = toset([for name, f in local.functions : name if try(f.analysis_writer, false)])

  # The profiles themselves: <session>/<host>.xplane.pb (on_capture_request, and the register
  # function, whose signed URLs carry its authority for one such object each). The session
  # directory is the segment after plugins/profile/; nothing under analysis/ matches.
  xplane_condition = {
    title       = "mldiag-xplanes"
    description = "<session>/<host>.xplane.pb objects of the profile bucket."
    expression = join(" && ", [
      "resource.name.startsWith(\"projects/_/buckets/${google_storage_bucket.profiles.name}/objects/\")",
      "resource.name.extract(\"/plugins/profile/{session}/\") != \"\"",
      "resource.name.extract(\"/plugins/profile/{session}/analysis/\") == \"\"",
      "resource.name.endsWith(\".xplane.pb\")",
    ])
  }
  xplane_writers = toset([for name, f in local.functions : name if try(f.xplane_writer, false)])

  storage_grants = merge([
    for name, f in local.functions : { for role in f.storage : "${name} ${role}" => { name = name, role = role } }
  ]...)
  publish_grants = merge([
    for name, f in local.functions : { for topic in f.publishes : "${name} ${topic}" => { name = name, topic = topic } }
  ]...)
}

resource "google_service_account" "function" {
  for_each     = local.functions
  account_id   = "${var.prefix}fn-${local.account_ids[each.key]}"
  display_name = "mldiag function ${each.key}"
  description  = "Runtime identity of the ${each.key} Cloud Function."

  depends_on = [google_project_service.apis]
}

# Pushes Pub/Sub messages and Eventarc events to the functions: the only invoker.
resource "google_service_account" "trigger" {
  account_id   = "${var.prefix}trigger"
  display_name = "mldiag trigger"
  description  = "Identity of the Pub/Sub push subscriptions and the Eventarc trigger that invoke the mldiag functions."

  depends_on = [google_project_service.apis]
}

# Builds the functions' images (Cloud Build) instead of the default compute service account.
resource "google_service_account" "build" {
  account_id   = "${var.prefix}build"
  display_name = "mldiag function builds"
  description  = "Cloud Build identity that builds the mldiag functions from their source zips."

  depends_on = [google_project_service.apis]
}

# Runtime roles

resource "google_project_iam_member" "function_firestore" {
  for_each = local.functions
  project  = var.project
  role     = "roles/datastore.user"
  member   = google_service_account.function[each.key].member

  # Only mldiag's database, not every Firestore database of the project.
  condition {
    title      = "mldiag-database"
    expression = "resource.name == \"projects/${var.project}/databases/${google_firestore_database.main.name}\" || resource.name.startsWith(\"projects/${var.project}/databases/${google_firestore_database.main.name}/\")"
  }
}

resource "google_storage_bucket_iam_member" "function_storage" {
  for_each = local.storage_grants
  bucket   = google_storage_bucket.profiles.name
  role     = each.value.role
  member   = google_service_account.function[each.value.name].member
}

resource "google_storage_bucket_iam_member" "function_viewer_cache" {
  for_each = local.viewer_cache_writers
  bucket   = google_storage_bucket.profiles.name
  role     = "roles/storage.objectUser"
  member   = google_service_account.function[each.key].member

  condition {
    title       = local.viewer_cache_condition.title
    description = local.viewer_cache_condition.description
    expression  = local.viewer_cache_condition.expression
  }
}

resource "google_storage_bucket_iam_member" "function_analysis" {
  for_each = local.analysis_writers
  bucket   = google_storage_bucket.profiles.name
  role     = "roles/storage.objectUser"
  member   = google_service_account.function[each.key].member

  condition {
    title       = local.analysis_condition.title
    description = local.analysis_condition.description
    expression  = local.analysis_condition.expression
  }
}

# objectUser, not objectCreator: a redelivered capture, or a workload's second upload of the
# same host, rewrites the object (a rewrite needs storage.objects.delete).
resource "google_storage_bucket_iam_member" "function_xplanes" {
  for_each = local.xplane_writers
  bucket   = google_storage_bucket.profiles.name
  role     = "roles/storage.objectUser"
  member   = google_service_account.function[each.key].member

  condition {
    title       = local.xplane_condition.title
    description = local.xplane_condition.description
    expression  = local.xplane_condition.expression
  }
}

# The register function signs upload URLs without a key: IAM signBlob as itself.
resource "google_service_account_iam_member" "register_signs_urls" {
  service_account_id = google_service_account.function["register"].name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = google_service_account.function["register"].member
}

resource "google_pubsub_topic_iam_member" "function_publishes" {
  for_each = local.publish_grants
  topic    = google_pubsub_topic.topic[each.value.topic].id
  role     = "roles/pubsub.publisher"
  member   = google_service_account.function[each.value.name].member
}

# Gemini's generateContent is aiplatform.endpoints.predict on the publisher model; that one
# permission, instead of roles/aiplatform.user (every Vertex AI resource of the project).
resource "google_project_iam_custom_role" "gemini_predict" {
  count       = var.investigator == "gemini" ? 1 : 0
  project     = var.project
  role_id     = "${replace(var.prefix, "-", "_")}gemini_predict"
  title       = "mldiag Gemini calls"
  description = "Call Gemini models on Vertex AI (generateContent), nothing else."
  permissions = ["aiplatform.endpoints.predict"]

  depends_on = [google_project_service.apis]
}

resource "google_project_iam_member" "investigate_vertex" {
  count   = var.investigator == "gemini" ? 1 : 0
  project = var.project
  role    = google_project_iam_custom_role.gemini_predict[0].name
  member  = google_service_account.function["investigate"].member
}

# Trigger and build roles

resource "google_project_iam_member" "trigger_receives_events" {
  project = var.project
  role    = "roles/eventarc.eventReceiver"
  member  = google_service_account.trigger.member
}

resource "google_cloud_run_v2_service_iam_member" "trigger_invokes" {
  for_each = local.event_functions
  location = var.region
  # A gen2 function runs as the Cloud Run service of the same name.
  name   = each.key == "on_profile_object" ? google_cloudfunctions2_function.on_profile_object.name : google_cloudfunctions2_function.pubsub[each.key].name
  role   = "roles/run.invoker"
  member = google_service_account.trigger.member
}

resource "google_project_iam_member" "build_writes_logs" {
  project = var.project
  role    = "roles/logging.logWriter"
  member  = google_service_account.build.member
}

resource "google_artifact_registry_repository_iam_member" "build_pushes_images" {
  location   = google_artifact_registry_repository.functions.location
  repository = google_artifact_registry_repository.functions.name
  role       = "roles/artifactregistry.writer"
  member     = google_service_account.build.member
}

# What Google documents for a custom build service account of Cloud Run functions: logs,
# the image repository, and objectAdmin on the sources bucket (it reads the source and keeps
# build state there).
resource "google_storage_bucket_iam_member" "build_reads_sources" {
  bucket = google_storage_bucket.sources.name
  role   = "roles/storage.objectAdmin"
  member = google_service_account.build.member
}

# With var.deployer, the deployer may act as each identity terraform hands to a service (the
# functions', the trigger's, the build's, the job's and the console's), and as no other service
# account of the project: instead of roles/iam.serviceAccountUser on the whole project.
resource "google_service_account_iam_member" "deployer_acts_as" {
  for_each = var.deployer == "" ? {} : merge(
    { for name, sa in google_service_account.function : "fn-${name}" => sa.name },
    { trigger = google_service_account.trigger.name, build = google_service_account.build.name,
    collect_job = google_service_account.collect_job.name },
    { for sa in google_service_account.console : "console" => sa.name },
  )
  service_account_id = each.value
  role               = "roles/iam.serviceAccountUser"
  member             = var.deployer
}

resource "google_artifact_registry_repository" "functions" {
  location      = var.region
  repository_id = "${var.prefix}functions"
  description   = "Images of the mldiag Cloud Functions."
  format        = "DOCKER"
  kms_key_name  = var.kms_key_name

  # Keep the images of the last few deploys only.
  cleanup_policy_dry_run = false
  cleanup_policies {
    id     = "keep-recent"
    action = "KEEP"
    most_recent_versions {
      keep_count = 5
    }
  }
  cleanup_policies {
    id     = "delete-old"
    action = "DELETE"
    condition {
      older_than = "2592000s"
    }
  }

  depends_on = [google_project_service.apis, google_kms_crypto_key_iam_member.agents]
}

# The functions

resource "google_cloudfunctions2_function" "pubsub" {
  for_each    = local.pubsub_functions
  name        = "${var.prefix}${replace(each.key, "_", "-")}"
  location    = var.region
  description = "mldiag ${each.key}: pushed from Pub/Sub (pubsub.tf)."

  build_config {
    runtime           = "python312"
    entry_point       = each.key
    service_account   = google_service_account.build.id
    docker_repository = google_artifact_registry_repository.functions.id
    source {
      storage_source {
        bucket = google_storage_bucket.sources.name
        object = google_storage_bucket_object.source[each.key].name
      }
    }
  }

  service_config {
    available_memory                 = each.value.memory
    available_cpu                    = each.value.cpu
    timeout_seconds                  = each.value.timeout
    max_instance_count               = each.value.max_instances
    min_instance_count               = 0
    max_instance_request_concurrency = 1
    # Pub/Sub push, Eventarc and Cloud Scheduler count as internal traffic.
    ingress_settings               = "ALLOW_INTERNAL_ONLY"
    all_traffic_on_latest_revision = true
    service_account_email          = google_service_account.function[each.key].email
    environment_variables          = merge(local.environment, each.key == "investigate" ? local.investigator_environment : {}, each.key == "collect" ? local.collect_environment : {}, each.key == "prebuild_viewer" ? local.viewer_environment : {})
    # on_capture_request captures plain profiler servers; sweep checks their liveness.
    vpc_connector                 = contains(["on_capture_request", "sweep"], each.key) ? var.capture_vpc_connector : null
    vpc_connector_egress_settings = contains(["on_capture_request", "sweep"], each.key) && var.capture_vpc_connector != null ? "PRIVATE_RANGES_ONLY" : null
  }

  depends_on = [
    google_project_iam_member.build_writes_logs,
    google_artifact_registry_repository_iam_member.build_pushes_images,
    google_storage_bucket_iam_member.build_reads_sources,
    # The deployer's actAs on the function's identities must have propagated.
    time_sleep.iam_propagation,
  ]
}

resource "google_cloudfunctions2_function" "on_profile_object" {
  name        = "${var.prefix}on-profile-object"
  location    = var.region
  description = "mldiag on_profile_object: Eventarc, object finalized in the profile bucket."

  build_config {
    runtime           = "python312"
    entry_point       = "on_profile_object"
    service_account   = google_service_account.build.id
    docker_repository = google_artifact_registry_repository.functions.id
    source {
      storage_source {
        bucket = google_storage_bucket.sources.name
        object = google_storage_bucket_object.source["on_profile_object"].name
      }
    }
  }

  service_config {
    available_memory                 = local.functions.on_profile_object.memory
    available_cpu                    = local.functions.on_profile_object.cpu
    timeout_seconds                  = local.functions.on_profile_object.timeout
    max_instance_count               = local.functions.on_profile_object.max_instances
    min_instance_count               = 0
    max_instance_request_concurrency = 1
    ingress_settings                 = "ALLOW_INTERNAL_ONLY"
    all_traffic_on_latest_revision   = true
    service_account_email            = google_service_account.function["on_profile_object"].email
    environment_variables            = local.environment
  }

  event_trigger {
    trigger_region        = lower(google_storage_bucket.profiles.location)
    event_type            = "google.cloud.storage.object.v1.finalized"
    retry_policy          = "RETRY_POLICY_RETRY"
    service_account_email = google_service_account.trigger.email
    event_filters {
      attribute = "bucket"
      value     = google_storage_bucket.profiles.name
    }
  }

  depends_on = [
    google_project_iam_member.build_writes_logs,
    google_artifact_registry_repository_iam_member.build_pushes_images,
    google_storage_bucket_iam_member.build_reads_sources,
    google_project_iam_member.gcs_agent_publishes_events,
    google_project_iam_member.trigger_receives_events,
    # The grants above must have propagated when Eventarc checks them.
    time_sleep.iam_propagation,
  ]
}

# The register function (mldiag.registration): HTTP, IAM-authenticated. Only the workloads'
# service accounts may invoke it, and it checks each caller's Google ID token itself (audience:
# local.registration_url) and binds each run to the first identity that registers it.
resource "google_cloudfunctions2_function" "register" {
  name        = "${var.prefix}register"
  location    = var.region
  description = "mldiag register: workloads register their runs and targets and get signed upload URLs."

  build_config {
    runtime           = "python312"
    entry_point       = "register"
    service_account   = google_service_account.build.id
    docker_repository = google_artifact_registry_repository.functions.id
    source {
      storage_source {
        bucket = google_storage_bucket.sources.name
        object = google_storage_bucket_object.source["register"].name
      }
    }
  }

  service_config {
    available_memory                 = local.functions.register.memory
    available_cpu                    = local.functions.register.cpu
    timeout_seconds                  = local.functions.register.timeout
    max_instance_count               = local.functions.register.max_instances
    min_instance_count               = 0
    max_instance_request_concurrency = 1
    # Internal by default, like the others; var.registration_ingress opens it to workloads
    # outside the VPC (IAM and the ID token check admit only their identities either way).
    ingress_settings               = var.registration_ingress
    all_traffic_on_latest_revision = true
    service_account_email          = google_service_account.function["register"].email
    environment_variables          = merge(local.environment, { MLDIAG_REGISTRATION_URL = local.registration_url })
  }

  depends_on = [
    google_project_iam_member.build_writes_logs,
    google_artifact_registry_repository_iam_member.build_pushes_images,
    google_storage_bucket_iam_member.build_reads_sources,
    # The deployer's actAs on the function's identities must have propagated.
    time_sleep.iam_propagation,
  ]
}

# The workloads' own identities (the SDK in each training process): they call the register
# function (run.invoker) and publish their monitor's alerts. They hold no role on Firestore or
# the bucket: a workload reaches only its own runs, through the function.
resource "google_cloud_run_v2_service_iam_member" "workloads_register" {
  for_each = toset(var.workload_service_accounts)
  location = var.region
  name     = google_cloudfunctions2_function.register.name
  role     = "roles/run.invoker"
  member   = "serviceAccount:${each.value}"
}

resource "google_pubsub_topic_iam_member" "workload_alerts" {
  for_each = toset(var.workload_service_accounts)
  topic    = google_pubsub_topic.topic["degradation-alerts"].id
  role     = "roles/pubsub.publisher"
  member   = "serviceAccount:${each.value}"
}
