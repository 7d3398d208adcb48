output "api_url" {
  description = "The admin REST API and status page (MERIDIAN_URL)."
  value       = "https://${var.domain_name}"
}

output "load_balancer_dns_name" {
  description = "The load balancer's own name: where domain_name points (done here with route53_zone_id)."
  value       = aws_lb.control_plane.dns_name
}

output "grpc_target" {
  description = "What agents connect to (agent-bootstrap's control_plane): TLS on 8401."
  value       = "${var.domain_name}:8401"
}

output "admin_token_secret_arn" {
  description = "The Secrets Manager secret that holds the admin token."
  value       = aws_secretsmanager_secret.admin_token.arn
}

output "admin_token_store" {
  description = "Where `meridian join` reads the admin token: fleet-document's admin_token_store."
  value = {
    kind   = "aws-secretsmanager"
    region = data.aws_region.current.name
    secret = aws_secretsmanager_secret.admin_token.arn
  }
}

output "database_address" {
  description = "The PostgreSQL endpoint (private)."
  value       = aws_db_instance.database.address
}

output "etcd_endpoints" {
  description = "The etcd members' client addresses."
  value       = local.etcd_endpoints
}
