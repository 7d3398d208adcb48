output "document" {
  description = "The fleet document's clouds, regions and node pools, for `meridian apply -f` (YAML). It lists those kinds only, so applying it manages those and leaves models, deployments and tenants alone."
  value       = yamlencode(local.document)
}

output "regions" {
  description = "The regions' names."
  value       = [for r in var.regions : r.name]
}

output "join" {
  description = "What `meridian join -f` takes (JSON): the fleet document, the control plane's URL, where its admin token is, and where each pool's bootstrap token goes."
  value = jsonencode({
    apiVersion        = "meridian/v1"
    kind              = "Join"
    api_url           = var.api_url
    admin_token_store = var.admin_token_store
    token_lifetime_s  = var.token_lifetime_s
    fleet             = local.document
    pools = concat([for r in var.regions : {
      region                = r.name
      pool                  = null
      bootstrap_token_store = r.bootstrap_token_store
      } if r.bootstrap_token_store != null], [for p in var.node_pools : {
      region                = p.region
      pool                  = p.name
      bootstrap_token_store = p.bootstrap_token_store
    }])
  })
}
