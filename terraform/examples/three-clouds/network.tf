# What the modules take as given: a network in each cloud, and the stores the pools' bootstrap
# tokens go in. Empty at first: `meridian join` puts the tokens there.

# --- AWS: a VPC with three private subnets (control plane, etcd, RDS) behind one NAT gateway,
# and three public ones (the load balancers, and the GPU machines, which take only the gateway
# port from client_cidrs) ---------------------------------------------------------------------

data "aws_availability_zones" "here" {
  state = "available"
}

locals {
  zones = slice(data.aws_availability_zones.here.names, 0, 3)
}

resource "aws_vpc" "main" {
  cidr_block           = "10.40.0.0/16"
  enable_dns_hostnames = true
  tags                 = { Name = var.name }
}

resource "aws_internet_gateway" "main" {
  vpc_id = aws_vpc.main.id
}

resource "aws_subnet" "public" {
  count                   = 3
  vpc_id                  = aws_vpc.main.id
  availability_zone       = local.zones[count.index]
  cidr_block              = cidrsubnet(aws_vpc.main.cidr_block, 8, count.index)
  map_public_ip_on_launch = true
  tags                    = { Name = "${var.name}-public-${count.index}" }
}

resource "aws_subnet" "private" {
  count             = 3
  vpc_id            = aws_vpc.main.id
  availability_zone = local.zones[count.index]
  cidr_block        = cidrsubnet(aws_vpc.main.cidr_block, 8, 10 + count.index)
  tags              = { Name = "${var.name}-private-${count.index}" }
}

resource "aws_eip" "nat" {
  domain = "vpc"
}

resource "aws_nat_gateway" "main" {
  allocation_id = aws_eip.nat.id
  subnet_id     = aws_subnet.public[0].id
}

resource "aws_route_table" "public" {
  vpc_id = aws_vpc.main.id
  route {
    cidr_block = "0.0.0.0/0"
    gateway_id = aws_internet_gateway.main.id
  }
}

resource "aws_route_table" "private" {
  vpc_id = aws_vpc.main.id
  route {
    cidr_block     = "0.0.0.0/0"
    nat_gateway_id = aws_nat_gateway.main.id
  }
}

resource "aws_route_table_association" "public" {
  count          = 3
  subnet_id      = aws_subnet.public[count.index].id
  route_table_id = aws_route_table.public.id
}

resource "aws_route_table_association" "private" {
  count          = 3
  subnet_id      = aws_subnet.private[count.index].id
  route_table_id = aws_route_table.private.id
}

resource "aws_secretsmanager_secret" "us_east_token" {
  name_prefix = "${var.name}/bootstrap/us-east-"
  description = "The bootstrap token of Meridian region us-east, put here by meridian join."
}

# --- GCP: the default network, and Secret Manager --------------------------------------------

resource "google_project_service" "apis" {
  for_each           = toset(["compute.googleapis.com", "secretmanager.googleapis.com"])
  service            = each.value
  disable_on_destroy = false
}

resource "google_secret_manager_secret" "eu_west_token" {
  secret_id = "${var.name}-bootstrap-eu-west"
  replication {
    auto {}
  }
  depends_on = [google_project_service.apis]
}

# --- Azure: a resource group, a network, and a Key Vault -------------------------------------

data "azurerm_client_config" "operator" {}

resource "azurerm_resource_group" "main" {
  name     = var.name
  location = var.azure_location
}

resource "azurerm_virtual_network" "main" {
  name                = var.name
  resource_group_name = azurerm_resource_group.main.name
  location            = azurerm_resource_group.main.location
  address_space       = ["10.50.0.0/16"]
}

resource "azurerm_subnet" "gpus" {
  name                 = "gpus"
  resource_group_name  = azurerm_resource_group.main.name
  virtual_network_name = azurerm_virtual_network.main.name
  address_prefixes     = ["10.50.1.0/24"]
}

resource "azurerm_key_vault" "main" {
  name                      = var.azure_key_vault_name
  resource_group_name       = azurerm_resource_group.main.name
  location                  = azurerm_resource_group.main.location
  tenant_id                 = data.azurerm_client_config.operator.tenant_id
  sku_name                  = "standard"
  enable_rbac_authorization = true
}

# whoever runs terraform runs `meridian join` too: it writes the pool's token here
resource "azurerm_role_assignment" "operator_writes_tokens" {
  scope                = azurerm_key_vault.main.id
  role_definition_name = "Key Vault Secrets Officer"
  principal_id         = data.azurerm_client_config.operator.object_id
}
