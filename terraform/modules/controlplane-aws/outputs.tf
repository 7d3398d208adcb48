output "api_url" {
  description = "The admin REST API and status page (MERIDIAN_URL)."
  value       = "https://${aws_lb.control_plane.dns_name}"
}

output "grpc_target" {
  description = "What agents connect to (agent-bootstrap's control_plane): TLS on 8401."
  value       = "${aws_lb.control_plane.dns_name}:8401"
}

output "admin_token_secret_arn" {
  description = "The Secrets Manager secret that holds the admin token."
  value       = aws_secretsmanager_secret.admin_token.arn
}

output "database_address" {
  description = "The PostgreSQL endpoint (private)."
  value       = aws_db_instance.database.address
}

output "etcd_endpoints" {
  description = "The etcd members' client addresses."
  value       = local.etcd_endpoints
}
