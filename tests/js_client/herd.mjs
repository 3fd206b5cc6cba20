// Many subscriptions of switchboard-client in one process, for the
// reconnect-storm test of tests/js_client.rs: every client's timeline
// around a server restart.
//
// argv[2]: JSON {base, count, prefix, options}: `count` clients of the ids
// `<prefix><n>`, each connect()ed with `options`.
//
// Prints {"ev":"open","count":n} once every client is open, then, once
// every client that lost its stream has opened again,
// {"ev":"reopened","clients":[{"drop","attempts":[...],"open","gaps"}]}:
// when it saw the stream end, when each reconnect attempt began, when it
// was open again (Date.now() milliseconds), and the gaps it was told of.
// Exits when stdin ends.

import { connect } from 'switchboard-client';

const { base, count, prefix, options } = JSON.parse(process.argv[2]);
const print = (ev, fields) => process.stdout.write(`${JSON.stringify({ ev, at: Date.now(), ...fields })}\n`);

const clients = [];
let open = 0;
let reopened = 0;
for (let n = 0; n < count; n++) {
  const c = { everOpen: false, drop: null, attempts: [], open: null, gaps: 0 };
  clients.push(c);
  c.sub = connect(base, `${prefix}${n}`, {
    ...options,
    onGap: () => c.gaps++,
    onState: (s) => {
      const now = Date.now();
      if (s.state === 'open' && !c.everOpen) {
        c.everOpen = true;
        if (++open === count) print('open', { count });
      } else if (s.state === 'reconnecting' && c.everOpen && c.drop === null) {
        c.drop = now;
      } else if (s.state === 'connecting' && c.drop !== null && c.open === null) {
        c.attempts.push(now);
      } else if (s.state === 'open' && c.drop !== null && c.open === null) {
        c.open = now;
        if (++reopened === count) {
          print('reopened', { clients: clients.map(({ drop, attempts, open, gaps }) => ({ drop, attempts, open, gaps })) });
        }
      }
    },
  });
}

process.stdin.resume();
process.stdin.on('end', () => {
  for (const c of clients) c.sub.close();
  process.exit(0);
});
