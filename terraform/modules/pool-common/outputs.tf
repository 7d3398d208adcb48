output "script" {
  description = "The machines' boot script (bash)."
  value       = module.bootstrap.script
}

output "cloud_init" {
  description = "The same script as cloud-init user data."
  value       = module.bootstrap.cloud_init
}

output "gpus" {
  description = "GPUs in the pool: node_count x gpus_per_node."
  value       = var.node_count * var.gpus_per_node
}

output "node_pool" {
  precondition {
    condition     = var.price_per_gpu_hour == null || (var.gpu_model != null && var.pool_name != null && var.group != null)
    error_message = "a pool with a price_per_gpu_hour needs its gpu_model (and its name and group, which its module gives)."
  }
  description = "The pool as the fleet's node pool, for fleet-document's node_pools (add the Meridian `cloud` it is on); null unless price_per_gpu_hour is set."
  value = var.price_per_gpu_hour == null ? null : {
    name                  = var.pool_name
    region                = var.region
    gpu_model             = var.gpu_model
    gpus_per_node         = var.gpus_per_node
    price_per_gpu_hour    = var.price_per_gpu_hour
    spot                  = var.spot
    min_nodes             = var.min_nodes
    max_nodes             = coalesce(var.max_nodes, var.node_count)
    group                 = var.group
    bootstrap_token_store = var.bootstrap_token_store
  }
}

output "bootstrap_token_store" {
  description = "Where `meridian join` puts the pool's bootstrap token, as given."
  value       = var.bootstrap_token_store
}
