output "gateway_url" {
  description = "The region's gateway: the fleet document's gateway_url for it."
  value       = "http://${aws_lb.gateway.dns_name}:${var.gateway_port}"
}

output "region" {
  description = "The Meridian region its nodes join."
  value       = var.region
}

output "gpus" {
  description = "GPUs in the pool: node_count x gpus_per_node."
  value       = module.common.gpus
}

output "autoscaling_group" {
  description = "The pool's autoscaling group."
  value       = aws_autoscaling_group.nodes.name
}

output "security_group_id" {
  description = "The nodes' security group."
  value       = aws_security_group.nodes.id
}

output "bootstrap_token_store" {
  description = "Where `meridian join` puts the region's bootstrap token: fleet-document's regions[*].bootstrap_token_store."
  value = {
    kind   = "aws-secretsmanager"
    region = data.aws_region.current.name
    secret = var.bootstrap_token_secret_arn
  }
}

output "node_pool" {
  description = "The pool as the fleet's node pool, for fleet-document's node_pools (add the Meridian `cloud` it is on): its group, which the capacity planner resizes, and where `meridian join` puts the pool's own bootstrap token. Null unless price_per_gpu_hour is set."
  value = var.price_per_gpu_hour == null ? null : {
    name               = var.name
    region             = var.region
    gpu_model          = var.gpu_model
    gpus_per_node      = var.gpus_per_node
    price_per_gpu_hour = var.price_per_gpu_hour
    spot               = var.spot
    min_nodes          = coalesce(var.min_nodes, var.node_count)
    max_nodes          = coalesce(var.max_nodes, var.node_count)
    group              = "${data.aws_region.current.name}/${aws_autoscaling_group.nodes.name}"
    bootstrap_token_store = {
      kind   = "aws-secretsmanager"
      region = data.aws_region.current.name
      secret = var.bootstrap_token_secret_arn
    }
  }
}
