variable "name" {
  description = "The pool's name: prefixes every resource it makes."
  type        = string
  validation {
    condition     = can(regex("^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$", var.name))
    error_message = "name must be 1-32 lowercase letters, digits or '-'."
  }
}

variable "region" {
  description = "The Meridian region its nodes join (its name in the fleet document), not the AWS region."
  type        = string
}

variable "vpc_id" {
  description = "The VPC of the pool."
  type        = string
}

variable "subnet_ids" {
  description = "Subnets (and so zones) the pool's machines and its load balancer go in."
  type        = list(string)
  validation {
    condition     = length(var.subnet_ids) > 0
    error_message = "give at least one subnet."
  }
}

variable "instance_type" {
  description = "A GPU instance type (p4d.24xlarge, p5.48xlarge, g5.12xlarge, g6e.xlarge, ...)."
  type        = string
  validation {
    condition     = can(regex("^(p3|p3dn|p4d|p4de|p5|p5e|p5en|g4dn|g5|g6|g6e|gr6)\\.[0-9a-z]+$", var.instance_type))
    error_message = "instance_type must be an NVIDIA GPU instance type (p3, p4d, p5, g4dn, g5, g6, g6e ...)."
  }
}

variable "gpus_per_node" {
  # validated, as the other inputs every pool takes alike, by ../pool-common
  description = "GPUs in one machine of instance_type (8 for p4d.24xlarge and p5.48xlarge)."
  type        = number
}

variable "node_count" {
  description = "Machines in the pool at first; Meridian's capacity planner sizes it from then on, within min_nodes and max_nodes."
  type        = number
  default     = 1
}

variable "min_nodes" {
  description = "The fewest machines the planner may leave (default: node_count)."
  type        = number
  default     = null
}

variable "max_nodes" {
  description = "The most machines the planner may ask for (default: node_count)."
  type        = number
  default     = null
}

variable "spot" {
  description = "Spot capacity instead of on-demand."
  type        = bool
  default     = false
}

variable "ami_id" {
  description = "The machine image: a GPU image (with the NVIDIA driver, or the bootstrap installs it) with python3."
  type        = string
  validation {
    condition     = can(regex("^ami-[0-9a-f]{8,17}$", var.ami_id))
    error_message = "ami_id must be an AMI id (ami-...)."
  }
}

variable "root_volume_gb" {
  description = "The root disk (EBS, persistent across reboots): the OS, the engines' packages and model cache, and the agent's data directory."
  type        = number
  default     = 500
  validation {
    condition     = var.root_volume_gb >= 50 && var.root_volume_gb <= 16384
    error_message = "root_volume_gb must be from 50 to 16384."
  }
}

variable "control_plane_tls" {
  description = "The control plane's gRPC port serves TLS with a publicly trusted certificate (controlplane-aws's does)."
  type        = bool
  default     = true
}

variable "control_plane" {
  description = "The control plane's gRPC target, as agent-bootstrap takes it (the control plane's load balancer, host:port)."
  type        = string
}

variable "bootstrap_token_secret_arn" {
  description = "The Secrets Manager secret that holds the region's bootstrap token; the machines may read it, and only it."
  type        = string
  validation {
    condition     = can(regex("^arn:aws[a-z-]*:secretsmanager:", var.bootstrap_token_secret_arn))
    error_message = "bootstrap_token_secret_arn must be a Secrets Manager secret's ARN."
  }
}

variable "gateway_port" {
  description = "The agents' port: the region's OpenAI endpoint."
  type        = number
  default     = 8500
}

variable "client_cidrs" {
  description = "Who may reach the region's gateway: clients, and peer regions that escalate to it."
  type        = list(string)
}

variable "meridian_package" {
  description = "What pip installs for Meridian on the machines."
  type        = string
  default     = "meridian"
}

variable "sglang_package" {
  description = "What pip installs for SGLang on the machines."
  type        = string
  default     = "sglang[all]"
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
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
