output "join" {
  description = "What `meridian join -f -` takes: `terraform output -raw join | meridian join -f -`."
  value       = module.fleet.join
}

output "fleet_document" {
  description = "The clouds and regions, as `meridian join` applies them (fleet.yaml shows one)."
  value       = module.fleet.document
}

output "api_url" {
  description = "The control plane's admin API and status page (MERIDIAN_URL)."
  value       = module.control_plane.api_url
}

output "admin_token_secret_arn" {
  description = "Where the admin token is: aws secretsmanager get-secret-value --secret-id ..."
  value       = module.control_plane.admin_token_secret_arn
}

output "load_balancer_dns_name" {
  description = "Where domain_name must point, when route53_zone_id is null."
  value       = module.control_plane.load_balancer_dns_name
}

output "gpus" {
  description = "GPUs per region."
  value = {
    (module.us_east.region) = module.us_east.gpus
    (module.eu_west.region) = module.eu_west.gpus
    (module.us_west.region) = module.us_west.gpus
  }
}

output "gateways" {
  description = "Each region's OpenAI endpoint."
  value = {
    (module.us_east.region) = module.us_east.gateway_url
    (module.eu_west.region) = module.eu_west.gateway_url
    (module.us_west.region) = module.us_west.gateway_url
  }
}
