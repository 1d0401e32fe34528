# mldiag on Google Cloud: the event chain of DESIGN.md as Cloud Functions gen2.
#
# Build order: `scripts/package_functions` writes dist/functions/<name>.zip, then `terraform apply`
# uploads each zip to the sources bucket and deploys one function per zip (README "Deploy to
# Google Cloud").

data "google_project" "this" {
  project_id = var.project
}

locals {
  bucket_name       = coalesce(var.bucket_name, "${var.project}-mldiag-profiles")
  firestore_loc     = coalesce(var.firestore_location, var.region)
  vertex_location   = coalesce(var.vertex_location, var.region)
  dist_dir          = coalesce(var.functions_dist_dir, "${path.module}/../dist/functions")
  pubsub_agent      = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"
  storage_agent     = "serviceAccount:${data.google_storage_project_service_account.gcs.email_address}"

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

  apis = toset([
    "aiplatform.googleapis.com",
    "artifactregistry.googleapis.com",
    "cloudbuild.googleapis.com",
    "cloudfunctions.googleapis.com",
    "cloudscheduler.googleapis.com",
    "eventarc.googleapis.com",
    "firestore.googleapis.com",
    "iam.googleapis.com",
    # IAP on the load balancer in front of the console (console.tf).
    "iap.googleapis.com",
    "logging.googleapis.com",
    "pubsub.googleapis.com",
    "run.googleapis.com",
    "secretmanager.googleapis.com",
    "storage.googleapis.com",
  ])
}

resource "google_project_service" "apis" {
  for_each = local.apis
  project  = var.project
  service  = each.value
  # Other workloads in the project may use these APIs too: never turn them off on destroy.
  disable_on_destroy = false
}

# The Cloud Storage service agent publishes the bucket's finalize events for Eventarc.
data "google_storage_project_service_account" "gcs" {
  project    = var.project
  depends_on = [google_project_service.apis]
}

resource "google_project_iam_member" "gcs_agent_publishes_events" {
  project = var.project
  role    = "roles/pubsub.publisher"
  member  = local.storage_agent
}

# Data Access audit logs for the profile bucket's reads and writes (who read which profile or
# report); they stand in for bucket access logs (storage.tf).
resource "google_project_iam_audit_config" "storage" {
  count   = var.storage_audit_logs ? 1 : 0
  project = var.project
  service = "storage.googleapis.com"

  audit_log_config {
    log_type = "DATA_READ"
  }
  audit_log_config {
    log_type = "DATA_WRITE"
  }
}

# With a customer-managed key, the service agents that encrypt for us must be able to use it.
resource "google_kms_crypto_key_iam_member" "agents" {
  for_each      = var.kms_key_name == null ? toset([]) : toset([local.storage_agent, local.pubsub_agent])
  crypto_key_id = var.kms_key_name
  role          = "roles/cloudkms.cryptoKeyEncrypterDecrypter"
  member        = each.value
}
