"""Every row class, imported in one place so that the metadata is complete."""

from controlplane.db.access_rows import ApiKeyRow, BootstrapTokenRow, PrincipalRow, TenantRow
from controlplane.db.agent_rows import (
    AgentRow,
    NodeTelemetryRow,
    RegionLoadRow,
    TelemetrySampleRow,
)
from controlplane.db.audit_rows import AuditEventRow, ConfigRevisionRow
from controlplane.db.base import Base, NamedRow
from controlplane.db.batch_rows import BatchLineRow, BatchRow, BatchSignerRow, FileRow
from controlplane.db.fleet_rows import (
    CloudRow,
    DeploymentRow,
    FallbackPeerRow,
    FallbackRuleRow,
    ModelRow,
    NodeRow,
    RegionRow,
    RoutingPolicyRow,
)
from controlplane.db.key_rows import SigningKeyRow
from controlplane.db.planner_rows import EnginePlanRow, PlannerStateRow
from controlplane.db.quota_rows import QuotaDemandRow, QuotaLeaseRow
from controlplane.db.rollout_rows import HoldingRow, IntentRow, RolloutPolicyRow, RolloutRow
from controlplane.db.usage_rows import UsageQuarterRow, UsageRecordRow

__all__ = [
    "AgentRow",
    "ApiKeyRow",
    "AuditEventRow",
    "Base",
    "BatchLineRow",
    "BatchRow",
    "BatchSignerRow",
    "BootstrapTokenRow",
    "CloudRow",
    "ConfigRevisionRow",
    "DeploymentRow",
    "EnginePlanRow",
    "FallbackPeerRow",
    "FallbackRuleRow",
    "FileRow",
    "HoldingRow",
    "IntentRow",
    "ModelRow",
    "NamedRow",
    "NodeRow",
    "NodeTelemetryRow",
    "PlannerStateRow",
    "PrincipalRow",
    "QuotaDemandRow",
    "QuotaLeaseRow",
    "RegionLoadRow",
    "RegionRow",
    "RolloutPolicyRow",
    "RolloutRow",
    "RoutingPolicyRow",
    "SigningKeyRow",
    "TelemetrySampleRow",
    "TenantRow",
    "UsageQuarterRow",
    "UsageRecordRow",
]
