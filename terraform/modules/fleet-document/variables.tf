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
    condition     = alltrue([for r in var.regions : can(regex("^https?://[^\\s/]+", r.gateway_url))])
    error_message = "a region's gateway_url is an http:// or https:// URL."
  }
}
