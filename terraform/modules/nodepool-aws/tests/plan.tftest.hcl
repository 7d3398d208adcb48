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
    condition     = output.bootstrap_token_store == { kind = "aws-secretsmanager", region = "us-east-1", secret = var.bootstrap_token_secret_arn }
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
