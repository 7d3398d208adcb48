# A pool of GPU machines in one AWS region: an autoscaling group whose machines boot with the
# shared agent bootstrap, and a network load balancer that is the region's gateway.

data "aws_region" "current" {}

module "common" {
  source                  = "../pool-common"
  region                  = var.region
  control_plane           = var.control_plane
  control_plane_tls       = var.control_plane_tls
  bootstrap_token_command = "aws secretsmanager get-secret-value --region ${data.aws_region.current.name} --secret-id ${var.bootstrap_token_secret_arn} --query SecretString --output text"
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
  min_nodes               = coalesce(var.min_nodes, var.node_count)
  max_nodes               = var.max_nodes
  group                   = "${data.aws_region.current.name}/${aws_autoscaling_group.nodes.name}"
  bootstrap_token_store = {
    kind   = "aws-secretsmanager"
    region = data.aws_region.current.name
    secret = var.bootstrap_token_secret_arn
  }
}

resource "aws_security_group" "nodes" {
  name_prefix = "${var.name}-nodes-"
  description = "Meridian ${var.region} GPU nodes: the gateway port from clients and the load balancer"
  vpc_id      = var.vpc_id
  tags        = var.tags

  ingress {
    description = "the region OpenAI endpoint"
    from_port   = var.gateway_port
    to_port     = var.gateway_port
    protocol    = "tcp"
    cidr_blocks = var.client_cidrs
  }

  egress {
    description = "the control plane, package mirrors, model downloads"
    from_port   = 0
    to_port     = 0
    protocol    = "-1"
    cidr_blocks = ["0.0.0.0/0"]
  }

  lifecycle {
    create_before_destroy = true
  }
}

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "token" {
  statement {
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [var.bootstrap_token_secret_arn]
  }
}

resource "aws_iam_role" "nodes" {
  name_prefix        = "${var.name}-"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = var.tags
}

resource "aws_iam_role_policy" "token" {
  name   = "read-bootstrap-token"
  role   = aws_iam_role.nodes.id
  policy = data.aws_iam_policy_document.token.json
}

resource "aws_iam_instance_profile" "nodes" {
  name_prefix = "${var.name}-"
  role        = aws_iam_role.nodes.name
}

resource "aws_launch_template" "nodes" {
  name_prefix   = "${var.name}-"
  image_id      = var.ami_id
  instance_type = var.instance_type
  user_data     = base64encode(module.common.cloud_init)
  tags          = var.tags

  iam_instance_profile {
    arn = aws_iam_instance_profile.nodes.arn
  }

  vpc_security_group_ids = [aws_security_group.nodes.id]

  block_device_mappings {
    device_name = "/dev/sda1"
    ebs {
      volume_size           = var.root_volume_gb
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  metadata_options {
    http_tokens = "required" # IMDSv2 only
  }

  dynamic "instance_market_options" {
    for_each = var.spot ? [1] : []
    content {
      market_type = "spot"
    }
  }

  tag_specifications {
    resource_type = "instance"
    tags          = merge(var.tags, { "meridian:region" = var.region, "meridian:gpus" = tostring(var.gpus_per_node) })
  }
}

resource "aws_lb" "gateway" {
  name_prefix        = substr(var.name, 0, 6)
  load_balancer_type = "network"
  internal           = false
  subnets            = var.subnet_ids
  security_groups    = [aws_security_group.nodes.id]
  tags               = var.tags
}

resource "aws_lb_target_group" "gateway" {
  name_prefix = substr(var.name, 0, 6)
  port        = var.gateway_port
  protocol    = "TCP"
  vpc_id      = var.vpc_id
  tags        = var.tags

  health_check {
    protocol = "HTTP"
    path     = "/healthz"
    port     = "traffic-port"
  }
}

resource "aws_lb_listener" "gateway" {
  load_balancer_arn = aws_lb.gateway.arn
  port              = var.gateway_port
  protocol          = "TCP"

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.gateway.arn
  }
}

resource "aws_autoscaling_group" "nodes" {
  name_prefix         = "${var.name}-"
  min_size            = coalesce(var.min_nodes, var.node_count)
  max_size            = coalesce(var.max_nodes, var.node_count)
  desired_capacity    = var.node_count
  vpc_zone_identifier = var.subnet_ids
  target_group_arns   = [aws_lb_target_group.gateway.arn]
  health_check_type   = "ELB"

  launch_template {
    id      = aws_launch_template.nodes.id
    version = aws_launch_template.nodes.latest_version
  }

  tag {
    key                 = "meridian:region"
    value               = var.region
    propagate_at_launch = true
  }

  lifecycle {
    # Meridian's capacity planner sets the desired count (its AWS provider); a later plan
    # must not set it back
    ignore_changes = [desired_capacity]
  }
}
