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
