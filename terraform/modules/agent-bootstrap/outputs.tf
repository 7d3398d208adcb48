output "script" {
  description = "The boot script (bash): a GCP startup-script, or the body of cloud_init."
  value       = local.script
}

output "cloud_init" {
  description = "The same script as cloud-init user data (AWS launch templates, Azure scale sets)."
  value       = "#cloud-config\nwrite_files:\n  - path: /var/lib/cloud/scripts/meridian-bootstrap.sh\n    permissions: \"0700\"\n    encoding: b64\n    content: ${base64encode(local.script)}\nruncmd:\n  - [/var/lib/cloud/scripts/meridian-bootstrap.sh]\n"
}
