"""Preemption notices: a spot machine's cloud says it is taking the machine back, a little
before it does. The agent polls where its cloud says so (`preemption_notices`), and on the
first notice drains every engine here at once: no new request goes to them, and those they
run finish, or, cut at the end, are carried on by another engine (migration). It reports the
notice in its heartbeats, and the control plane takes the node out of placement, so the
region's engines are placed elsewhere and the planner replaces the capacity. Escalation
covers the gap meanwhile. It works with the control plane away: the drain is the agent's.

Where each cloud says it (polled every `preemption_poll_s`):
- aws: `GET /latest/meta-data/spot/instance-action` (IMDSv2, after `PUT /latest/api/token`):
  404 until a notice, then `{"action": "terminate"|"stop"|"hibernate", "time": ISO 8601}`;
  about two minutes ahead;
- gcp: `GET /computeMetadata/v1/instance/preempted` (`Metadata-Flavor: Google`): `TRUE` once
  preempted; about 30 s ahead;
- azure: `GET /metadata/scheduledevents?api-version=2020-07-01` (`Metadata: true`): an event
  of type `Preempt`, with its `NotBefore`;
- a URL (http or https): Meridian's own shape, `{"time": ISO 8601}` with 200 while a notice
  stands, 404 otherwise (for a source of your own, and for the tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aiohttp

log = logging.getLogger(__name__)

# where each cloud's metadata service answers, on its machines
METADATA = {"aws": "http://169.254.169.254", "gcp": "http://metadata.google.internal",
            "azure": "http://169.254.169.254"}  # fmt: skip
TIMEOUT_S = 2.0
GCP_AHEAD_S = 30.0  # GCP says only that it is preempted: it stops the machine within 30 s


@dataclass(frozen=True)
class Notice:
    source: str
    deadline: float  # when the machine is taken back, in seconds since the epoch


class PreemptionWatch:
    def __init__(
        self,
        source: str,
        poll_s: float,
        on_notice: Callable[[Notice], None],
        clock: Callable[[], float] = time.time,
        metadata: dict[str, str] | None = None,
    ) -> None:
        self.source = source
        self.metadata = metadata or METADATA
        self.poll_s = poll_s
        self.on_notice = on_notice
        self.clock = clock
        self.notice: Notice | None = None

    async def run(self) -> None:
        """Until cancelled; after the first notice, nothing more is read (it stands)."""
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                if self.notice is None:
                    with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError,
                                             KeyError):  # fmt: skip
                        notice = await self.read(http)
                        if notice is not None:
                            self.notice = notice
                            log.warning("preemption notice (%s): the machine goes in %.0f s; "
                                        "draining every engine here", notice.source,
                                        notice.deadline - self.clock())  # fmt: skip
                            self.on_notice(notice)
                await asyncio.sleep(self.poll_s)

    async def read(self, http: aiohttp.ClientSession) -> Notice | None:
        base = self.metadata.get(self.source, "")
        if self.source == "aws":
            return await _aws(http, base)
        if self.source == "gcp":
            url = f"{base}/computeMetadata/v1/instance/preempted"
            async with http.get(url, headers={"Metadata-Flavor": "Google"}) as answer:
                said = (await answer.text()).strip().upper() if answer.status == 200 else ""
            return Notice("gcp", self.clock() + GCP_AHEAD_S) if said == "TRUE" else None
        if self.source == "azure":
            url = f"{base}/metadata/scheduledevents?api-version=2020-07-01"
            async with http.get(url, headers={"Metadata": "true"}) as answer:
                doc = await answer.json(content_type=None) if answer.status == 200 else {}
            return _azure(doc, self.clock())
        async with http.get(self.source) as answer:  # a URL of Meridian's own shape
            if answer.status != 200:
                return None
            doc = await answer.json(content_type=None)
        return Notice(self.source, _iso(str(doc["time"])))


async def _aws(http: aiohttp.ClientSession, base: str) -> Notice | None:
    ttl = {"X-aws-ec2-metadata-token-ttl-seconds": "300"}
    async with http.put(f"{base}/latest/api/token", headers=ttl) as answer:
        token = await answer.text()
    headers = {"X-aws-ec2-metadata-token": token}
    async with http.get(f"{base}/latest/meta-data/spot/instance-action", headers=headers) as answer:
        if answer.status != 200:
            return None
        doc = await answer.json(content_type=None)
    return Notice("aws", _iso(str(doc["time"])))


def _azure(doc: dict[str, Any], now: float) -> Notice | None:
    for event in doc.get("Events", []):
        if event.get("EventType") == "Preempt":
            when = event.get("NotBefore") or ""
            parsed = email.utils.parsedate_to_datetime(when) if when else None
            return Notice("azure", parsed.timestamp() if parsed else now)
    return None


def _iso(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
