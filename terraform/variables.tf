variable "project" {
  description = "Project that holds everything: bucket, Firestore, Pub/Sub, functions, Vertex AI."
  type        = string
}

variable "region" {
  description = "Region of the functions, the profile bucket, Firestore and Vertex AI calls."
  type        = string
  default     = "us-central1"
}

variable "prefix" {
  description = "Prefix of every topic, subscription, function and service account name (MLDIAG_TOPIC_PREFIX)."
  type        = string
  default     = "mldiag-"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,11}$", var.prefix))
    error_message = "prefix: lower-case letters, digits and '-', at most 12 characters (service account ids are limited to 30)."
  }
}

variable "bucket_name" {
  description = "Profile bucket (MLDIAG_BUCKET): <run>/plugins/profile/<session>/<host>.xplane.pb and the reports. Default: <project>-mldiag-profiles."
  type        = string
  default     = null
}

variable "profile_nearline_after_days" {
  description = "Move profiles and reports to NEARLINE this many days after upload (0: never)."
  type        = number
  default     = 30
}

variable "profile_retention_days" {
  description = "Delete profiles and reports this many days after upload (0: keep forever)."
  type        = number
  default     = 365
}

variable "viewer_cache_retention_days" {
  description = "Delete the XProf viewer's caches (xprof-cache/) this many days after they were built (0: keep them). An expired cache is rebuilt when the session is next opened."
  type        = number
  default     = 14
  validation {
    condition     = var.viewer_cache_retention_days >= 0
    error_message = "viewer_cache_retention_days is a number of days, 0 to keep the caches."
  }
}

variable "superseded_retention_days" {
  description = "Delete superseded objects (a session's older analysis versions, and its collect windows once combined) this many days after a newer version is reported (0: keep them)."
  type        = number
  default     = 7
  validation {
    condition     = var.superseded_retention_days >= 0
    error_message = "superseded_retention_days is a number of days, 0 to keep them."
  }
}

variable "raw_profile_retention_days" {
  description = "Delete the raw profiles (*.xplane.pb, *.xplane.riegeli) this many days after upload, keeping the reports (0: until profile_retention_days). A session's viewer cannot be rebuilt without them."
  type        = number
  default     = 0
  validation {
    condition     = var.raw_profile_retention_days >= 0
    error_message = "raw_profile_retention_days is a number of days, 0 to keep the profiles."
  }
}

variable "noncurrent_version_retention_days" {
  description = "Delete overwritten or deleted object versions this many days after they became noncurrent."
  type        = number
  default     = 30
}

variable "kms_key_name" {
  description = "Optional Cloud KMS key (projects/P/locations/L/keyRings/R/cryptoKeys/K, in var.region) for the buckets and topics. null: Google-managed keys."
  type        = string
  default     = null
}

variable "firestore_database" {
  description = "Firestore database id (MLDIAG_FIRESTORE_DATABASE). A project's existing \"(default)\" database must be imported first."
  type        = string
  default     = "mldiag"
}

variable "firestore_location" {
  description = "Firestore location: a region (default: var.region) or a multi-region such as nam5."
  type        = string
  default     = null
}

variable "investigator" {
  description = "MLDIAG_INVESTIGATOR of the investigate function: \"gemini\" (Vertex AI) or \"rule-based\"."
  type        = string
  default     = "gemini"

  validation {
    condition     = contains(["gemini", "rule-based"], var.investigator)
    error_message = "investigator must be \"gemini\" or \"rule-based\"."
  }
}

variable "gemini_model" {
  description = "MLDIAG_GEMINI_MODEL: the Vertex AI Gemini model the investigator calls."
  type        = string
  default     = "gemini-2.5-flash"
}

variable "vertex_location" {
  description = "MLDIAG_LOCATION: Vertex AI location of the Gemini calls (default: var.region)."
  type        = string
  default     = null
}

variable "functions_dist_dir" {
  description = "Where scripts/package_functions wrote <name>.zip (default: ../dist/functions)."
  type        = string
  default     = null
}

variable "capture_vpc_connector" {
  description = "Optional Serverless VPC Access connector (projects/P/locations/R/connectors/C) through which on_capture_request reaches plain profiler servers (host:9999) for push captures, and sweep checks their liveness; workloads running the mldiag SDK pull their requests and need none."
  type        = string
  default     = null
}

variable "sweep_schedule" {
  description = "Cloud Scheduler cron of the sweeper tick on sweep-ticks."
  type        = string
  default     = "* * * * *"
}

variable "extra_environment" {
  description = "More MLDIAG_* variables for every function (e.g. MLDIAG_STUCK_AFTER_S)."
  type        = map(string)
  default     = {}
}

variable "storage_audit_logs" {
  description = "Turn on Data Access audit logs (DATA_READ, DATA_WRITE) for Cloud Storage in the project: who read or wrote which profile and report."
  type        = bool
  default     = true
}

variable "share_link_key_version" {
  description = "Bump to generate a new console key (share-link-key in Secret Manager, the console's MLDIAG_CONSOLE_SECRET). The old version is disabled, not destroyed; share links do not depend on it (they are random tokens stored hashed), only open forms' CSRF tokens do."
  type        = number
  default     = 1
}

variable "workload_service_accounts" {
  description = "Service accounts of the training workloads that use mldiag.sdk: they may invoke the register function (their runs, targets and uploads go through it) and publish on degradation-alerts. They get no role on Firestore or the bucket."
  type        = list(string)
  default     = []
}

variable "settle_seconds" {
  description = "Seconds without a new host before a session with no expected hosts (a dropped file) is analysed."
  type        = number
  default     = 30
}

variable "collect_job_image" {
  description = "Container image of the collect Cloud Run job (built from deploy/collect-job/Dockerfile)."
  type        = string
  default     = "us-docker.pkg.dev/cloudrun/container/job:latest"
}

variable "collect_job_memory" {
  description = "Memory of each collect job task (Cloud Run allows up to 32Gi, with 8 CPUs). Its files are in memory too: a 2 GiB host is 2 GiB downloaded, up to 2 GiB of time windows and, with Python-tracer events, a 2 GiB reduced copy, beside the workers' budget (collect_job_memory_budget). BENCHMARKS.md, \"The collect job's tasks\": at 2.0 GB each task's process tree peaked at 4.0-4.4 GiB. A fanned-out host's share in a task: 4.3 GiB of processes at 1.9 GB (its largest worker 2.4 GiB, a time window's build), beside its files. A viewer prebuild in the job uses up to collect_job_viewer_memory_budget (14Gi) of it."
  type        = string
  default     = "16Gi"
}

variable "collect_job_memory_budget" {
  description = "The collect job's workers' memory budget (MLDIAG_MEMORY_BUDGET). BENCHMARKS.md, \"Memory per worker\": a 1.9 GB TPU-shaped host completes in 148 s with the process tree at 4.2 GiB under an 8 GiB budget, its largest worker at 2.4 GiB."
  type        = string
  default     = "8Gi"
}

variable "collect_job_cpu" {
  description = "CPUs of the collect job: collection runs two worker processes, and xprof's op_stats build two threads in each."
  type        = string
  default     = "4"
}

variable "collect_job_viewer_memory_budget" {
  description = "The memory a viewer prebuild may use in the collect job (MLDIAG_VIEWER_MEMORY_BUDGET): the prebuild runs in the job's tasks, with no collection workers beside it. xprof's viewer conversions need about 17.5 bytes per byte of the largest host plus the hosts' files (BENCHMARKS.md, \"XProf viewer\"): with 14Gi, hosts up to about 800 MB are prebuilt whole. A larger host is viewed in time windows of 128 MB, each prebuilt within it, one host at a time per task, the tasks sharing the hosts (BENCHMARKS.md, \"XProf viewer\": one 1.9 GB host 240 s, the process at 2.6 GiB; three 1.9 GB hosts 648 s in one task, each task's process at most 2.8 GiB beside 3.8 GiB of files, one host and its windows while it is cut, whatever the number of hosts)."
  type        = string
  default     = "14Gi"
}

variable "collect_job_tasks" {
  description = "Tasks of the collect job, all started at once. A large host's time windows are shared by tasks 1..N-1, while task 0 runs the rest of the collection and combines them. BENCHMARKS.md, \"The collect job's tasks\": with 4, a 2.0 GB TPU-shaped host (15 windows, 5 per task) completes in 82 s against 141 s in one task, every task's process tree under 4.4 GiB. A fanned-out session over the function's limits has its hosts shared by the tasks the same way (each task collects the hosts it claims; task 0 combines): one 1.9 GB host's share takes 114 s with its process tree at 4.3 GiB (bench/collect_host.py). So has a viewer prebuild's windowed hosts (each task builds the hosts it claims; task 0 writes the manifest). Each task has collect_job_memory and collect_job_cpu."
  type        = number
  default     = 4

  validation {
    condition     = var.collect_job_tasks >= 1 && var.collect_job_tasks <= 16
    error_message = "collect_job_tasks must be between 1 and 16."
  }
}

variable "collect_job_timeout_seconds" {
  description = "Deadline of one collect job task. A viewer prebuild in the job gets nine tenths of it (MLDIAG_VIEWER_DEADLINE_S): about 160 s per GB of the hosts viewed whole and of the largest task's share of the windowed hosts (BENCHMARKS.md, \"XProf viewer\"), so 3600 s prebuilds about 19 GiB of xplanes per task, 75 GiB with 4 tasks (a session over it is skipped, with the reason in skipped.json)."
  type        = number
  default     = 3600
}

variable "collect_function_max_host_bytes" {
  description = "Sessions with a host larger than this go to the collect job instead of the collect function (8 GiB with its files in memory, 540 s). BENCHMARKS.md: a 468 MB TPU-shaped host takes 43 s with the process tree at 4.0 GiB, plus the host and its time windows in /tmp. A session that does not fit the function's memory budget goes there too."
  type        = number
  default     = 536870912
}

variable "collect_function_max_hosts" {
  description = "Sessions with more hosts than this go to the collect job (many-host sessions below it fan out to collect_host)."
  type        = number
  default     = 64
}

variable "console_image" {
  description = "Container image of the console Cloud Run service (built from deploy/console/Dockerfile). Empty: no console."
  type        = string
  default     = ""
}

variable "console_iap_audience" {
  description = "MLDIAG_IAP_AUDIENCE: the audience of the IAP JWTs the console accepts, /projects/PROJECT_NUMBER/global/backendServices/BACKEND_SERVICE_ID of the load balancer's backend service with IAP on. Empty until that backend service exists: the console then admits no IAP user."
  type        = string
  default     = ""

  validation {
    condition     = var.console_iap_audience == "" || can(regex("^/projects/[0-9]+/[^ ]+$", var.console_iap_audience))
    error_message = "console_iap_audience: /projects/PROJECT_NUMBER/global/backendServices/BACKEND_SERVICE_ID (the project number, not its id, as IAP signs it)."
  }
}

variable "console_max_instances" {
  description = "Most instances of the console service (each serves 40 requests at once, with 8 GiB and 2 CPUs)."
  type        = number
  default     = 10
}

variable "console_ingress" {
  description = "Ingress of the console service. The default admits the load balancer (with IAP) and internal traffic only."
  type        = string
  default     = "INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER"

  validation {
    condition     = contains(["INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER", "INGRESS_TRAFFIC_INTERNAL_ONLY", "INGRESS_TRAFFIC_ALL"], var.console_ingress)
    error_message = "console_ingress: INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER, INGRESS_TRAFFIC_INTERNAL_ONLY or INGRESS_TRAFFIC_ALL."
  }
}

variable "capture_allowed_networks" {
  description = "CIDRs the capture stage may connect to (the workloads' VPC subnets); every address a target name resolves to must be in one."
  type        = list(string)
  default     = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
}

variable "capture_allowed_ports" {
  description = "Ports the capture stage may connect to on push targets (plain profiler servers; SDK targets pull their requests), as a-b ranges separated by commas."
  type        = string
  default     = "1024-65535"
}

variable "registration_ingress" {
  description = "Ingress of the register function that workloads call. ALLOW_INTERNAL_ONLY (the default): workloads in the project's VPC reach it through Private Google Access, Direct VPC egress or a connector. ALLOW_ALL for workloads elsewhere (VMs with external IPs, another project): IAM (run.invoker) and the ID token check still admit only var.workload_service_accounts."
  type        = string
  default     = "ALLOW_INTERNAL_ONLY"

  validation {
    condition     = contains(["ALLOW_ALL", "ALLOW_INTERNAL_ONLY", "ALLOW_INTERNAL_AND_GCLB"], var.registration_ingress)
    error_message = "registration_ingress: ALLOW_ALL, ALLOW_INTERNAL_ONLY or ALLOW_INTERNAL_AND_GCLB."
  }
}

variable "deployer" {
  description = "The IAM member that runs terraform (user:EMAIL or serviceAccount:EMAIL). Set, it gets roles/iam.serviceAccountUser on each service account terraform creates and hands to a service, so it needs no project-wide serviceAccountUser. Empty: grant that yourself."
  type        = string
  default     = ""

  validation {
    condition     = var.deployer == "" || can(regex("^(user|serviceAccount|group):[^ ]+$", var.deployer))
    error_message = "deployer: user:EMAIL, serviceAccount:EMAIL or group:EMAIL."
  }
}

variable "gke_install" {
  description = "Install kube-discover and kube-webhook (deploy/gke/) into a GKE cluster: its pods labelled mldiag.dev/run=<gke_run> become push targets by themselves (docs/deploy-gke.md). Off by default."
  type        = bool
  default     = false
}

variable "gke_cluster" {
  description = "The GKE cluster to install into (with gke_install): its name and location."
  type = object({
    name     = string
    location = string
  })
  default = {
    name     = ""
    location = ""
  }
}

variable "gke_run" {
  description = "The run whose pods kube-discover registers (label mldiag.dev/run=<run>)."
  type        = string
  default     = ""
}

variable "gke_workload_namespace" {
  description = "The namespace of the workloads' pods: the only one kube-discover may read."
  type        = string
  default     = "default"
}

variable "gke_image" {
  description = "The mldiag image (with the kube extra) that runs kube-discover and kube-webhook, by digest."
  type        = string
  default     = ""
}
