# mldiag on Google Cloud: the event chain of DESIGN.md as Cloud Functions gen2.
#
# Build order: `scripts/package_functions` writes dist/functions/<name>.zip, then `terraform apply`
# uploads each zip to the sources bucket and deploys one function per zip (docs/deploy-gcp.md).

data "google_project" "this" {
  project_id = var.project
}

locals {
  bucket_name = coalesce(var.bucket_name, "${var.project}-mldiag-profiles")
  # Where the XProf viewer's caches live in the bucket (mldiag.viewer_cache.CACHE_ROOT).
  viewer_cache_root = "xprof-cache"
  # What a profile object's name ends with (mldiag.model.XPLANE_SUFFIXES); the cache's own
  # xplanes end in .gz.
  profile_suffixes = [".xplane.pb", ".xplane.riegeli"]
  firestore_loc    = coalesce(var.firestore_location, var.region)
  vertex_location  = coalesce(var.vertex_location, var.region)
  dist_dir         = coalesce(var.functions_dist_dir, "${path.module}/../dist/functions")
  # The service agents, created up front (google_project_service_identity below) so that no
  # grant to one races its creation on a fresh project. Some services return no email for
  # their agent: then it is the documented service-PROJECT_NUMBER@gcp-sa-... address.
  pubsub_agent     = "serviceAccount:${coalesce(google_project_service_identity.agent["pubsub.googleapis.com"].email, "service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com")}"
  storage_agent    = "serviceAccount:${data.google_storage_project_service_account.gcs.email_address}"
  monitoring_agent = "serviceAccount:${coalesce(google_project_service_identity.agent["monitoring.googleapis.com"].email, "service-${data.google_project.this.number}@gcp-sa-monitoring-notification.iam.gserviceaccount.com")}"
  registry_agent   = "serviceAccount:${coalesce(google_project_service_identity.agent["artifactregistry.googleapis.com"].email, "service-${data.google_project.this.number}@gcp-sa-artifactregistry.iam.gserviceaccount.com")}"

  # The message topics (DESIGN.md "The event chain", mldiag.messages.TOPIC_OF) and the function
  # each one is pushed to. Every topic has a `<topic>-dead-letter` topic, pushed to dead_letters.
  # `profile-objects` is not here: on GCP the bucket's finalize events reach on_profile_object
  # through Eventarc (functions.tf).
  topics = {
    "degradation-alerts"     = "on_degradation_alert"
    "capture-requests"       = "on_capture_request"
    "analysis-requests"      = "collect"
    "host-analysis-requests" = "collect_host"
    "investigation-requests" = "investigate"
    "report-requests"        = "render_report"
    "viewer-requests"        = "prebuild_viewer"
    "sweep-ticks"            = "sweep"
  }

  apis = setunion([
    "aiplatform.googleapis.com",
    "artifactregistry.googleapis.com",
    "cloudbuild.googleapis.com",
    "cloudfunctions.googleapis.com",
    # Project IAM policies and audit configs (google_project_iam_*) go through it.
    "cloudresourcemanager.googleapis.com",
    "cloudscheduler.googleapis.com",
    "eventarc.googleapis.com",
    "firestore.googleapis.com",
    "iam.googleapis.com",
    # signBlob: the register function signs upload URLs as itself (functions.tf).
    "iamcredentials.googleapis.com",
    # IAP on the load balancer in front of the console (console.tf).
    "iap.googleapis.com",
    "logging.googleapis.com",
    # Alert policies notify degradation-alerts as its notification service agent (pubsub.tf).
    "monitoring.googleapis.com",
    "pubsub.googleapis.com",
    "run.googleapis.com",
    "secretmanager.googleapis.com",
    "storage.googleapis.com",
  ], var.kms_key_name == null ? [] : ["cloudkms.googleapis.com"])

  # The service agents created before anything is granted to them: Pub/Sub (push tokens, dead
  # letters, CMEK), Monitoring (notification channels), Artifact Registry (CMEK of the images)
  # and Eventarc (the finalize trigger).
  agent_services = toset([
    "artifactregistry.googleapis.com",
    "eventarc.googleapis.com",
    "monitoring.googleapis.com",
    "pubsub.googleapis.com",
  ])

  # Every agent that encrypts with var.kms_key_name when it is set.
  kms_agents = {
    storage  = local.storage_agent
    pubsub   = local.pubsub_agent
    registry = local.registry_agent
  }
}

resource "google_project_service" "apis" {
  for_each = local.apis
  project  = var.project
  service  = each.value
  # Other workloads in the project may use these APIs too: never turn them off on destroy.
  disable_on_destroy = false
}

resource "google_project_service_identity" "agent" {
  provider = google-beta
  for_each = local.agent_services
  project  = var.project
  service  = each.value

  depends_on = [google_project_service.apis]
}

# The Cloud Storage service agent publishes the bucket's finalize events for Eventarc (reading
# this data source creates the agent if it does not exist yet).
data "google_storage_project_service_account" "gcs" {
  project    = var.project
  depends_on = [google_project_service.apis]
}

resource "google_project_iam_member" "gcs_agent_publishes_events" {
  project = var.project
  role    = "roles/pubsub.publisher"
  member  = local.storage_agent
}

# IAM grants take effect within seconds to minutes: Eventarc checks the GCS agent's publisher
# role when the trigger is created, and Cloud Functions the deployer's actAs on a function's
# identity, so the functions wait this long after those grants (on the first apply only).
resource "time_sleep" "iam_propagation" {
  create_duration = "90s"

  depends_on = [
    google_project_iam_member.gcs_agent_publishes_events,
    google_project_iam_member.trigger_receives_events,
    google_service_account_iam_member.deployer_acts_as,
  ]
}

# Data Access audit logs for the profile bucket's reads and writes (who read which profile or
# report); they stand in for bucket access logs (storage.tf).
resource "google_project_iam_audit_config" "storage" {
  count   = var.storage_audit_logs ? 1 : 0
  project = var.project
  service = "storage.googleapis.com"

  depends_on = [google_project_service.apis]

  audit_log_config {
    log_type = "DATA_READ"
  }
  audit_log_config {
    log_type = "DATA_WRITE"
  }
}

# With a customer-managed key, every service agent that encrypts for us must be able to use it:
# Cloud Storage (both buckets), Pub/Sub (the topics) and Artifact Registry (the functions'
# images). The agents exist before the grants (google_project_service_identity), and the
# resources that use the key wait for the grants (depends_on there).
resource "google_kms_crypto_key_iam_member" "agents" {
  for_each      = var.kms_key_name == null ? {} : local.kms_agents
  crypto_key_id = var.kms_key_name
  role          = "roles/cloudkms.cryptoKeyEncrypterDecrypter"
  member        = each.value
}
