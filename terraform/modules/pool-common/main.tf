module "bootstrap" {
  source                  = "../agent-bootstrap"
  region                  = var.region
  control_plane           = var.control_plane
  control_plane_tls       = var.control_plane_tls
  bootstrap_token_command = var.bootstrap_token_command
  meridian_package        = var.meridian_package
  sglang_package          = var.sglang_package
  port                    = var.gateway_port
}
