output "document" {
  description = "The fleet document's clouds and regions, for `meridian apply -f` (YAML). It lists the clouds and regions kinds only, so applying it manages those and leaves models, deployments and tenants alone."
  value       = yamlencode(local.document)
}

output "regions" {
  description = "The regions' names."
  value       = [for r in var.regions : r.name]
}
