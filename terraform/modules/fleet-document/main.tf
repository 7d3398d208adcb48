locals {
  base = {
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
  # only where the pools are given: a document without the kind leaves the fleet's pools be
  pools = [for p in var.node_pools : {
    name               = p.name
    cloud              = p.cloud
    region             = p.region
    gpu_model          = p.gpu_model
    gpus_per_node      = p.gpus_per_node
    price_per_gpu_hour = p.price_per_gpu_hour
    spot               = p.spot
    min_nodes          = p.min_nodes
    max_nodes          = p.max_nodes
    group              = p.group
  }]
  document = merge(local.base, { for k, v in { node_pools = local.pools } : k => v if length(v) > 0 })
}
