variable "name" {
  description = "The pool's name: prefixes every resource it makes."
  type        = string
  validation {
    condition     = can(regex("^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$", var.name))
    error_message = "name must be 1-32 lowercase letters, digits or '-', starting with a letter."
  }
}

variable "region" {
  description = "The Meridian region its nodes join (its name in the fleet document), not the GCP region."
  type        = string
}

variable "project" {
  description = "The GCP project."
  type        = string
}

variable "zone" {
  description = "The zone of the pool (GPUs are zonal): europe-west4-a, us-central1-b, ..."
  type        = string
  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]-[a-z]$", var.zone))
    error_message = "zone must be a GCP zone, e.g. europe-west4-a."
  }
}

variable "network" {
  description = "The VPC network's self link or name."
  type        = string
}

variable "subnetwork" {
  description = "The subnetwork's self link or name, in the zone's region."
  type        = string
}

variable "machine_type" {
  description = "A GPU machine type with its GPUs attached: a3-highgpu-8g, a2-highgpu-1g, g2-standard-24, ..."
  type        = string
  validation {
    condition     = can(regex("^(a3|a2|g2)-[a-z]+-[0-9]+g?$", var.machine_type))
    error_message = "machine_type must be an accelerator-optimized type (a3-*, a2-*, g2-*) whose GPUs come with it."
  }
}

variable "gpus_per_node" {
  # validated, as the other inputs every pool takes alike, by ../pool-common
  description = "GPUs in one machine of machine_type."
  type        = number
}

variable "node_count" {
  description = "Machines in the pool."
  type        = number
  default     = 1
}

variable "spot" {
  description = "Spot capacity instead of on-demand."
  type        = bool
  default     = false
}

variable "image" {
  description = "The boot image, e.g. a Deep Learning VM image with the NVIDIA driver."
  type        = string
}

variable "boot_disk_gb" {
  description = "The boot disk (persistent disk): the OS, packages, model cache and the agent's data directory."
  type        = number
  default     = 500
  validation {
    condition     = var.boot_disk_gb >= 50 && var.boot_disk_gb <= 65536
    error_message = "boot_disk_gb must be from 50 to 65536."
  }
}

variable "control_plane_tls" {
  description = "The control plane's gRPC port serves TLS with a publicly trusted certificate (controlplane-aws's does)."
  type        = bool
  default     = true
}

variable "control_plane" {
  description = "The control plane's gRPC target, as agent-bootstrap takes it."
  type        = string
}

variable "bootstrap_token_secret" {
  description = "The Secret Manager secret (projects/P/secrets/S) that holds the region's bootstrap token."
  type        = string
  validation {
    condition     = can(regex("^projects/[^/]+/secrets/[^/]+$", var.bootstrap_token_secret))
    error_message = "bootstrap_token_secret must be projects/PROJECT/secrets/NAME."
  }
}

variable "gateway_port" {
  description = "The agents' port: the region's OpenAI endpoint."
  type        = number
  default     = 8500
}

variable "client_cidrs" {
  description = "Who may reach the region's gateway."
  type        = list(string)
}

variable "meridian_package" {
  description = "What pip installs for Meridian."
  type        = string
  default     = "meridian"
}

variable "sglang_package" {
  description = "What pip installs for SGLang."
  type        = string
  default     = "sglang[all]"
}

variable "price_per_gpu_hour" {
  description = "What one of its GPUs costs an hour (one currency, fleet-wide). Set, the pool is the fleet's node pool (the `node_pool` output) that Meridian's capacity planner resizes; null, its size is the operator's."
  # validated, as the other inputs every pool takes alike, by ../pool-common
  type    = number
  default = null
}

variable "gpu_model" {
  description = "The GPU its machines carry, as their agents report it (NVML's name, e.g. \"NVIDIA H100 80GB HBM3\"); needed with price_per_gpu_hour."
  # validated, as the other inputs every pool takes alike, by ../pool-common
  type    = string
  default = null
}

variable "min_nodes" {
  description = "The fewest machines Meridian's capacity planner may leave (default: 0)."
  type        = number
  default     = null
}

variable "max_nodes" {
  description = "The most machines Meridian's capacity planner may ask for (default: node_count)."
  type        = number
  default     = null
}
