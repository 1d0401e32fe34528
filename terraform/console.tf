# The console (DESIGN.md "Viewing"): the web UI, the JSON API and the XProf viewer of any one
# session, as a Cloud Run service. Created only once var.console_image is set (built from
# deploy/console/Dockerfile, docs/deploy-gcp.md).
#
# Who reaches it: the ingress admits internal traffic and Cloud Load Balancing only, so the way
# in is an HTTPS load balancer, set up by the user, whose serverless NEG points at this service
# and whose backend service has IAP turned on. The console checks IAP's signed header against
# var.console_iap_audience (MLDIAG_CONSOLE_AUTH=iap) and maps its email to role bindings
# (`mldiag roles grant`); nobody else may invoke the service (no allUsers binding).
#
# What it touches, as its own service account: it reads the bucket; it writes only the viewer's
# caches (local.viewer_cache_condition, as prebuild_viewer does); Firestore, on the mldiag
# database only (tokens, share links, role bindings); and it publishes on capture-requests
# alone (the action bar's captures and continuous profiling).

locals {
  console = var.console_image != ""

  # The functions' settings, and IAP sign-in. MLDIAG_IAP_AUDIENCE is left out until it is
  # known (an empty value would be a perpetual diff); without it no IAP user gets in.
  console_environment = merge(
    local.environment,
    { MLDIAG_CONSOLE_AUTH = "iap" },
    { for name, value in { MLDIAG_IAP_AUDIENCE = var.console_iap_audience } : name => value if value != "" },
  )
}

resource "google_service_account" "console" {
  count        = local.console ? 1 : 0
  account_id   = "${var.prefix}console"
  display_name = "mldiag console"
  description  = "Runtime identity of the mldiag console Cloud Run service."

  depends_on = [google_project_service.apis]
}

resource "google_cloud_run_v2_service" "console" {
  count               = local.console ? 1 : 0
  name                = "${var.prefix}console"
  location            = var.region
  description         = "mldiag console: runs, sessions, reports and the XProf viewer, behind IAP."
  ingress             = var.console_ingress
  deletion_protection = false

  template {
    service_account = google_service_account.console[0].email
    # A trace viewer conversion of a large profile is the slowest request.
    timeout                          = "300s"
    max_instance_request_concurrency = 40

    scaling {
      min_instance_count = 0
      max_instance_count = var.console_max_instances
    }

    containers {
      # The image's entrypoint runs `mldiag console --host 0.0.0.0 --port $PORT`.
      image = var.console_image

      ports {
        container_port = 8080
      }

      # The viewer's workspaces (xplanes and xprof's conversions) live in /tmp, which is
      # memory on Cloud Run, like the functions' (BENCHMARKS.md "Large profiles").
      resources {
        limits = {
          memory = "8Gi"
          cpu    = "2"
        }
        startup_cpu_boost = true
      }

      dynamic "env" {
        for_each = local.console_environment
        content {
          name  = env.key
          value = env.value
        }
      }

      # One key for every instance (CSRF tokens of signed-in browsers): a per-instance random
      # key would reject a form posted to another instance. A new key version (secrets.tf)
      # rolls out as a new revision.
      env {
        name = "MLDIAG_CONSOLE_SECRET"
        value_source {
          secret_key_ref {
            secret  = google_secret_manager_secret.share_link_key.secret_id
            version = google_secret_manager_secret_version.share_link_key.version
          }
        }
      }
    }
  }

  depends_on = [
    google_project_service.apis,
    google_secret_manager_secret_iam_member.console_reads_key,
    # The deployer's actAs on the console's identity (var.deployer) must have propagated.
    time_sleep.iam_propagation,
  ]
}

# Runtime roles

resource "google_storage_bucket_iam_member" "console_reads_profiles" {
  count  = local.console ? 1 : 0
  bucket = google_storage_bucket.profiles.name
  role   = "roles/storage.objectViewer"
  member = google_service_account.console[0].member
}

resource "google_storage_bucket_iam_member" "console_writes_viewer_cache" {
  count  = local.console ? 1 : 0
  bucket = google_storage_bucket.profiles.name
  role   = "roles/storage.objectUser"
  member = google_service_account.console[0].member

  condition {
    title       = local.viewer_cache_condition.title
    description = local.viewer_cache_condition.description
    expression  = local.viewer_cache_condition.expression
  }
}

resource "google_project_iam_member" "console_firestore" {
  count   = local.console ? 1 : 0
  project = var.project
  role    = "roles/datastore.user"
  member  = google_service_account.console[0].member

  condition {
    title      = "mldiag-database"
    expression = "resource.name == \"projects/${var.project}/databases/${google_firestore_database.main.name}\" || resource.name.startsWith(\"projects/${var.project}/databases/${google_firestore_database.main.name}/\")"
  }
}

resource "google_pubsub_topic_iam_member" "console_publishes_captures" {
  count  = local.console ? 1 : 0
  topic  = google_pubsub_topic.topic["capture-requests"].id
  role   = "roles/pubsub.publisher"
  member = google_service_account.console[0].member
}

# An expired viewer cache is rebuilt on demand: the console asks prebuild_viewer for it
# (mldiag.viewer_cache.rebuild_message).
resource "google_pubsub_topic_iam_member" "console_publishes_rebuilds" {
  count  = local.console ? 1 : 0
  topic  = google_pubsub_topic.topic["viewer-requests"].id
  role   = "roles/pubsub.publisher"
  member = google_service_account.console[0].member
}

resource "google_secret_manager_secret_iam_member" "console_reads_key" {
  count     = local.console ? 1 : 0
  secret_id = google_secret_manager_secret.share_link_key.id
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.console[0].member
}

# IAP forwards the requests it admitted as its service agent: the only invoker. The agent
# exists once IAP is on for the load balancer's backend service, which is also when its
# audience is known, so the grant waits for var.console_iap_audience.
resource "google_cloud_run_v2_service_iam_member" "iap_invokes_console" {
  count    = local.console && var.console_iap_audience != "" ? 1 : 0
  location = google_cloud_run_v2_service.console[0].location
  name     = google_cloud_run_v2_service.console[0].name
  role     = "roles/run.invoker"
  member   = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-iap.iam.gserviceaccount.com"
}
