# Plans the control plane with a mocked AWS provider (no account, no network) and checks what
# matters: the parts and their counts, the ports each security group opens and to whom, TLS
# on both listeners, and that no secret is in any user data.

mock_provider "aws" {
  mock_data "aws_region" {
    defaults = { name = "us-east-1" }
  }
  mock_data "aws_subnet" {
    defaults = { cidr_block = "10.0.1.0/24" }
  }
  mock_data "aws_secretsmanager_random_password" {
    defaults = { random_password = "NotInUserData0123456789abcdefNotInUserData012345" }
  }
  mock_data "aws_iam_policy_document" {
    defaults = { json = "{}" }
  }
  # ARNs the provider checks the shape of, when a run applies
  mock_resource "aws_iam_instance_profile" {
    defaults = { arn = "arn:aws:iam::123456789012:instance-profile/replicas" }
  }
  mock_resource "aws_lb" {
    defaults = { arn = "arn:aws:elasticloadbalancing:us-east-1:123456789012:loadbalancer/net/cp/1" }
  }
  mock_resource "aws_lb_target_group" {
    defaults = { arn = "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/cp/1" }
  }
  mock_resource "aws_launch_template" {
    defaults = { id = "lt-0123456789abcdef0" }
  }
  mock_resource "aws_kms_key" {
    defaults = { arn = "arn:aws:kms:us-east-1:123456789012:key/0123abcd-0123-abcd-0123-0123456789ab" }
  }
  mock_resource "aws_secretsmanager_secret" {
    defaults = { arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:meridian/x" }
  }
}

variables {
  vpc_id              = "vpc-0123456789abcdef0"
  private_subnet_ids  = ["subnet-0aaaaaaaaaaaaaaaa", "subnet-0bbbbbbbbbbbbbbbb", "subnet-0cccccccccccccccc"]
  public_subnet_ids   = ["subnet-0dddddddddddddddd"]
  ami_id              = "ami-0123456789abcdef0"
  tls_certificate_arn = "arn:aws:acm:us-east-1:123456789012:certificate/abc"
  domain_name         = "cp.example.com"
  operator_cidrs      = ["203.0.113.0/24"]
  agent_cidrs         = ["198.51.100.0/24", "192.0.2.0/24"]
}

run "the_parts" {
  command = plan

  assert {
    condition     = aws_autoscaling_group.replicas.desired_capacity == 2
    error_message = "two replicas by default"
  }
  assert {
    condition     = length(aws_instance.etcd) == 3
    error_message = "etcd has three members"
  }
  assert {
    condition     = aws_db_instance.database.engine == "postgres" && aws_db_instance.database.storage_encrypted && !aws_db_instance.database.publicly_accessible && aws_db_instance.database.multi_az
    error_message = "PostgreSQL on RDS, encrypted, private, with a standby"
  }
}

run "tls_on_both_listeners" {
  command = plan

  assert {
    condition     = aws_lb_listener.api.port == 443 && aws_lb_listener.api.protocol == "TLS" && aws_lb_listener.api.certificate_arn == var.tls_certificate_arn
    error_message = "the REST API is not served over TLS on 443"
  }
  assert {
    condition     = aws_lb_listener.grpc.port == 8401 && aws_lb_listener.grpc.protocol == "TLS" && aws_lb_listener.grpc.alpn_policy == "HTTP2Preferred"
    error_message = "the agents' gRPC is not served over TLS (with HTTP/2) on 8401"
  }
}

run "reached_by_the_certificate_name" {
  command = plan
  variables {
    route53_zone_id = "Z0123456789ABCDEFGHIJ"
  }

  assert {
    condition     = output.api_url == "https://cp.example.com" && output.grpc_target == "cp.example.com:8401"
    error_message = "operators and agents must reach the control plane by the name its certificate is for"
  }
  assert {
    condition     = length(aws_route53_record.control_plane) == 1 && aws_route53_record.control_plane[0].name == "cp.example.com"
    error_message = "with a hosted zone, the name is made an alias of the load balancer"
  }
}

run "each_port_to_whom_it_is_for" {
  command = plan

  assert {
    condition = toset([for r in aws_security_group.lb.ingress : "${r.from_port}:${join(",", sort(r.cidr_blocks))}"]) == toset([
    "443:203.0.113.0/24", "8401:192.0.2.0/24,198.51.100.0/24"])
    error_message = "the load balancer opens 443 to operators and 8401 to agents, and nothing else"
  }
  assert {
    condition     = length(aws_security_group.database.ingress) == 1 && alltrue([for r in aws_security_group.database.ingress : r.from_port == 5432 && length(coalesce(r.cidr_blocks, [])) == 0])
    error_message = "the database takes PostgreSQL from the replicas' group only, from no address range"
  }
  assert {
    condition     = alltrue([for r in aws_security_group.etcd.ingress : length(coalesce(r.cidr_blocks, [])) == 0])
    error_message = "etcd is open to an address range"
  }
  assert {
    condition     = alltrue([for r in aws_security_group.replicas.ingress : length(coalesce(r.cidr_blocks, [])) == 0 && r.from_port == 8400 && r.to_port == 8401])
    error_message = "the replicas take more than the load balancer's traffic"
  }
}

run "no_secret_in_user_data" {
  # applied, with the provider mocked: the user data needs the database's address
  command = apply

  assert {
    condition     = !strcontains(base64decode(aws_launch_template.replicas.user_data), "NotInUserData")
    error_message = "a secret is in the replicas' user data"
  }
  assert {
    condition     = strcontains(base64decode(aws_launch_template.replicas.user_data), "secretsmanager get-secret-value")
    error_message = "the replicas do not read their secrets from Secrets Manager"
  }
  assert {
    condition     = alltrue([for m in aws_instance.etcd : !strcontains(m.user_data, "NotInUserData")])
    error_message = "a secret is in etcd's user data"
  }
}

run "stored_secrets_are_sealed_by_one_kms_key_for_every_replica" {
  command = apply

  assert {
    condition     = strcontains(base64decode(aws_launch_template.replicas.user_data), "MERIDIAN_KMS=aws-kms:${aws_kms_key.secrets.arn}")
    error_message = "the replicas do not seal secrets with the module's KMS key (each would make a key file of its own)"
  }
  assert {
    condition     = aws_kms_key.secrets.enable_key_rotation
    error_message = "the KMS key is not rotated"
  }
  assert {
    condition     = !strcontains(base64decode(aws_launch_template.replicas.user_data), "MERIDIAN_OIDC")
    error_message = "single sign-on is configured though no provider was given"
  }
}

run "people_sign_in_through_the_provider" {
  command = apply
  variables {
    oidc_issuer    = "https://login.example.com/"
    oidc_client_id = "meridian"
    oidc_roles     = { platform = "admin", "acme-admins" = "tenant-admin:acme" }
  }

  assert {
    condition = alltrue([for line in [
      "MERIDIAN_OIDC_ISSUER=https://login.example.com/",
      "MERIDIAN_OIDC_CLIENT_ID=meridian",
      "MERIDIAN_OIDC_ROLES='{\"acme-admins\":\"tenant-admin:acme\",\"platform\":\"admin\"}'",
    ] : strcontains(base64decode(aws_launch_template.replicas.user_data), line)])
    error_message = "the replicas are not told the identity provider and its groups' roles"
  }
}

run "an_issuer_needs_its_client" {
  command = plan
  variables {
    oidc_issuer = "https://login.example.com/"
  }
  expect_failures = [aws_launch_template.replicas]
}

run "a_role_that_is_not_one" {
  command = plan
  variables {
    oidc_issuer    = "https://login.example.com/"
    oidc_client_id = "meridian"
    oidc_roles     = { platform = "root" }
  }
  expect_failures = [var.oidc_roles]
}

run "one_replica_is_not_highly_available" {
  command = plan
  variables {
    replicas = 1
  }
  expect_failures = [var.replicas]
}

run "a_name_that_is_not_a_dns_name" {
  command = plan
  variables {
    domain_name = "https://cp.example.com"
  }
  expect_failures = [var.domain_name]
}

run "etcd_needs_three_zones" {
  command = plan
  variables {
    private_subnet_ids = ["subnet-0aaaaaaaaaaaaaaaa"]
  }
  expect_failures = [var.private_subnet_ids]
}
