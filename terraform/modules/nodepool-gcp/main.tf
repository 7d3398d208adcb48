# A pool of GPU machines in one GCP zone for one Meridian region: a managed instance group
# whose machines boot with the shared agent bootstrap, behind a regional TCP load balancer
# that is the region's gateway.

locals {
  gcp_region = join("-", slice(split("-", var.zone), 0, 2))
  tag        = "${var.name}-gateway"
}

module "common" {
  source                  = "../pool-common"
  region                  = var.region
  control_plane           = var.control_plane
  control_plane_tls       = var.control_plane_tls
  bootstrap_token_command = "gcloud secrets versions access latest --secret=${var.bootstrap_token_secret}"
  meridian_package        = var.meridian_package
  sglang_package          = var.sglang_package
  gateway_port            = var.gateway_port
  gpus_per_node           = var.gpus_per_node
  node_count              = var.node_count
  client_cidrs            = var.client_cidrs
  # Deep Learning VM images carry the driver; others get it from the bootstrap.
  pool_name          = var.name
  price_per_gpu_hour = var.price_per_gpu_hour
  gpu_model          = var.gpu_model
  spot               = var.spot
  min_nodes          = coalesce(var.min_nodes, 0)
  max_nodes          = var.max_nodes
  group              = "${var.project}/${var.zone}/${google_compute_instance_group_manager.nodes.name}"
  bootstrap_token_store = {
    kind   = "gcp-secret-manager"
    secret = var.bootstrap_token_secret
  }
}

resource "google_service_account" "nodes" {
  project      = var.project
  account_id   = "${var.name}-nodes"
  display_name = "Meridian ${var.region} GPU nodes"
}

resource "google_secret_manager_secret_iam_member" "token" {
  secret_id = var.bootstrap_token_secret
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.nodes.email}"
}

resource "google_compute_instance_template" "nodes" {
  project      = var.project
  name_prefix  = "${var.name}-"
  machine_type = var.machine_type
  tags         = [local.tag]

  disk {
    source_image = var.image
    disk_size_gb = var.boot_disk_gb
    disk_type    = "pd-ssd"
    boot         = true
    auto_delete  = true
  }

  network_interface {
    network    = var.network
    subnetwork = var.subnetwork
  }

  metadata = {
    startup-script = module.common.script
  }

  service_account {
    email  = google_service_account.nodes.email
    scopes = ["cloud-platform"]
  }

  scheduling {
    on_host_maintenance = "TERMINATE" # GPU machines cannot live-migrate
    automatic_restart   = !var.spot
    preemptible         = var.spot
    provisioning_model  = var.spot ? "SPOT" : "STANDARD"
  }

  lifecycle {
    create_before_destroy = true
  }
}

resource "google_compute_instance_group_manager" "nodes" {
  project            = var.project
  name               = "${var.name}-nodes"
  zone               = var.zone
  base_instance_name = var.name
  target_size        = var.node_count

  version {
    instance_template = google_compute_instance_template.nodes.id
  }

  named_port {
    name = "gateway"
    port = var.gateway_port
  }

  lifecycle {
    # Meridian's capacity planner resizes the group (its GCP provider); a later plan must
    # not set it back
    ignore_changes = [target_size]
  }
}

resource "google_compute_firewall" "gateway" {
  project       = var.project
  name          = "${var.name}-gateway"
  network       = var.network
  direction     = "INGRESS"
  source_ranges = var.client_cidrs
  target_tags   = [local.tag]

  allow {
    protocol = "tcp"
    ports    = [tostring(var.gateway_port)]
  }
}

resource "google_compute_region_health_check" "gateway" {
  project = var.project
  name    = "${var.name}-gateway"
  region  = local.gcp_region

  http_health_check {
    port         = var.gateway_port
    request_path = "/healthz"
  }
}

resource "google_compute_region_backend_service" "gateway" {
  project               = var.project
  name                  = "${var.name}-gateway"
  region                = local.gcp_region
  protocol              = "TCP"
  load_balancing_scheme = "EXTERNAL"
  health_checks         = [google_compute_region_health_check.gateway.id]

  backend {
    group = google_compute_instance_group_manager.nodes.instance_group
  }
}

resource "google_compute_forwarding_rule" "gateway" {
  project               = var.project
  name                  = "${var.name}-gateway"
  region                = local.gcp_region
  load_balancing_scheme = "EXTERNAL"
  ip_protocol           = "TCP"
  ports                 = [tostring(var.gateway_port)]
  backend_service       = google_compute_region_backend_service.gateway.id
}
