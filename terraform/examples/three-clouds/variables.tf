variable "name" {
  description = "Prefixes what this makes in each cloud."
  type        = string
  default     = "meridian"
}

# --- the control plane, and the us-east pool, on AWS ------------------------------------------

variable "aws_region" {
  description = "The AWS region of the control plane and of the us-east pool."
  type        = string
  default     = "us-east-1"
}

variable "domain_name" {
  description = "The control plane's name (cp.example.com): tls_certificate_arn is for it."
  type        = string
}

variable "route53_zone_id" {
  description = "A Route 53 zone to put domain_name in; null: point it at the load balancer yourself."
  type        = string
  default     = null
}

variable "tls_certificate_arn" {
  description = "An ACM certificate for domain_name, in aws_region."
  type        = string
}

variable "operator_cidrs" {
  description = "Who may reach the admin API and the status page."
  type        = list(string)
}

variable "agent_cidrs" {
  description = "Who may reach the agents' gRPC port: the pools' outbound addresses in all three clouds. Agents authenticate with their credential over TLS; narrow this where the pools leave through fixed addresses."
  type        = list(string)
  default     = ["0.0.0.0/0"]
}

variable "client_cidrs" {
  description = "Who may reach the regions' gateways: your clients, and the other regions' pools (escalation)."
  type        = list(string)
  default     = ["0.0.0.0/0"]
}

variable "debian_ami_id" {
  description = "A Debian 12 AMI in aws_region, for the control plane's replicas and etcd."
  type        = string
}

variable "aws_gpu_ami_id" {
  description = "A GPU AMI in aws_region (an AWS Deep Learning AMI carries the driver and python3)."
  type        = string
}

# --- the eu-west pool, on GCP -----------------------------------------------------------------

variable "gcp_project" {
  description = "The GCP project of the eu-west pool."
  type        = string
}

variable "gcp_zone" {
  description = "The zone of the eu-west pool (one with the machine type's GPUs)."
  type        = string
  default     = "europe-west4-a"
}

# --- the us-west pool, on Azure ---------------------------------------------------------------

variable "azure_subscription_id" {
  description = "The Azure subscription of the us-west pool."
  type        = string
}

variable "azure_location" {
  description = "The Azure location of the us-west pool."
  type        = string
  default     = "westus3"
}

variable "azure_key_vault_name" {
  description = "The Key Vault for the us-west pool's bootstrap token: 3-24 characters, unique in all of Azure."
  type        = string
}

variable "azure_admin_ssh_key" {
  description = "The SSH public key of the scale set's admin user."
  type        = string
}

# --- what the machines install ----------------------------------------------------------------

variable "meridian_package" {
  description = "What pip installs for Meridian, everywhere (meridian==0.1.0)."
  type        = string
  default     = "meridian"
}

variable "sglang_package" {
  description = "What pip installs for SGLang on the GPU machines."
  type        = string
  default     = "sglang[all]"
}
