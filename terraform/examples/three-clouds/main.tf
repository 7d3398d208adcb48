# Meridian on three clouds: the control plane on AWS, and a GPU pool in one region of each of
# AWS (us-east), GCP (eu-west) and Azure (us-west). The order an operator follows is in
# README.md: `terraform apply`, then `meridian join`, then your models.

module "control_plane" {
  source              = "../../modules/controlplane-aws"
  name                = var.name
  vpc_id              = aws_vpc.main.id
  private_subnet_ids  = aws_subnet.private[*].id
  public_subnet_ids   = aws_subnet.public[*].id
  ami_id              = var.debian_ami_id
  tls_certificate_arn = var.tls_certificate_arn
  domain_name         = var.domain_name
  route53_zone_id     = var.route53_zone_id
  operator_cidrs      = var.operator_cidrs
  agent_cidrs         = var.agent_cidrs
  meridian_package    = var.meridian_package
  depends_on          = [aws_route_table_association.private] # the replicas install over NAT
}

module "us_east" {
  source                     = "../../modules/nodepool-aws"
  name                       = "${var.name}-us-east"
  region                     = "us-east"
  vpc_id                     = aws_vpc.main.id
  subnet_ids                 = aws_subnet.public[*].id
  instance_type              = "p5.48xlarge"
  gpus_per_node              = 8
  node_count                 = 1
  ami_id                     = var.aws_gpu_ami_id
  control_plane              = module.control_plane.grpc_target
  bootstrap_token_secret_arn = aws_secretsmanager_secret.us_east_token.arn
  client_cidrs               = var.client_cidrs
  meridian_package           = var.meridian_package
  sglang_package             = var.sglang_package
}

module "eu_west" {
  source                 = "../../modules/nodepool-gcp"
  name                   = "${var.name}-eu-west"
  region                 = "eu-west"
  project                = var.gcp_project
  zone                   = var.gcp_zone
  network                = "default"
  subnetwork             = "default"
  machine_type           = "a3-highgpu-8g"
  gpus_per_node          = 8
  node_count             = 1
  spot                   = true
  image                  = "projects/deeplearning-platform-release/global/images/family/common-cu124"
  control_plane          = module.control_plane.grpc_target
  bootstrap_token_secret = google_secret_manager_secret.eu_west_token.id
  client_cidrs           = var.client_cidrs
  meridian_package       = var.meridian_package
  sglang_package         = var.sglang_package
  depends_on             = [google_project_service.apis]
}

module "us_west" {
  source                      = "../../modules/nodepool-azure"
  name                        = "${var.name}-us-west"
  region                      = "us-west"
  resource_group_name         = azurerm_resource_group.main.name
  location                    = azurerm_resource_group.main.location
  subnet_id                   = azurerm_subnet.gpus.id
  vm_size                     = "Standard_NC24ads_A100_v4"
  gpus_per_node               = 1
  node_count                  = 2
  image                       = { publisher = "microsoft-dsvm", offer = "ubuntu-hpc", sku = "2204", version = "latest" }
  admin_ssh_key               = var.azure_admin_ssh_key
  control_plane               = module.control_plane.grpc_target
  key_vault_name              = azurerm_key_vault.main.name
  key_vault_id                = azurerm_key_vault.main.id
  bootstrap_token_secret_name = "bootstrap-us-west"
  client_cidrs                = var.client_cidrs
  meridian_package            = var.meridian_package
  sglang_package              = var.sglang_package
}

module "fleet" {
  source            = "../../modules/fleet-document"
  api_url           = module.control_plane.api_url
  admin_token_store = module.control_plane.admin_token_store
  clouds = {
    aws   = { provider = "aws", description = "Amazon Web Services" }
    gcp   = { provider = "gcp", description = "Google Cloud" }
    azure = { provider = "azure", description = "Microsoft Azure" }
  }
  regions = [
    {
      name                  = module.us_east.region
      cloud                 = "aws"
      geography             = "us-east"
      jurisdiction          = "us"
      gateway_url           = module.us_east.gateway_url
      bootstrap_token_store = module.us_east.bootstrap_token_store
    },
    {
      name                  = module.eu_west.region
      cloud                 = "gcp"
      geography             = "eu-west"
      jurisdiction          = "eu"
      gateway_url           = module.eu_west.gateway_url
      bootstrap_token_store = module.eu_west.bootstrap_token_store
    },
    {
      name                  = module.us_west.region
      cloud                 = "azure"
      geography             = "us-west"
      jurisdiction          = "us"
      gateway_url           = module.us_west.gateway_url
      bootstrap_token_store = module.us_west.bootstrap_token_store
    },
  ]
}
