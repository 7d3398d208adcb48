variable "region" {
  description = "The Meridian region the pool's nodes join (its name in the fleet document), not the cloud's region."
  type        = string
  validation {
    condition     = can(regex("^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$", var.region))
    error_message = "region must be 1-63 letters, digits, '.', '_' or '-'."
  }
}

variable "gpus_per_node" {
  description = "GPUs in one machine of the pool."
  type        = number
  validation {
    condition     = var.gpus_per_node >= 1 && var.gpus_per_node <= 16 && floor(var.gpus_per_node) == var.gpus_per_node
    error_message = "gpus_per_node must be a whole number from 1 to 16."
  }
}

variable "node_count" {
  description = "Machines in the pool."
  type        = number
  validation {
    condition     = var.node_count >= 0 && var.node_count <= 1000 && floor(var.node_count) == var.node_count
    error_message = "node_count must be a whole number from 0 to 1000."
  }
}

variable "gateway_port" {
  description = "The agents' port: the region's OpenAI endpoint."
  type        = number
  validation {
    condition     = var.gateway_port >= 1024 && var.gateway_port <= 65535 && floor(var.gateway_port) == var.gateway_port
    error_message = "gateway_port must be a whole number from 1024 to 65535."
  }
}

variable "client_cidrs" {
  description = "Who may reach the region's gateway: clients, and peer regions that escalate to it."
  type        = list(string)
  validation {
    condition     = length(var.client_cidrs) > 0 && alltrue([for c in var.client_cidrs : can(cidrhost(c, 0))])
    error_message = "client_cidrs must be one CIDR block or more."
  }
}

variable "control_plane" {
  description = "The control plane's gRPC target."
  type        = string
}

variable "control_plane_tls" {
  description = "The control plane's gRPC port serves TLS with a publicly trusted certificate."
  type        = bool
}

variable "bootstrap_token_command" {
  description = "How a machine reads the region's bootstrap token from its cloud's secret store."
  type        = string
}

variable "meridian_package" {
  description = "What pip installs for Meridian."
  type        = string
}

variable "sglang_package" {
  description = "What pip installs for SGLang."
  type        = string
}

variable "pool_name" {
  description = "The pool's name: its node pool's name in the fleet (needed with price_per_gpu_hour)."
  type        = string
  default     = null
}

variable "price_per_gpu_hour" {
  description = "What one of its GPUs costs an hour. Set, the pool is the fleet's node pool (`node_pool`) that Meridian's capacity planner resizes; null, its size is the operator's."
  type        = number
  default     = null
  validation {
    condition     = var.price_per_gpu_hour == null || try(var.price_per_gpu_hour >= 0, false)
    error_message = "price_per_gpu_hour is 0 or more."
  }
}

variable "gpu_model" {
  description = "The GPU its machines carry, as their agents report it (NVML's name); needed with price_per_gpu_hour."
  type        = string
  default     = null
  validation {
    condition     = var.gpu_model == null || try(length(var.gpu_model) >= 1 && length(var.gpu_model) <= 64, false)
    error_message = "gpu_model is 1 to 64 characters."
  }
}

variable "spot" {
  description = "Whether its machines are spot."
  type        = bool
  default     = false
}

variable "min_nodes" {
  description = "The fewest machines the planner may leave."
  type        = number
  default     = 0
}

variable "max_nodes" {
  description = "The most machines the planner may ask for."
  type        = number
  default     = null
}

variable "group" {
  description = "The cloud's group of its machines, as a node pool's `group` names it."
  type        = string
  default     = null
}

variable "bootstrap_token_store" {
  description = "Where `meridian join` puts the pool's bootstrap token."
  type = object({
    kind   = string
    secret = string
    region = optional(string)
    vault  = optional(string)
  })
  default = null
}
