# The sweeper's clock: one tick a minute on sweep-ticks (the body is ignored).
resource "google_cloud_scheduler_job" "sweep" {
  name        = "${var.prefix}sweep"
  region      = var.region
  description = "mldiag sweeper: settle quiet sessions, re-queue stuck ones."
  schedule    = var.sweep_schedule
  time_zone   = "Etc/UTC"

  pubsub_target {
    topic_name = google_pubsub_topic.topic["sweep-ticks"].id
    data       = base64encode("{}")
  }

  retry_config {
    # A missed tick is replaced by the next one.
    retry_count = 0
  }

  depends_on = [google_project_service.apis]
}
