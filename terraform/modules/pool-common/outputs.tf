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
