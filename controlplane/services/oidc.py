"""People signing in through the organisation's OpenID Connect provider.

The CLI (device authorization flow) and the status page (authorization code flow with PKCE)
get an ID token from the provider and send it as the bearer token; this module checks it: its
signature against the provider's published keys (JWKS, fetched from its discovery document
and cached; fetched again when a token names a key not yet seen, at most every
`REFETCH_S`), its issuer, audience and lifetime. The person's role comes from their groups
(`oidc_roles`: group -> role); the highest wins, and a person whose groups map to nothing
gets no access. Nothing is stored per person: the provider is the record of who may sign in,
and a token stops working when it expires (the provider's ID token lifetime bounds how long a
removed person keeps access).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

import httpx
import jwt

from controlplane.domain import Role, RoleGrant
from controlplane.errors import Forbidden, MeridianError, Unauthenticated
from controlplane.settings import Settings

DISCOVERY_TTL_S = 3600.0
REFETCH_S = 10.0  # a token naming an unknown key fetches the keys again at most this often
RETRY_S = 5.0  # discovery that failed is tried again no sooner (callers are told at once)
LEEWAY_S = 30  # clocks' disagreement allowed on exp, nbf and iat
ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA"]
PREFIX = "oidc:"  # names of people in the audit log: oidc:<email>


class ProviderUnavailable(MeridianError):
    code = "identity_provider_unavailable"
    status = 503
    title = "The identity provider cannot be reached"


class NoRole(Forbidden):
    code = "no_role"
    title = "No role"


def grant_for(groups: Iterable[str], roles: dict[str, RoleGrant]) -> RoleGrant | None:
    """The highest role the groups map to; a tenant admin only when no global role applies,
    and of one tenant only (groups naming two tenants grant neither)."""
    grants = [roles[group] for group in groups if group in roles]
    global_ = [grant for grant in grants if grant.tenant is None]
    if global_:
        return max(global_, key=lambda grant: grant.role.rank)
    tenants = {grant.tenant for grant in grants}
    if len(tenants) > 1:
        raise NoRole(
            f"your groups make you a tenant admin of {len(tenants)} tenants "
            f"({', '.join(sorted(t or '' for t in tenants))}); a person may administer one",
        )
    return grants[0] if grants else None


def _claim(claims: dict[str, Any], path: str) -> Any:
    value: Any = claims
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def groups_of(claims: dict[str, Any], path: str) -> list[str]:
    """The groups in the claim at `path`: a list, or one space-separated string."""
    value = _claim(claims, path)
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        return [str(item) for item in value]
    return []


class OidcVerifier:
    """Checks the provider's tokens; one per control-plane process."""

    def __init__(self, settings: Settings, http: httpx.AsyncClient | None = None) -> None:
        if settings.oidc_issuer is None or settings.oidc_client_id is None:
            raise ValueError("an OIDC verifier needs oidc_issuer and oidc_client_id")
        self.issuer = settings.oidc_issuer
        self.client_id = settings.oidc_client_id
        self.audience = settings.oidc_audience or settings.oidc_client_id
        self.scopes = settings.oidc_scopes
        self._groups_claim = settings.oidc_groups_claim
        self._name_claim = settings.oidc_name_claim
        self._roles = {group: RoleGrant.parse(text) for group, text in settings.oidc_roles.items()}
        self._http = http or httpx.AsyncClient(timeout=10)
        self._metadata: dict[str, Any] | None = None
        self._metadata_at = 0.0
        self._keys: dict[str, jwt.PyJWK] = {}
        self._keys_at = -REFETCH_S
        self._lock = asyncio.Lock()
        self._failure: tuple[float, str] | None = None  # when discovery last failed, and why

    async def metadata(self) -> dict[str, Any]:
        """The provider's discovery document (cached for an hour)."""
        if self._metadata is None or time.monotonic() - self._metadata_at > DISCOVERY_TTL_S:
            if self._failure is not None and time.monotonic() - self._failure[0] < RETRY_S:
                raise ProviderUnavailable(self._failure[1])  # asked again soon: not yet
            url = f"{self.issuer.rstrip('/')}/.well-known/openid-configuration"
            try:
                document = await self._get(url)
            except ProviderUnavailable as error:
                self._failure = (time.monotonic(), error.detail)
                raise
            if document.get("issuer") != self.issuer:
                raise ProviderUnavailable(
                    f"{url} names the issuer {document.get('issuer')!r}, not {self.issuer!r}"
                )
            self._metadata, self._metadata_at = document, time.monotonic()
        return self._metadata

    async def public(self) -> dict[str, Any]:
        """What a client needs to sign a person in (`GET /v1/auth/config`)."""
        metadata = await self.metadata()
        return {
            "issuer": self.issuer,
            "client_id": self.client_id,
            "scopes": self.scopes,
            "authorization_endpoint": metadata.get("authorization_endpoint"),
            "token_endpoint": metadata.get("token_endpoint"),
            "device_authorization_endpoint": metadata.get("device_authorization_endpoint"),
        }

    async def principal(self, token: str) -> tuple[str, RoleGrant]:
        """The person a token names and the role their groups grant; 401 when the token is
        not one of the provider's, or has expired; 403 when no group maps to a role."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"the token is not valid: {exc}") from exc
        algorithm, kid = header.get("alg"), header.get("kid")
        if algorithm not in ALGORITHMS:
            raise Unauthenticated(f"the token is signed with {algorithm!r}, which is not taken")
        key = await self._key(kid if isinstance(kid, str) else None)
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                audience=self.audience,
                issuer=self.issuer,
                leeway=LEEWAY_S,
                options={"require": ["exp", "iat", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError as exc:
            raise Unauthenticated("the sign-in has expired: sign in again") from exc
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"the token is not valid: {exc}") from exc
        name = PREFIX + str(claims.get(self._name_claim) or claims["sub"])
        grant = grant_for(groups_of(claims, self._groups_claim), self._roles)
        if grant is None:
            raise NoRole(
                f"{name} is signed in, but none of their groups maps to a role "
                "(MERIDIAN_OIDC_ROLES)",
                needed=str(Role.VIEWER),
            )
        return name, grant

    async def _key(self, kid: str | None) -> jwt.PyJWK:
        found = self._pick(kid)
        if found is not None:
            return found
        async with self._lock:
            found = self._pick(kid)
            if found is None and time.monotonic() - self._keys_at >= REFETCH_S:
                metadata = await self.metadata()
                url = str(metadata.get("jwks_uri"))
                document = await self._get(url)
                try:
                    keys = jwt.PyJWKSet.from_dict(document).keys
                except jwt.PyJWTError as exc:
                    raise ProviderUnavailable(f"{url}: no key taken: {exc}") from exc
                self._keys = {str(k.key_id or i): k for i, k in enumerate(keys)}
                self._keys_at = time.monotonic()
                found = self._pick(kid)
        if found is None:
            raise Unauthenticated("the token is signed by a key the identity provider does not "
                                  "publish")  # fmt: skip
        return found

    def _pick(self, kid: str | None) -> jwt.PyJWK | None:
        if kid is not None:
            return self._keys.get(kid)
        return next(iter(self._keys.values())) if len(self._keys) == 1 else None

    async def _get(self, url: str) -> dict[str, Any]:
        try:
            response = await self._http.get(url, headers={"Accept": "application/json"})
            response.raise_for_status()
            document = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise ProviderUnavailable(f"{url}: {exc}") from exc
        if not isinstance(document, dict):
            raise ProviderUnavailable(f"{url} answered no JSON object")
        return document

    async def aclose(self) -> None:
        await self._http.aclose()
