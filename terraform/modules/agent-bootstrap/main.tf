locals {
  settings = merge({ HOST = "0.0.0.0" }, var.control_plane_tls ? { TLS_CA_FILE = var.ca_bundle } : {}, var.agent_settings, {
    CONTROL_PLANE = var.control_plane
    REGION        = var.region
    PORT          = tostring(var.port)
    DATA_DIR      = "${var.root}${var.data_dir}"
  })
  script = templatefile("${path.module}/templates/bootstrap.sh.tftpl", {
    root                    = var.root
    settings                = local.settings
    bootstrap_token_command = var.bootstrap_token_command
    operator_token_command  = var.operator_token_command
    meridian_package        = var.meridian_package
    sglang_package          = var.sglang_package
    pip_args                = var.pip_args
    install_nvidia_driver   = var.install_nvidia_driver
    nvidia_driver_command   = var.nvidia_driver_command
  })
}
