// A user's TypeScript, type-checked by tests/js_client.rs (tsc --strict)
// against the declarations installed from the packed tarball.
import { connect, SwitchboardError } from 'switchboard-client';
import type { ConnectOptions, Gap, Message, StateChange, Subscription, TransportName } from 'switchboard-client';

const seen: string[] = [];
const options: ConnectOptions = {
  getToken: async () => 'header.payload.signature',
  transports: ['sse', 'poll'],
  fallbackAfterMs: 3000,
  retryBaseMs: 500,
  retryMaxMs: 20000,
  onMessage: (m: Message) => {
    const id: string | null = m.eventId;
    seen.push(`${id ?? '-'} ${m.data}`);
  },
  onGap: (g: Gap) => {
    const after: string | null = g.after;
    const next: string | null = g.next;
    seen.push(`gap after ${after} until ${next ?? 'now'}`);
  },
  onState: (s: StateChange) => {
    const t: TransportName = s.transport;
    if (s.state === 'reconnecting') seen.push(`retry in ${s.delayMs} ms over ${t}`);
  },
  onError: (e) => {
    if (e instanceof SwitchboardError && e.status === 401) seen.push('refused');
  },
};

const sub: Subscription = connect(new URL('https://example.test'), 'room:1', options);
const where: TransportName = sub.transport;
const last: string | null = sub.lastEventId;
connect('https://example.test/sb', 'ws-only', { token: 'a.b.c', transports: ['websocket'] }).close();
sub.close();
export { where, last };
