variable "name" {
  description = "The pool's name: prefixes every resource it makes."
  type        = string
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,30}[a-z0-9]$", var.name))
    error_message = "name must be 2-32 lowercase letters, digits or '-', starting with a letter."
  }
}

variable "region" {
  description = "The Meridian region its nodes join (its name in the fleet document), not the Azure location."
  type        = string
}

variable "resource_group_name" {
  description = "The resource group the pool goes in."
  type        = string
}

variable "location" {
  description = "The Azure location: westeurope, eastus, ..."
  type        = string
  validation {
    condition     = can(regex("^[a-z]+[a-z0-9]*$", var.location))
    error_message = "location must be an Azure location name, e.g. westeurope."
  }
}

variable "zones" {
  description = "Availability zones of the scale set; empty for none."
  type        = list(string)
  default     = []
  validation {
    condition     = alltrue([for z in var.zones : contains(["1", "2", "3"], z)])
    error_message = "zones are \"1\", \"2\" or \"3\"."
  }
}

variable "subnet_id" {
  description = "The subnet of the machines and the load balancer's backend."
  type        = string
}

variable "vm_size" {
  description = "A GPU VM size: Standard_ND96asr_v4, Standard_ND96isr_H100_v5, Standard_NC24ads_A100_v4, ..."
  type        = string
  validation {
    condition     = can(regex("^Standard_N[CDV][0-9A-Za-z_]+$", var.vm_size))
    error_message = "vm_size must be an N-series GPU size (Standard_NC*, Standard_ND*, Standard_NV*)."
  }
}

variable "gpus_per_node" {
  # validated, as the other inputs every pool takes alike, by ../pool-common
  description = "GPUs in one machine of vm_size."
  type        = number
}

variable "node_count" {
  description = "Machines in the pool."
  type        = number
  default     = 1
}

variable "spot" {
  description = "Spot capacity instead of regular."
  type        = bool
  default     = false
}

variable "image" {
  description = "The marketplace image (publisher, offer, sku, version), e.g. an HPC image with the NVIDIA driver."
  type = object({
    publisher = string
    offer     = string
    sku       = string
    version   = string
  })
}

variable "admin_ssh_key" {
  description = "The public SSH key of the machines' admin user."
  type        = string
}

variable "os_disk_gb" {
  description = "The OS disk (managed, persistent): the OS, packages, model cache and the agent's data directory."
  type        = number
  default     = 512
  validation {
    condition     = var.os_disk_gb >= 64 && var.os_disk_gb <= 4095
    error_message = "os_disk_gb must be from 64 to 4095."
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

variable "key_vault_name" {
  description = "The Key Vault that holds the region's bootstrap token."
  type        = string
}

variable "key_vault_id" {
  description = "That Key Vault's resource id, to grant the machines' identity read access to its secrets."
  type        = string
}

variable "bootstrap_token_secret_name" {
  description = "The Key Vault secret's name."
  type        = string
  validation {
    condition     = can(regex("^[0-9A-Za-z-]{1,127}$", var.bootstrap_token_secret_name))
    error_message = "bootstrap_token_secret_name must be a Key Vault secret name."
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
