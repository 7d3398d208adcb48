# The control plane on AWS: PostgreSQL on RDS, a three-member etcd cluster, two or more
# replicas in an autoscaling group, and one network load balancer that serves operators the
# REST API (443) and agents their gRPC port (8401), both over TLS. The admin token and the
# database's password live in Secrets Manager; machines read them at boot, and user data
# holds only where they are.

data "aws_region" "current" {}

data "aws_subnet" "private" {
  for_each = toset(var.private_subnet_ids)
  id       = each.value
}

locals {
  etcd_subnets   = slice(var.private_subnet_ids, 0, 3)
  etcd_ips       = [for s in local.etcd_subnets : cidrhost(data.aws_subnet.private[s].cidr_block, 10)]
  etcd_endpoints = join(",", [for ip in local.etcd_ips : "${ip}:2379"])
  etcd_cluster   = join(",", [for i, ip in local.etcd_ips : "etcd${i}=http://${ip}:2380"])
}

# --- secrets -----------------------------------------------------------------------------

data "aws_secretsmanager_random_password" "admin_token" {
  password_length     = 48
  exclude_punctuation = true
}

data "aws_secretsmanager_random_password" "database" {
  password_length     = 40
  exclude_punctuation = true
}

resource "aws_secretsmanager_secret" "admin_token" {
  name_prefix = "${var.name}/admin-token-"
  description = "Meridian's bootstrap admin token (MERIDIAN_ADMIN_TOKEN)"
  tags        = var.tags
}

resource "aws_secretsmanager_secret_version" "admin_token" {
  secret_id     = aws_secretsmanager_secret.admin_token.id
  secret_string = data.aws_secretsmanager_random_password.admin_token.random_password
  lifecycle {
    ignore_changes = [secret_string] # made once; rotated by operators, not by each plan
  }
}

resource "aws_secretsmanager_secret" "database" {
  name_prefix = "${var.name}/database-password-"
  description = "The password of Meridian's PostgreSQL user"
  tags        = var.tags
}

resource "aws_secretsmanager_secret_version" "database" {
  secret_id     = aws_secretsmanager_secret.database.id
  secret_string = data.aws_secretsmanager_random_password.database.random_password
  lifecycle {
    ignore_changes = [secret_string]
  }
}

# --- security groups -----------------------------------------------------------------------

resource "aws_security_group" "lb" {
  name_prefix = "${var.name}-lb-"
  description = "Meridian control plane load balancer: the API to operators, gRPC to agents"
  vpc_id      = var.vpc_id
  tags        = var.tags

  ingress {
    description = "the admin REST API and status page, TLS"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = var.operator_cidrs
  }

  ingress {
    description = "the agents gRPC, TLS"
    from_port   = 8401
    to_port     = 8401
    protocol    = "tcp"
    cidr_blocks = var.agent_cidrs
  }

  egress {
    description = "to the replicas"
    from_port   = 8400
    to_port     = 8401
    protocol    = "tcp"
    cidr_blocks = [for s in data.aws_subnet.private : s.cidr_block]
  }
}

resource "aws_security_group" "replicas" {
  name_prefix = "${var.name}-replicas-"
  description = "Meridian control plane replicas: from the load balancer only"
  vpc_id      = var.vpc_id
  tags        = var.tags

  ingress {
    description     = "REST API and gRPC from the load balancer"
    from_port       = 8400
    to_port         = 8401
    protocol        = "tcp"
    security_groups = [aws_security_group.lb.id]
  }

  egress {
    description = "the database, etcd, package mirrors, Secrets Manager"
    from_port   = 0
    to_port     = 0
    protocol    = "-1"
    cidr_blocks = ["0.0.0.0/0"]
  }
}

resource "aws_security_group" "database" {
  name_prefix = "${var.name}-db-"
  description = "Meridian PostgreSQL: from the replicas only"
  vpc_id      = var.vpc_id
  tags        = var.tags

  ingress {
    description     = "PostgreSQL from the replicas"
    from_port       = 5432
    to_port         = 5432
    protocol        = "tcp"
    security_groups = [aws_security_group.replicas.id]
  }
}

resource "aws_security_group" "etcd" {
  name_prefix = "${var.name}-etcd-"
  description = "Meridian etcd: clients from the replicas, peers from each other"
  vpc_id      = var.vpc_id
  tags        = var.tags

  ingress {
    description     = "etcd clients: the replicas"
    from_port       = 2379
    to_port         = 2379
    protocol        = "tcp"
    security_groups = [aws_security_group.replicas.id]
  }

  ingress {
    description = "etcd peers"
    from_port   = 2380
    to_port     = 2380
    protocol    = "tcp"
    self        = true
  }

  egress {
    description = "package mirrors"
    from_port   = 0
    to_port     = 0
    protocol    = "-1"
    cidr_blocks = ["0.0.0.0/0"]
  }
}

# --- PostgreSQL ------------------------------------------------------------------------------

resource "aws_db_subnet_group" "database" {
  name_prefix = "${var.name}-"
  subnet_ids  = var.private_subnet_ids
  tags        = var.tags
}

resource "aws_db_instance" "database" {
  identifier_prefix          = "${var.name}-"
  engine                     = "postgres"
  engine_version             = "16"
  instance_class             = var.db_instance_class
  allocated_storage          = var.db_storage_gb
  storage_type               = "gp3"
  storage_encrypted          = true
  multi_az                   = var.db_multi_az
  db_name                    = "meridian"
  username                   = "meridian"
  password                   = data.aws_secretsmanager_random_password.database.random_password
  db_subnet_group_name       = aws_db_subnet_group.database.name
  vpc_security_group_ids     = [aws_security_group.database.id]
  publicly_accessible        = false
  backup_retention_period    = 7
  deletion_protection        = true
  skip_final_snapshot        = false
  final_snapshot_identifier  = "${var.name}-final"
  auto_minor_version_upgrade = true
  tags                       = var.tags

  lifecycle {
    ignore_changes = [password] # set once, from the secret; the secret is the source
  }
}

# --- etcd ------------------------------------------------------------------------------------

resource "aws_instance" "etcd" {
  count                  = 3
  ami                    = var.ami_id
  instance_type          = var.etcd_instance_type
  subnet_id              = local.etcd_subnets[count.index]
  private_ip             = local.etcd_ips[count.index]
  vpc_security_group_ids = [aws_security_group.etcd.id]
  user_data = templatefile("${path.module}/templates/etcd.sh.tftpl", {
    name    = "etcd${count.index}"
    ip      = local.etcd_ips[count.index]
    cluster = local.etcd_cluster
  })
  tags = merge(var.tags, { Name = "${var.name}-etcd${count.index}" })

  root_block_device {
    volume_size = 30
    volume_type = "gp3"
    encrypted   = true
  }

  metadata_options {
    http_tokens = "required"
  }
}

# --- replicas ----------------------------------------------------------------------------

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "secrets" {
  statement {
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [aws_secretsmanager_secret.admin_token.arn, aws_secretsmanager_secret.database.arn]
  }
  statement {
    actions   = ["kms:Encrypt", "kms:Decrypt"]
    resources = [aws_kms_key.secrets.arn]
  }
}

# The key-encryption key of every secret the control plane stores (the regions' signing keys):
# each is sealed with a data key of its own, wrapped by this key (MERIDIAN_KMS=aws-kms:...).
# One key for every replica: a secret one replica sealed, any other opens.
resource "aws_kms_key" "secrets" {
  description             = "${var.name}: Meridian's key-encryption key"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  tags                    = var.tags
}

resource "aws_iam_role" "replicas" {
  name_prefix        = "${var.name}-replicas-"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = var.tags
}

resource "aws_iam_role_policy" "secrets" {
  name   = "read-control-plane-secrets"
  role   = aws_iam_role.replicas.id
  policy = data.aws_iam_policy_document.secrets.json
}

resource "aws_iam_instance_profile" "replicas" {
  name_prefix = "${var.name}-replicas-"
  role        = aws_iam_role.replicas.name
}

resource "aws_launch_template" "replicas" {
  name_prefix   = "${var.name}-replicas-"
  image_id      = var.ami_id
  instance_type = var.replica_instance_type
  tags          = var.tags
  user_data = base64encode(templatefile("${path.module}/templates/replica.sh.tftpl", {
    aws_region         = data.aws_region.current.name
    admin_token_secret = aws_secretsmanager_secret.admin_token.arn
    database_secret    = aws_secretsmanager_secret.database.arn
    database_host      = aws_db_instance.database.address
    etcd_endpoints     = local.etcd_endpoints
    meridian_package   = var.meridian_package
    rest_port          = 8400
    grpc_port          = 8401
    kms_key            = aws_kms_key.secrets.arn
    oidc_issuer        = var.oidc_issuer == null ? "" : var.oidc_issuer
    oidc_client_id     = var.oidc_client_id == null ? "" : var.oidc_client_id
    oidc_roles         = jsonencode(var.oidc_roles)
  }))

  iam_instance_profile {
    arn = aws_iam_instance_profile.replicas.arn
  }

  vpc_security_group_ids = [aws_security_group.replicas.id]

  metadata_options {
    http_tokens = "required"
  }

  lifecycle {
    precondition {
      condition     = (var.oidc_issuer == null) == (var.oidc_client_id == null)
      error_message = "set oidc_issuer and oidc_client_id together."
    }
  }
}

resource "aws_autoscaling_group" "replicas" {
  name_prefix         = "${var.name}-replicas-"
  min_size            = var.replicas
  max_size            = var.replicas
  desired_capacity    = var.replicas
  vpc_zone_identifier = var.private_subnet_ids
  target_group_arns   = [aws_lb_target_group.api.arn, aws_lb_target_group.grpc.arn]
  health_check_type   = "ELB"

  launch_template {
    id      = aws_launch_template.replicas.id
    version = aws_launch_template.replicas.latest_version
  }

  depends_on = [aws_instance.etcd, aws_secretsmanager_secret_version.admin_token,
  aws_secretsmanager_secret_version.database]
}

# --- the load balancer -----------------------------------------------------------------------

resource "aws_lb" "control_plane" {
  name_prefix        = substr(var.name, 0, 6)
  load_balancer_type = "network"
  subnets            = var.public_subnet_ids
  security_groups    = [aws_security_group.lb.id]
  tags               = var.tags
}

resource "aws_lb_target_group" "api" {
  name_prefix = "api-"
  port        = 8400
  protocol    = "TCP"
  vpc_id      = var.vpc_id
  tags        = var.tags

  health_check {
    protocol = "HTTP"
    path     = "/readyz"
  }
}

resource "aws_lb_target_group" "grpc" {
  name_prefix = "grpc-"
  port        = 8401
  protocol    = "TCP"
  vpc_id      = var.vpc_id
  tags        = var.tags

  health_check {
    protocol = "TCP"
  }
}

resource "aws_lb_listener" "api" {
  load_balancer_arn = aws_lb.control_plane.arn
  port              = 443
  protocol          = "TLS"
  certificate_arn   = var.tls_certificate_arn
  ssl_policy        = "ELBSecurityPolicy-TLS13-1-2-2021-06"

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.api.arn
  }
}

resource "aws_lb_listener" "grpc" {
  load_balancer_arn = aws_lb.control_plane.arn
  port              = 8401
  protocol          = "TLS"
  certificate_arn   = var.tls_certificate_arn
  ssl_policy        = "ELBSecurityPolicy-TLS13-1-2-2021-06"
  alpn_policy       = "HTTP2Preferred"

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.grpc.arn
  }
}

resource "aws_route53_record" "control_plane" {
  count   = var.route53_zone_id == null ? 0 : 1
  zone_id = var.route53_zone_id
  name    = var.domain_name
  type    = "A"

  alias {
    name                   = aws_lb.control_plane.dns_name
    zone_id                = aws_lb.control_plane.zone_id
    evaluate_target_health = true
  }
}
