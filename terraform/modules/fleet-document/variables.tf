variable "clouds" {
  description = "The clouds the regions are on, by name: { aws = { provider = \"aws\" }, ... }."
  type = map(object({
    provider    = string
    description = optional(string, "")
  }))
  validation {
    condition     = alltrue([for name, c in var.clouds : can(regex("^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$", name)) && can(regex("^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$", c.provider))])
    error_message = "cloud names are 1-63 letters, digits, '.', '_' or '-'; providers 1-32 lowercase letters, digits or '-'."
  }
}

variable "regions" {
  description = "Meridian's regions: each pool's region and gateway_url, with where it is and whose law applies."
  type = list(object({
    name         = string
    cloud        = string
    geography    = string
    jurisdiction = string
    gateway_url  = string
    # the pool's output of the same name: where `meridian join` puts its bootstrap token
    bootstrap_token_store = optional(object({
      kind   = string
      secret = string
      region = optional(string)
      vault  = optional(string)
    }))
  }))
  validation {
    condition     = length(var.regions) > 0 && length(distinct([for r in var.regions : r.name])) == length(var.regions)
    error_message = "give one region or more, each name once."
  }
  validation {
    condition     = alltrue([for r in var.regions : can(regex("^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$", r.geography)) && can(regex("^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$", r.jurisdiction))])
    error_message = "a region's geography and jurisdiction are 1-32 lowercase letters, digits or '-' (us-east, eu)."
  }
  validation {
    condition     = alltrue([for r in var.regions : contains(keys(var.clouds), r.cloud)])
    error_message = "every region's cloud must be one of var.clouds."
  }
  validation {
    condition = alltrue([for r in var.regions : r.bootstrap_token_store == null || try(
      contains(["aws-secretsmanager", "gcp-secret-manager", "azure-key-vault"], r.bootstrap_token_store.kind)
      && (r.bootstrap_token_store.kind != "aws-secretsmanager" || r.bootstrap_token_store.region != null)
    && (r.bootstrap_token_store.kind != "azure-key-vault" || r.bootstrap_token_store.vault != null), false)])
    error_message = "a region's bootstrap_token_store is a pool's output of that name: aws-secretsmanager (with region), gcp-secret-manager or azure-key-vault (with vault)."
  }
  validation {
    condition     = alltrue([for r in var.regions : can(regex("^https?://[^\\s/]+", r.gateway_url))])
    error_message = "a region's gateway_url is an http:// or https:// URL."
  }
}

variable "api_url" {
  description = "The control plane's REST API (controlplane-aws's api_url), for `meridian join`; null: MERIDIAN_URL."
  type        = string
  default     = null
  validation {
    condition     = var.api_url == null || can(regex("^https?://[^\\s/]+$", var.api_url))
    error_message = "api_url is an http:// or https:// URL with no path."
  }
}

variable "admin_token_store" {
  description = "Where `meridian join` reads the admin token (controlplane-aws's admin_token_store); null: MERIDIAN_TOKEN."
  type = object({
    kind   = string
    secret = string
    region = optional(string)
    vault  = optional(string)
  })
  default = null
}

variable "token_lifetime_s" {
  description = "How long the bootstrap tokens `meridian join` makes are good for. Machines the pools add later register with them: run `meridian join` again well before they expire (it makes new ones)."
  type        = number
  default     = 604800
  validation {
    condition     = var.token_lifetime_s >= 3600 && var.token_lifetime_s <= 2592000
    error_message = "token_lifetime_s must be from 3600 (an hour) to 2592000 (30 days, the control plane's limit)."
  }
}

variable "node_pools" {
  description = "The pools the capacity planner may resize: each pool module's `node_pool` output, with the Meridian cloud it is on. Each becomes a node pool of the document (its cloud's group named), and `meridian join` gives each a bootstrap token of its own, scoped to the pool, so that the machines its group adds join it."
  type = list(object({
    name               = string
    cloud              = string
    region             = string
    gpu_model          = string
    gpus_per_node      = number
    price_per_gpu_hour = number
    spot               = bool
    min_nodes          = number
    max_nodes          = number
    group              = string
    bootstrap_token_store = object({
      kind   = string
      secret = string
      region = optional(string)
      vault  = optional(string)
    })
  }))
  default = []
  validation {
    condition     = length(distinct([for p in var.node_pools : p.name])) == length(var.node_pools)
    error_message = "each node pool's name once."
  }
  validation {
    condition     = alltrue([for p in var.node_pools : contains(keys(var.clouds), p.cloud) && contains([for r in var.regions : r.name], p.region)])
    error_message = "every node pool's cloud must be one of var.clouds, and its region one of var.regions."
  }
  validation {
    condition     = alltrue([for p in var.node_pools : p.price_per_gpu_hour >= 0 && p.gpus_per_node >= 1 && p.min_nodes >= 0 && p.min_nodes <= p.max_nodes])
    error_message = "a node pool's price is 0 or more, it has 1 GPU a node or more, and min_nodes <= max_nodes."
  }
}
