# Plans the pool with a mocked AWS provider (no account, no network) and checks what matters:
# machine type and GPU count, who the security group lets in, and that no secret is in the
# user data.

mock_provider "aws" {
  mock_data "aws_region" {
    defaults = { name = "us-east-1" }
  }
  mock_data "aws_iam_policy_document" {
    defaults = { json = "{}" }
  }
  # ARNs the provider checks when a run applies (mocked)
  mock_resource "aws_iam_instance_profile" {
    defaults = { arn = "arn:aws:iam::123456789012:instance-profile/gpu-east" }
  }
  mock_resource "aws_lb" {
    defaults = { arn = "arn:aws:elasticloadbalancing:us-east-1:123456789012:loadbalancer/net/gpu-east/1" }
  }
  mock_resource "aws_launch_template" {
    defaults = { id = "lt-0123456789abcdef0" }
  }
  mock_resource "aws_lb_target_group" {
    defaults = { arn = "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/gpu-east/1" }
  }
}

variables {
  name                       = "gpu-east"
  region                     = "us-east"
  vpc_id                     = "vpc-0123456789abcdef0"
  subnet_ids                 = ["subnet-0aaaaaaaaaaaaaaaa", "subnet-0bbbbbbbbbbbbbbbb"]
  instance_type              = "p5.48xlarge"
  gpus_per_node              = 8
  node_count                 = 2
  ami_id                     = "ami-0123456789abcdef0"
  control_plane              = "cp.example.com:8401"
  bootstrap_token_secret_arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:meridian/bootstrap/us-east-AbCdEf"
  client_cidrs               = ["10.0.0.0/8"]
}

run "a_pool_of_gpu_machines" {
  command = plan

  assert {
    condition     = aws_launch_template.nodes.instance_type == "p5.48xlarge"
    error_message = "the machines are not of the instance type asked for"
  }
  assert {
    condition     = aws_autoscaling_group.nodes.desired_capacity == 2 && aws_autoscaling_group.nodes.max_size == 2
    error_message = "the pool does not have node_count machines"
  }
  assert {
    condition     = aws_autoscaling_group.nodes.min_size == 2
    error_message = "the planner's bounds default to node_count"
  }
  assert {
    condition     = output.gpus == 16
    error_message = "the pool's GPUs are not node_count x gpus_per_node"
  }
  assert {
    condition     = length(aws_launch_template.nodes.instance_market_options) == 0
    error_message = "on-demand by default"
  }
}

run "only_the_gateway_port_and_only_from_the_clients" {
  command = plan

  assert {
    condition     = length(aws_security_group.nodes.ingress) == 1
    error_message = "the nodes open more than the gateway port"
  }
  assert {
    condition = alltrue([for rule in aws_security_group.nodes.ingress :
    rule.from_port == 8500 && rule.to_port == 8500 && rule.protocol == "tcp" && toset(rule.cidr_blocks) == toset(["10.0.0.0/8"])])
    error_message = "the gateway port is open to others than client_cidrs"
  }
}

run "no_secret_in_user_data" {
  command = plan

  assert {
    condition     = strcontains(module.common.script, "secretsmanager get-secret-value --region us-east-1 --secret-id arn:aws:secretsmanager:us-east-1:123456789012:secret:meridian/bootstrap/us-east-AbCdEf")
    error_message = "the machines do not read the token from Secrets Manager"
  }
  assert {
    condition     = output.bootstrap_token_store.kind == "aws-secretsmanager" && output.bootstrap_token_store.region == "us-east-1" && output.bootstrap_token_store.secret == var.bootstrap_token_secret_arn
    error_message = "meridian join would not find the secret the machines read"
  }
  assert {
    condition     = !can(regex("BOOTSTRAP_TOKEN=[^%]", module.common.script)) && !strcontains(module.common.script, "mb-")
    error_message = "a bootstrap token is written into the user data"
  }
  assert {
    condition     = base64decode(aws_launch_template.nodes.user_data) == module.common.cloud_init
    error_message = "the user data is not the shared bootstrap"
  }
  assert {
    condition     = strcontains(module.common.script, "'MERIDIAN_AGENT_TLS_CA_FILE' '/etc/ssl/certs/ca-certificates.crt'")
    error_message = "the agents do not verify the control plane's TLS certificate"
  }
  assert {
    condition     = aws_launch_template.nodes.metadata_options[0].http_tokens == "required"
    error_message = "IMDSv1 is open: any process could read the instance's credentials"
  }
}

run "spot_when_asked" {
  command = plan
  variables {
    spot = true
  }
  assert {
    condition     = aws_launch_template.nodes.instance_market_options[0].market_type == "spot"
    error_message = "spot was asked for"
  }
}

run "refuses_a_machine_without_gpus" {
  command = plan
  variables {
    instance_type = "m5.large"
  }
  expect_failures = [var.instance_type]
}

run "refuses_a_token_secret_that_is_not_one" {
  command = plan
  variables {
    bootstrap_token_secret_arn = "mb-12345678.not-an-arn"
  }
  expect_failures = [var.bootstrap_token_secret_arn]
}

run "a_pool_with_a_price_is_the_fleets_node_pool" {
  command = apply # mocked: the group's name (name_prefix) is known only once made

  variables {
    spot               = true
    max_nodes          = 6
    price_per_gpu_hour = 1.9
    gpu_model          = "NVIDIA H100 80GB HBM3"
  }

  assert {
    condition     = output.node_pool.group == "us-east-1/${aws_autoscaling_group.nodes.name}"
    error_message = "the node pool's group is not aws-region/auto-scaling-group"
  }
  assert {
    condition     = output.node_pool.spot && output.node_pool.min_nodes == 2 && output.node_pool.max_nodes == 6 && output.node_pool.gpus_per_node == 8
    error_message = "the node pool does not carry the pool's bounds, spot and GPUs"
  }
  assert {
    condition     = output.node_pool.bootstrap_token_store.secret == var.bootstrap_token_secret_arn
    error_message = "the node pool's token goes elsewhere than the pool's secret"
  }
}

run "a_pool_without_a_price_is_left_to_its_operator" {
  command = plan

  assert {
    condition     = output.node_pool == null
    error_message = "a pool without a price became a node pool the planner would resize"
  }
}
