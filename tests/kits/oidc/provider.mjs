// The OpenID Connect provider the tests log in through: panva's oidc-provider (a certified
// OpenID provider, from npm), with real signed tokens and real discovery documents. Started by
// tests/kits/oidc.py as `node provider.mjs` from the directory its packages are installed in,
// configured by one JSON document in OIDC_CONFIG:
//   {"port": 0, "client_id": "...", "redirect_uris": [...], "accounts": {"alice": {"groups": [...]}}}
// The login page is the library's development one: any password; the login names an account.
// Prints `listening <issuer>` once it serves.
import { generateKeyPair, exportJWK } from 'jose';
import Provider from 'oidc-provider';

const config = JSON.parse(process.env.OIDC_CONFIG);
const { privateKey } = await generateKeyPair('RS256', { extractable: true });
const jwk = { ...(await exportJWK(privateKey)), kid: 'test-1', alg: 'RS256', use: 'sig' };

function account(id) {
  const known = config.accounts[id];
  if (!known) return undefined;
  return {
    accountId: id,
    claims: async () => ({
      sub: id,
      email: `${id}@example.test`,
      preferred_username: id,
      groups: known.groups,
    }),
  };
}

function start(port) {
  const issuer = `http://127.0.0.1:${port}`;
  const provider = new Provider(issuer, {
    clients: [{
      client_id: config.client_id,
      token_endpoint_auth_method: 'none', // a public client: the CLI and the page, with PKCE
      redirect_uris: config.redirect_uris,
      grant_types: ['authorization_code', 'refresh_token',
        'urn:ietf:params:oauth:grant-type:device_code'],
      response_types: ['code'],
    }],
    jwks: { keys: [jwk] },
    cookies: { keys: ['meridian-tests-cookie-key'] },
    findAccount: async (ctx, id) => account(id),
    claims: {
      openid: ['sub'],
      email: ['email'],
      profile: ['preferred_username'],
      groups: ['groups'],
    },
    scopes: ['openid', 'offline_access', 'email', 'profile', 'groups'],
    conformIdTokenClaims: false, // the ID token carries the scopes' claims (groups)
    features: {
      devInteractions: { enabled: true },
      deviceFlow: { enabled: true },
      revocation: { enabled: true },
    },
    ttl: { IdToken: config.id_token_ttl_s ?? 3600, DeviceCode: 600 },
    // A first-party client: what it asks for is granted without a consent page.
    loadExistingGrant: async (ctx) => {
      const grantId = ctx.oidc.result?.consent?.grantId
        || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
      if (grantId) return ctx.oidc.provider.Grant.find(grantId);
      const grant = new ctx.oidc.provider.Grant({
        clientId: ctx.oidc.client.clientId,
        accountId: ctx.oidc.session.accountId,
      });
      grant.addOIDCScope([...ctx.oidc.requestParamScopes].join(' '));
      await grant.save();
      return grant;
    },
  });
  provider.proxy = false;
  return provider;
}

// Port 0: the provider must know its issuer (its port) before it listens, so ask for a free
// port first.
import { createServer } from 'node:net';
async function freePort() {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
}

const port = config.port || await freePort();
const provider = start(port);
const server = provider.listen(port, '127.0.0.1', () => {
  console.log(`listening ${provider.issuer}`);
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
