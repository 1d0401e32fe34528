# The collect job (DESIGN.md "Scale"): a session over the collect function's limits, in bytes
# per host (var.collect_function_max_host_bytes) or hosts per session, is handed by the collect
# stage to this Cloud Run job, which runs the same stage code (`python -m mldiag.job`) with
# 16 GiB and an hour per task. A large host's time windows are shared by the job's tasks
# (var.collect_job_tasks, CLOUD_RUN_TASK_INDEX/COUNT): tasks 1..N-1 each convert their share
# and publish it under the session's analysis/v<n>/windows/, task 0 runs the collection and
# combines them (analysis/collection/hosts/window_tasks.py). Windows are claimed in the state store:
# a task that dies stops renewing its claims, and task 0 takes its windows over once they
# lapse; a task that exits non-zero is retried (max_retries), and published windows are
# reused. State transitions, claims and the messages it publishes are the pipeline's own; a
# session whose job never finishes is re-queued by the sweeper after its deadline, which starts
# the job again.
#
# The image: `gcloud builds submit --tag ${var.region}-docker.pkg.dev/PROJECT/REPO/collect-job
# -f deploy/collect-job/Dockerfile .` (docs/deploy-gcp.md).

resource "google_service_account" "collect_job" {
  account_id   = "${var.prefix}job-collect"
  display_name = "mldiag collect job"
  description  = "Runtime identity of the collect Cloud Run job (sessions too large for the collect function)."

  depends_on = [google_project_service.apis]
}

resource "google_cloud_run_v2_job" "collect" {
  name                = "${var.prefix}collect"
  location            = var.region
  deletion_protection = false

  template {
    # Every task starts at once: the windows are shared by whoever is running.
    task_count  = var.collect_job_tasks
    parallelism = var.collect_job_tasks
    template {
      service_account = google_service_account.collect_job.email
      timeout         = "${var.collect_job_timeout_seconds}s"
      max_retries     = 2
      containers {
        image   = var.collect_job_image
        command = ["python", "-m", "mldiag.job"]
        resources {
          limits = {
            memory = var.collect_job_memory
            cpu    = var.collect_job_cpu
          }
        }
        dynamic "env" {
          for_each = merge(local.environment, {
            MLDIAG_IN_JOB = "1"
            # Cloud Run sets CLOUD_RUN_TASK_COUNT too; this says it where settings are read.
            MLDIAG_COLLECT_JOB_TASKS = tostring(var.collect_job_tasks)
            # A viewer prebuild handed over by prebuild_viewer: task 0 runs it, the others
            # build their shares of its windowed hosts (viewer_prebuild.build_share).
            MLDIAG_VIEWER_MEMORY_BUDGET = var.collect_job_viewer_memory_budget
            # Its deadline, with a tenth of the task's left for the rest: a prebuild estimated
            # over it is skipped with the reason rather than killed at the task's deadline.
            MLDIAG_VIEWER_DEADLINE_S = tostring(floor(var.collect_job_timeout_seconds * 0.9))
            # The workers' budget; the rest of the job's memory holds its files (variables.tf).
            MLDIAG_MEMORY_BUDGET = var.collect_job_memory_budget
          })
          content {
            name  = env.key
            value = env.value
          }
        }
      }
    }
  }

  # The deployer's actAs on the job's identity (var.deployer) must have propagated.
  depends_on = [google_project_service.apis, time_sleep.iam_propagation]
}

# The job reads and writes the session's state and artifacts, and publishes what collect does.
resource "google_project_iam_member" "collect_job_firestore" {
  project = var.project
  role    = "roles/datastore.user"
  member  = google_service_account.collect_job.member

  condition {
    title      = "mldiag-database"
    expression = "resource.name == \"projects/${var.project}/databases/${google_firestore_database.main.name}\" || resource.name.startsWith(\"projects/${var.project}/databases/${google_firestore_database.main.name}/\")"
  }
}

# It reads the profiles and writes, like collect, only under <session>/analysis/.
resource "google_storage_bucket_iam_member" "collect_job_storage" {
  bucket = google_storage_bucket.profiles.name
  role   = "roles/storage.objectViewer"
  member = google_service_account.collect_job.member
}

resource "google_storage_bucket_iam_member" "collect_job_analysis" {
  bucket = google_storage_bucket.profiles.name
  role   = "roles/storage.objectUser"
  member = google_service_account.collect_job.member

  condition {
    title       = local.analysis_condition.title
    description = local.analysis_condition.description
    expression  = local.analysis_condition.expression
  }
}

resource "google_pubsub_topic_iam_member" "collect_job_publishes" {
  for_each = toset(["investigation-requests", "report-requests", "host-analysis-requests"])
  topic    = google_pubsub_topic.topic[each.key].id
  role     = "roles/pubsub.publisher"
  member   = google_service_account.collect_job.member
}

# prebuild_viewer starts it too, for a session whose viewer conversions need more memory
# than the function has (stages.prebuild_viewer).
resource "google_cloud_run_v2_job_iam_member" "viewer_runs_job" {
  name     = google_cloud_run_v2_job.collect.name
  location = google_cloud_run_v2_job.collect.location
  role     = "roles/run.developer"
  member   = google_service_account.function["prebuild_viewer"].member
}

# The collect function starts the job (with its message as an env override).
resource "google_cloud_run_v2_job_iam_member" "collect_runs_job" {
  name     = google_cloud_run_v2_job.collect.name
  location = google_cloud_run_v2_job.collect.location
  role     = "roles/run.developer"
  member   = google_service_account.function["collect"].member
}
