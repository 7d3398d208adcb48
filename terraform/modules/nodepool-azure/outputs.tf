output "gateway_url" {
  description = "The region's gateway: the fleet document's gateway_url for it."
  value       = "http://${azurerm_public_ip.gateway.ip_address}:${var.gateway_port}"
}

output "region" {
  description = "The Meridian region its nodes join."
  value       = var.region
}

output "gpus" {
  description = "GPUs in the pool: node_count x gpus_per_node."
  value       = module.common.gpus
}

output "scale_set" {
  description = "The pool's scale set."
  value       = azurerm_linux_virtual_machine_scale_set.nodes.name
}

output "bootstrap_token_store" {
  description = "Where `meridian join` puts the region's bootstrap token: fleet-document's regions[*].bootstrap_token_store."
  value       = module.common.bootstrap_token_store
}

output "node_pool" {
  description = "The pool as the fleet's node pool, for fleet-document's node_pools (add the Meridian `cloud` it is on): its group, which the capacity planner resizes, and where `meridian join` puts the pool's own bootstrap token. Null unless price_per_gpu_hour is set."
  value       = module.common.node_pool
}
