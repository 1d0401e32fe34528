# Topics, dead-letter topics and the subscriptions that deliver them to the functions.
#
# Why push subscriptions and not Eventarc Pub/Sub triggers: a function's Eventarc Pub/Sub
# trigger creates and owns its subscription, and that subscription takes no dead-letter policy
# (hashicorp/terraform-provider-google#9748): a message that keeps failing would be retried
# until its retention runs out and then dropped without a trace. So each topic gets a push
# subscription managed here, the "direct Pub/Sub trigger" of the Cloud Run docs, with
#   - a dead-letter policy: after 100 delivery attempts (about 16 h of backoff) the message
#     goes to `<topic>-dead-letter`, whose own subscription pushes it to the dead_letters
#     function (the session is marked FAILED with the reason). Attempts that Cloud Run
#     refuses while it scales (429, throttling at max instances) count as delivery attempts
#     without running the function, so this is sized for a burst, not for the function's
#     own failures: those are counted in Firestore by event id, and after
#     MLDIAG_MAX_ATTEMPTS (max_function_attempts) of them the function records the dead
#     letter and fails the session itself (mldiag.entrypoints.dead_letters);
#   - an exponential retry backoff (10 s doubling to 600 s) instead of immediate redelivery;
#   - an OIDC token of the trigger service account, the only identity allowed to invoke the
#     functions (functions.tf).
# functions-framework turns the raw push body into the same `messagePublished` CloudEvent an
# Eventarc trigger would deliver (event_conversion.marshal_background_event_data), and the push
# endpoint's path `/projects/<p>/topics/<topic>` becomes the event source, so
# mldiag.entrypoints.pubsub_topic() still names the topic. tests/deploy/test_terraform.py
# checks that conversion.
# The bucket's finalize events still come through Eventarc (functions.tf): Cloud Storage has
# no other way to deliver CloudEvents; a poison event there is acknowledged and recorded as a
# dead letter by the function itself (mldiag.entrypoints.dead_letters).

locals {
  # Long enough for the slowest function (540 s): a push delivery is acknowledged by the
  # function's HTTP response within the ack deadline, or redelivered.
  ack_deadline_seconds = 600
  # Pub/Sub's maximum: throttled pushes are retried, not dead-lettered (see above).
  max_delivery_attempts = 100
  # The function's own failures before it gives up on a message (MLDIAG_MAX_ATTEMPTS).
  max_function_attempts = 5
}

resource "google_pubsub_topic" "topic" {
  for_each     = local.topics
  name         = "${var.prefix}${each.key}"
  kms_key_name = var.kms_key_name

  message_retention_duration = "86400s"

  depends_on = [google_project_service.apis, google_kms_crypto_key_iam_member.agents]
  #checkov:skip=CKV_GCP_83:Encrypted with var.kms_key_name when given; Google-managed encryption by default, as for the bucket.
}

resource "google_pubsub_topic" "dead_letter" {
  for_each     = local.topics
  name         = "${var.prefix}${each.key}-dead-letter"
  kms_key_name = var.kms_key_name

  depends_on = [google_project_service.apis, google_kms_crypto_key_iam_member.agents]
  #checkov:skip=CKV_GCP_83:Encrypted with var.kms_key_name when given; Google-managed encryption by default, as for the bucket.
}

resource "google_pubsub_subscription" "push" {
  for_each = local.topics
  name     = "${var.prefix}${each.key}-to-${replace(each.value, "_", "-")}"
  topic    = google_pubsub_topic.topic[each.key].id

  ack_deadline_seconds       = local.ack_deadline_seconds
  message_retention_duration = "604800s"

  expiration_policy {
    ttl = ""
  }

  retry_policy {
    minimum_backoff = "10s"
    maximum_backoff = "600s"
  }

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.dead_letter[each.key].id
    max_delivery_attempts = local.max_delivery_attempts
  }

  push_config {
    push_endpoint = "${google_cloudfunctions2_function.pubsub[each.value].service_config[0].uri}/projects/${var.project}/topics/${google_pubsub_topic.topic[each.key].name}"

    oidc_token {
      service_account_email = google_service_account.trigger.email
      audience              = google_cloudfunctions2_function.pubsub[each.value].service_config[0].uri
    }
  }

  depends_on = [google_cloud_run_v2_service_iam_member.trigger_invokes]
}

# Dead letters: every dead-letter topic is pushed to the dead_letters function. No dead-letter
# policy of their own (it would have nowhere to go); a failing dead_letters retries with backoff
# for the 7 days of retention.
resource "google_pubsub_subscription" "dead_letter" {
  for_each = local.topics
  name     = "${var.prefix}${each.key}-dead-letter-to-dead-letters"
  topic    = google_pubsub_topic.dead_letter[each.key].id

  ack_deadline_seconds       = 60
  message_retention_duration = "604800s"

  expiration_policy {
    ttl = ""
  }

  retry_policy {
    minimum_backoff = "10s"
    maximum_backoff = "600s"
  }

  push_config {
    push_endpoint = "${google_cloudfunctions2_function.pubsub["dead_letters"].service_config[0].uri}/projects/${var.project}/topics/${google_pubsub_topic.dead_letter[each.key].name}"

    oidc_token {
      service_account_email = google_service_account.trigger.email
      audience              = google_cloudfunctions2_function.pubsub["dead_letters"].service_config[0].uri
    }
  }

  depends_on = [google_cloud_run_v2_service_iam_member.trigger_invokes]
}

# The Pub/Sub service agent forwards to the dead-letter topics: it must publish there and
# acknowledge on the source subscriptions.
resource "google_pubsub_topic_iam_member" "agent_publishes_dead_letters" {
  for_each = local.topics
  topic    = google_pubsub_topic.dead_letter[each.key].id
  role     = "roles/pubsub.publisher"
  member   = local.pubsub_agent
}

resource "google_pubsub_subscription_iam_member" "agent_forwards_dead_letters" {
  for_each     = local.topics
  subscription = google_pubsub_subscription.push[each.key].id
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_agent
}

# The Pub/Sub service agent mints the OIDC tokens of the push subscriptions.
resource "google_service_account_iam_member" "agent_signs_push_tokens" {
  service_account_id = google_service_account.trigger.name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = local.pubsub_agent
}

# Cloud Monitoring alert policies can notify mldiag through a Pub/Sub notification channel on
# degradation-alerts (on_degradation_alert parses incident notifications); the channel
# publishes as the project's Monitoring notification service agent.
resource "google_pubsub_topic_iam_member" "monitoring_notifications" {
  topic  = google_pubsub_topic.topic["degradation-alerts"].id
  role   = "roles/pubsub.publisher"
  member = local.monitoring_agent
}
