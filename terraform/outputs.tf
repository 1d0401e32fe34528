output "bucket" {
  description = "The profile bucket: upload <run>/plugins/profile/<session>/<host>.xplane.pb; reports land in .../<session>/analysis/."
  value       = google_storage_bucket.profiles.name
}

output "sources_bucket" {
  description = "Bucket of the function source zips."
  value       = google_storage_bucket.sources.name
}

output "topics" {
  description = "Message topic ids by mldiag topic name (publish capture requests to capture-requests)."
  value       = { for name, t in google_pubsub_topic.topic : name => t.id }
}

output "dead_letter_topics" {
  description = "Dead-letter topic ids by mldiag topic name."
  value       = { for name, t in google_pubsub_topic.dead_letter : name => t.id }
}

output "function_uris" {
  description = "Cloud Run URIs of the functions (internal ingress only, but register: see var.registration_ingress)."
  value = merge(
    { for name, f in google_cloudfunctions2_function.pubsub : name => f.service_config[0].uri },
    { on_profile_object = google_cloudfunctions2_function.on_profile_object.service_config[0].uri },
    { register = google_cloudfunctions2_function.register.service_config[0].uri },
  )
}

output "service_accounts" {
  description = "Runtime service account of each function, and the trigger and build identities."
  value = merge(
    { for name, sa in google_service_account.function : name => sa.email },
    { trigger = google_service_account.trigger.email, build = google_service_account.build.email },
    { for sa in google_service_account.console : "console" => sa.email },
  )
}

output "firestore_database" {
  description = "Firestore database id (MLDIAG_FIRESTORE_DATABASE)."
  value       = google_firestore_database.main.name
}

output "share_link_secret" {
  description = "Secret Manager secret holding the console's key (MLDIAG_CONSOLE_SECRET)."
  value       = google_secret_manager_secret.share_link_key.id
}

output "environment" {
  description = "The MLDIAG_* settings of the deployment: export them to point the mldiag CLI at it."
  value       = local.environment
}

output "console_url" {
  description = "Cloud Run URL of the console (null without var.console_image). Its ingress admits the load balancer and internal traffic only: users come in through the load balancer with IAP."
  value       = one(google_cloud_run_v2_service.console[*].uri)
}

output "registration_url" {
  description = "URL of the register function that workloads call (MLDIAG_REGISTRATION_URL, also the audience of their ID tokens)."
  value       = local.registration_url
}

output "workload_environment" {
  description = "The MLDIAG_* settings of a training workload using mldiag.sdk: its runs, targets and uploads go through the register function."
  value = {
    MLDIAG_BACKEND          = "gcp"
    MLDIAG_PROJECT          = var.project
    MLDIAG_BUCKET           = google_storage_bucket.profiles.name
    MLDIAG_TOPIC_PREFIX     = var.prefix
    MLDIAG_REGISTRATION_URL = local.registration_url
  }
}
