// Signing in through the identity provider (OpenID Connect, authorization code flow with PKCE,
// RFC 7636), for app.js: the page sends the person to the provider's login with a one-time
// verifier's challenge, a state and a nonce kept in this tab; the provider sends them back
// here with a code, which the page exchanges at the provider's token endpoint (with the
// verifier) for an ID token. The ID token is then the bearer token, kept in this tab alone
// like a pasted one; the code is taken out of the address at once.
"use strict";

const SSO_PENDING = "meridian.sso.pending";

function b64url(bytes) {
  return btoa(String.fromCharCode(...new Uint8Array(bytes)))
    .replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function randomText() { return b64url(crypto.getRandomValues(new Uint8Array(32))); }

function claimsOf(jwt) {
  const part = jwt.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
  return JSON.parse(atob(part + "=".repeat((4 - (part.length % 4)) % 4)));
}

// The provider, as the control plane names it; null when it signs nobody in.
async function ssoConfig() {
  try {
    const answer = await fetch("/v1/auth/config", { cache: "no-store" });
    return answer.ok ? (await answer.json()).oidc : null;
  } catch (error) {
    return null;
  }
}

// Where the provider sends the person back (registered with it as the client's redirect URI).
function redirectUri() { return `${location.origin}/status`; }

// Off to the provider's login page.
async function ssoBegin(config) {
  const verifier = randomText();
  const challenge = b64url(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier)));
  const pending = { state: randomText(), nonce: randomText(), verifier,
    token_endpoint: config.token_endpoint, client_id: config.client_id, issuer: config.issuer };
  sessionStorage.setItem(SSO_PENDING, JSON.stringify(pending));
  const url = new URL(config.authorization_endpoint);
  url.search = new URLSearchParams({
    response_type: "code", client_id: config.client_id, redirect_uri: redirectUri(),
    scope: config.scopes.split(" ").filter((s) => s !== "offline_access").join(" "),
    state: pending.state, nonce: pending.nonce,
    code_challenge: challenge, code_challenge_method: "S256",
  }).toString();
  location.assign(url.toString());
}

// Back from the provider: the ID token, or null when this load is not a return from it.
// Throws, with the reason, when the return is not the one this tab started.
async function ssoFinish() {
  const params = new URLSearchParams(location.search);
  if (!params.has("state")) return null;
  window.history.replaceState(null, "", location.pathname); // the code leaves the address now
  const pending = JSON.parse(sessionStorage.getItem(SSO_PENDING) || "null");
  sessionStorage.removeItem(SSO_PENDING);
  if (!pending || params.get("state") !== pending.state) {
    throw new Error("the answer is not to a sign-in started here");
  }
  if (params.has("iss") && params.get("iss") !== pending.issuer) { // RFC 9207: not a mix-up
    throw new Error(`the answer came from ${params.get("iss")}, not ${pending.issuer}`);
  }
  if (params.has("error")) {
    throw new Error(params.get("error_description") || params.get("error"));
  }
  const answer = await fetch(pending.token_endpoint, {
    method: "POST",
    headers: { "Content-Type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({
      grant_type: "authorization_code", code: params.get("code") || "",
      redirect_uri: redirectUri(), client_id: pending.client_id, code_verifier: pending.verifier,
    }),
  });
  const tokens = await answer.json().catch(() => ({}));
  if (!answer.ok || !tokens.id_token) {
    throw new Error(tokens.error_description || tokens.error || `the provider answered ${answer.status}`);
  }
  if (claimsOf(tokens.id_token).nonce !== pending.nonce) {
    throw new Error("the ID token is not the one this sign-in asked for");
  }
  return tokens.id_token;
}
