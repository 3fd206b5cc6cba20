// One subscription of switchboard-client, run by tests/js_client.rs inside
// a project where the package was installed from its packed tarball (so
// `import 'switchboard-client'` is what a user gets).
//
// argv[2]: JSON {base, id, options?, token?}. `options` go to connect()
// as they are. `token`: {secret, ttlSec, firstExpired} makes a getToken
// that mints HS256 tokens for the id (the first one already expired when
// firstExpired), as an application's backend would; with `static: true`
// one such token is given as options.token instead.
//
// Prints one JSON line per callback, each with `at` (Date.now()):
// {"ev":"state"|"message"|"gap"|"presence"|"error"|"token", ...}. Closes the
// subscription and exits when stdin ends.

import { createHmac } from 'node:crypto';
import { connect } from 'switchboard-client';

const config = JSON.parse(process.argv[2]);
const print = (ev, fields) => process.stdout.write(`${JSON.stringify({ ev, at: Date.now(), ...fields })}\n`);

function mint(secret, claims) {
  const b64 = (v) => Buffer.from(JSON.stringify(v)).toString('base64url');
  const body = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64(claims)}`;
  return `${body}.${createHmac('sha256', secret).update(body).digest('base64url')}`;
}

const options = { ...config.options };
if (config.token?.static) {
  const now = Math.floor(Date.now() / 1000);
  options.token = mint(config.token.secret, { sub: config.id, exp: now + config.token.ttlSec });
} else if (config.token) {
  let calls = 0;
  const { secret, ttlSec, firstExpired } = config.token;
  options.getToken = async () => {
    calls++;
    const now = Math.floor(Date.now() / 1000);
    const exp = firstExpired && calls === 1 ? now - 60 : now + ttlSec;
    print('token', { calls, exp });
    return mint(secret, { sub: config.id, exp });
  };
}

const sub = connect(config.base, config.id, {
  ...options,
  onState: (s) =>
    print('state', {
      state: s.state,
      transport: s.transport,
      attempt: s.attempt ?? null,
      fallbackFrom: s.fallbackFrom ?? null,
      delayMs: s.delayMs ?? null,
      status: s.status ?? null,
      retryAfterMs: s.retryAfterMs ?? null,
      reason: s.reason ?? null,
    }),
  onMessage: (m) => print('message', { data: m.data, eventId: m.eventId, seq: m.seq, transport: m.transport }),
  onGap: (g) => print('gap', { after: g.after, next: g.next, raw: g.raw, transport: g.transport }),
  onPresence: (p) => print('presence', { kind: p.kind, sub: p.sub ?? null }),
  onError: (e) => print('error', { message: e.message, status: e.status ?? null }),
  onTokenRefresh: (t) => print('refreshed', { expiresAt: t.expiresAt }),
});

process.stdin.resume();
process.stdin.on('end', () => {
  sub.close();
  process.exit(0);
});
