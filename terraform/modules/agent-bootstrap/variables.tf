variable "region" {
  description = "The Meridian region the node's agent joins (its name in the fleet document)."
  type        = string
  validation {
    condition     = can(regex("^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$", var.region))
    error_message = "region must be 1-63 letters, digits, '.', '_' or '-', starting and ending alphanumeric."
  }
}

variable "control_plane" {
  description = "The control plane's gRPC target: host:port of its load balancer, or ipv4:a:port,b:port of the replicas."
  type        = string
  validation {
    condition     = can(regex("^(ipv4:|dns:///)?[A-Za-z0-9.-]+:[0-9]{1,5}(,[A-Za-z0-9.-]+:[0-9]{1,5})*$", var.control_plane))
    error_message = "control_plane must be host:port, dns:///host:port, or ipv4:ip:port[,ip:port...]."
  }
}

variable "control_plane_tls" {
  description = "The control plane serves gRPC over TLS with a publicly trusted certificate (its load balancer's): verified against the system's CA bundle."
  type        = bool
  default     = false
}

variable "ca_bundle" {
  description = "The system's CA bundle, for control_plane_tls."
  type        = string
  default     = "/etc/ssl/certs/ca-certificates.crt"
}

variable "bootstrap_token_command" {
  description = "A shell command that prints the region's bootstrap token, read from the cloud's secret store (so that the token is never in user data nor on disk). The agent runs it each time it has to register, until it has an identity; a machine booted before the token is there waits for it."
  type        = string
  validation {
    condition     = length(trimspace(var.bootstrap_token_command)) > 0
    error_message = "bootstrap_token_command must print the bootstrap token; the token itself never goes in user data."
  }
}

variable "operator_token_command" {
  description = "A shell command that prints the agent's operator token (for /agent/status and /metrics); empty: none."
  type        = string
  default     = ""
}

variable "meridian_package" {
  description = "What pip installs for Meridian: a requirement (meridian==0.1.0) or a wheel's URL or path."
  type        = string
  default     = "meridian"
  validation {
    condition     = length(trimspace(var.meridian_package)) > 0
    error_message = "meridian_package must name what pip installs."
  }
}

variable "sglang_package" {
  description = "What pip installs for SGLang (\"sglang[all]==0.4.6\"); empty for a pool whose engines are simulated or external."
  type        = string
  default     = "sglang[all]"
}

variable "pip_args" {
  description = "More pip arguments, for a mirror or a wheelhouse (--index-url ..., --find-links ...)."
  type        = string
  default     = ""
}

variable "install_nvidia_driver" {
  description = "Install the NVIDIA driver when the image has none (nvidia-smi missing)."
  type        = bool
  default     = true
}

variable "nvidia_driver_command" {
  description = "How the NVIDIA driver is installed on the image's distribution."
  type        = string
  default     = "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y nvidia-driver-550-server"
}

variable "data_dir" {
  description = "The agent's data directory (identity, last snapshot, engine logs): on persistent disk."
  type        = string
  default     = "/var/lib/meridian-agent"
  validation {
    condition     = startswith(var.data_dir, "/")
    error_message = "data_dir must be an absolute path."
  }
}

variable "port" {
  description = "The agent's port: its region's OpenAI endpoint, /agent/status and /metrics."
  type        = number
  default     = 8500
  validation {
    condition     = var.port >= 1 && var.port <= 65535 && floor(var.port) == var.port
    error_message = "port must be a whole number from 1 to 65535."
  }
}

variable "agent_settings" {
  description = "More MERIDIAN_AGENT_* settings for the agent, by name without the prefix (HEARTBEAT_S = \"5\")."
  type        = map(string)
  default     = {}
  validation {
    condition     = alltrue([for k in keys(var.agent_settings) : can(regex("^[A-Z][A-Z0-9_]*$", k))])
    error_message = "agent_settings keys are setting names in capitals, without MERIDIAN_AGENT_ (e.g. HEARTBEAT_S)."
  }
}

variable "root" {
  description = "A prefix for every path the script writes. Empty on a machine; a scratch directory in tests."
  type        = string
  default     = ""
}
