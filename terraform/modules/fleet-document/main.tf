locals {
  document = {
    apiVersion = "meridian/v1"
    clouds = [for name in sort(keys(var.clouds)) : {
      name        = name
      provider    = var.clouds[name].provider
      description = var.clouds[name].description
    }]
    regions = [for r in var.regions : {
      name         = r.name
      cloud        = r.cloud
      geography    = r.geography
      jurisdiction = r.jurisdiction
      gateway_url  = r.gateway_url
    }]
  }
}
