variable "name" {
  description = "The control plane's name: prefixes every resource it makes."
  type        = string
  default     = "meridian"
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,22}[a-z0-9]$", var.name))
    error_message = "name must be 2-24 lowercase letters, digits or '-', starting with a letter."
  }
}

variable "vpc_id" {
  description = "The VPC."
  type        = string
}

variable "private_subnet_ids" {
  description = "Three or more private subnets, in different zones: the database, etcd and the replicas."
  type        = list(string)
  validation {
    condition     = length(var.private_subnet_ids) >= 3
    error_message = "give three private subnets or more, one per zone: etcd keeps a member in each."
  }
}

variable "public_subnet_ids" {
  description = "Public subnets for the load balancer that agents and operators reach."
  type        = list(string)
  validation {
    condition     = length(var.public_subnet_ids) >= 1
    error_message = "give at least one public subnet."
  }
}

variable "ami_id" {
  description = "The image of etcd members and replicas: Debian 12 or Ubuntu 22.04+, with python3."
  type        = string
  validation {
    condition     = can(regex("^ami-[0-9a-f]{8,17}$", var.ami_id))
    error_message = "ami_id must be an AMI id (ami-...)."
  }
}

variable "replicas" {
  description = "Control-plane replicas behind the load balancer."
  type        = number
  default     = 2
  validation {
    condition     = var.replicas >= 2 && var.replicas <= 16 && floor(var.replicas) == var.replicas
    error_message = "replicas must be 2 or more (up to 16): one is not highly available."
  }
}

variable "replica_instance_type" {
  description = "The replicas' instance type."
  type        = string
  default     = "m7i.large"
}

variable "etcd_instance_type" {
  description = "The etcd members' instance type."
  type        = string
  default     = "t3.medium"
}

variable "db_instance_class" {
  description = "The RDS PostgreSQL instance class."
  type        = string
  default     = "db.m7g.large"
  validation {
    condition     = startswith(var.db_instance_class, "db.")
    error_message = "db_instance_class must be an RDS class (db.*)."
  }
}

variable "db_storage_gb" {
  description = "The database's storage."
  type        = number
  default     = 100
  validation {
    condition     = var.db_storage_gb >= 20 && var.db_storage_gb <= 65536
    error_message = "db_storage_gb must be from 20 to 65536."
  }
}

variable "db_multi_az" {
  description = "A standby in another zone, failed over to by RDS."
  type        = bool
  default     = true
}

variable "tls_certificate_arn" {
  description = "The ACM certificate the load balancer serves the REST API and the agents' gRPC with."
  type        = string
  validation {
    condition     = can(regex("^arn:aws[a-z-]*:acm:", var.tls_certificate_arn))
    error_message = "tls_certificate_arn must be an ACM certificate's ARN."
  }
}

variable "domain_name" {
  description = "The control plane's name, the one tls_certificate_arn is for: operators and agents reach it by this name, since the load balancer's own name does not match the certificate."
  type        = string
  validation {
    condition     = can(regex("^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\\.)+[a-z]{2,63}$", var.domain_name))
    error_message = "domain_name must be a DNS name in lowercase (cp.example.com)."
  }
}

variable "route53_zone_id" {
  description = "A Route 53 hosted zone to put domain_name in, as an alias of the load balancer; null: point it there yourself (output load_balancer_dns_name)."
  type        = string
  default     = null
}

variable "operator_cidrs" {
  description = "Who may reach the admin REST API and the status page (port 443)."
  type        = list(string)
  validation {
    condition     = alltrue([for c in var.operator_cidrs : can(cidrhost(c, 0))])
    error_message = "operator_cidrs must be CIDR blocks."
  }
}

variable "agent_cidrs" {
  description = "Who may reach the agents' gRPC port (8401): the GPU pools' addresses, in every cloud."
  type        = list(string)
  validation {
    condition     = alltrue([for c in var.agent_cidrs : can(cidrhost(c, 0))])
    error_message = "agent_cidrs must be CIDR blocks."
  }
}

variable "oidc_issuer" {
  description = "People sign in through this OpenID Connect provider (its issuer URL, as it spells it); null: tokens only."
  type        = string
  default     = null
  validation {
    condition     = var.oidc_issuer == null || can(regex("^https://", var.oidc_issuer))
    error_message = "oidc_issuer must be an https:// URL."
  }
}

variable "oidc_client_id" {
  description = "The public client (PKCE, no secret) registered at the provider for the CLI and the status page, its redirect URI https://<domain_name>/status."
  type        = string
  default     = null
  validation {
    condition     = var.oidc_client_id == null || can(regex("^[!-~]+$", var.oidc_client_id))
    error_message = "oidc_client_id is printable ASCII with no space."
  }
}

variable "oidc_roles" {
  description = "The provider's groups to Meridian roles: viewer, operator, admin or tenant-admin:<tenant>."
  type        = map(string)
  default     = {}
  validation {
    condition     = alltrue([for r in values(var.oidc_roles) : can(regex("^(viewer|operator|admin|tenant-admin:[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)$", r))])
    error_message = "each role is viewer, operator, admin or tenant-admin:<tenant>."
  }
}

variable "meridian_package" {
  description = "What pip installs for Meridian on the replicas."
  type        = string
  default     = "meridian"
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
