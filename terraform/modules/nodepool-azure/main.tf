# A pool of GPU machines in one Azure location for one Meridian region: a virtual machine
# scale set whose machines boot with the shared agent bootstrap, behind a load balancer that
# is the region's gateway.

module "common" {
  source            = "../pool-common"
  region            = var.region
  control_plane     = var.control_plane
  control_plane_tls = var.control_plane_tls
  # The scale set's managed identity reads the token from Key Vault at boot.
  bootstrap_token_command = "az login --identity >/dev/null && az keyvault secret show --vault-name ${var.key_vault_name} --name ${var.bootstrap_token_secret_name} --query value --output tsv"
  meridian_package        = var.meridian_package
  sglang_package          = var.sglang_package
  gateway_port            = var.gateway_port
  gpus_per_node           = var.gpus_per_node
  node_count              = var.node_count
  client_cidrs            = var.client_cidrs
  pool_name               = var.name
  price_per_gpu_hour      = var.price_per_gpu_hour
  gpu_model               = var.gpu_model
  spot                    = var.spot
  min_nodes               = coalesce(var.min_nodes, 0)
  max_nodes               = var.max_nodes
  group                   = "${split("/", azurerm_linux_virtual_machine_scale_set.nodes.id)[2]}/${var.resource_group_name}/${azurerm_linux_virtual_machine_scale_set.nodes.name}"
  bootstrap_token_store = {
    kind   = "azure-key-vault"
    vault  = var.key_vault_name
    secret = var.bootstrap_token_secret_name
  }
}

resource "azurerm_user_assigned_identity" "nodes" {
  name                = "${var.name}-nodes"
  resource_group_name = var.resource_group_name
  location            = var.location
}

resource "azurerm_role_assignment" "token" {
  scope                = var.key_vault_id
  role_definition_name = "Key Vault Secrets User"
  principal_id         = azurerm_user_assigned_identity.nodes.principal_id
}

resource "azurerm_public_ip" "gateway" {
  name                = "${var.name}-gateway"
  resource_group_name = var.resource_group_name
  location            = var.location
  allocation_method   = "Static"
  sku                 = "Standard"
  zones               = var.zones
}

resource "azurerm_lb" "gateway" {
  name                = "${var.name}-gateway"
  resource_group_name = var.resource_group_name
  location            = var.location
  sku                 = "Standard"

  frontend_ip_configuration {
    name                 = "gateway"
    public_ip_address_id = azurerm_public_ip.gateway.id
  }
}

resource "azurerm_lb_backend_address_pool" "nodes" {
  name            = "nodes"
  loadbalancer_id = azurerm_lb.gateway.id
}

resource "azurerm_lb_probe" "gateway" {
  name            = "healthz"
  loadbalancer_id = azurerm_lb.gateway.id
  protocol        = "Http"
  port            = var.gateway_port
  request_path    = "/healthz"
}

resource "azurerm_lb_rule" "gateway" {
  name                           = "gateway"
  loadbalancer_id                = azurerm_lb.gateway.id
  protocol                       = "Tcp"
  frontend_port                  = var.gateway_port
  backend_port                   = var.gateway_port
  frontend_ip_configuration_name = "gateway"
  backend_address_pool_ids       = [azurerm_lb_backend_address_pool.nodes.id]
  probe_id                       = azurerm_lb_probe.gateway.id
}

resource "azurerm_network_security_group" "nodes" {
  name                = "${var.name}-nodes"
  resource_group_name = var.resource_group_name
  location            = var.location

  security_rule {
    name                       = "gateway"
    priority                   = 100
    direction                  = "Inbound"
    access                     = "Allow"
    protocol                   = "Tcp"
    source_port_range          = "*"
    destination_port_range     = tostring(var.gateway_port)
    source_address_prefixes    = var.client_cidrs
    destination_address_prefix = "*"
  }
}

resource "azurerm_linux_virtual_machine_scale_set" "nodes" {
  name                = "${var.name}-nodes"
  resource_group_name = var.resource_group_name
  location            = var.location
  sku                 = var.vm_size
  instances           = var.node_count
  zones               = var.zones
  admin_username      = "meridian"
  custom_data         = base64encode(module.common.cloud_init)
  priority            = var.spot ? "Spot" : "Regular"
  eviction_policy     = var.spot ? "Delete" : null
  upgrade_mode        = "Manual"

  admin_ssh_key {
    username   = "meridian"
    public_key = var.admin_ssh_key
  }

  source_image_reference {
    publisher = var.image.publisher
    offer     = var.image.offer
    sku       = var.image.sku
    version   = var.image.version
  }

  os_disk {
    caching              = "ReadWrite"
    storage_account_type = "Premium_LRS"
    disk_size_gb         = var.os_disk_gb
  }

  identity {
    type         = "UserAssigned"
    identity_ids = [azurerm_user_assigned_identity.nodes.id]
  }

  network_interface {
    name                      = "nic"
    primary                   = true
    network_security_group_id = azurerm_network_security_group.nodes.id

    ip_configuration {
      name                                   = "internal"
      primary                                = true
      subnet_id                              = var.subnet_id
      load_balancer_backend_address_pool_ids = [azurerm_lb_backend_address_pool.nodes.id]
    }
  }

  tags = {
    "meridian-region" = var.region
    "meridian-gpus"   = tostring(var.gpus_per_node)
  }

  lifecycle {
    # Meridian's capacity planner sets the instance count (its Azure provider); a later
    # plan must not set it back
    ignore_changes = [instances]
  }
}
