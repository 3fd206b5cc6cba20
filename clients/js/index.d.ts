// Type declarations of switchboard-client (index.js).

/** How a subscription reaches the server. */
export type TransportName = 'sse' | 'poll' | 'websocket';

/**
 * - `connecting`: an attempt is under way (each attempt reports it once).
 * - `open`: events flow (SSE and WebSocket: the server's welcome arrived;
 *   long-poll: once a poll is sent).
 * - `reconnecting`: the attempt failed or the stream ended; the next
 *   attempt comes after `delayMs`.
 * - `closed`: for good: `close()` was called, or the server refused in a
 *   way no retry can fix (`error` says which).
 */
export type ConnectionState = 'connecting' | 'open' | 'reconnecting' | 'closed';

/** A message published to the id (`POST /send/{id}`). */
export interface Message {
  /** The message as it was published. */
  data: string;
  /**
   * Its event id (decimal, as a string: ids are microsecond timestamps);
   * for a broadcast, the stream's position. `null` when the server gave
   * none.
   */
  eventId: string | null;
  /** The stream's own count (`Recvd msg #N`); `null` on long-poll. */
  seq: number | null;
  /** The line as the server sent it (`Recvd msg #N: '...'`). */
  raw: string;
  transport: TransportName;
}

/**
 * Messages may be missing: the server could not replay everything after
 * the resume point (its history was trimmed, or it restarted).
 */
export interface Gap {
  /** Messages after this event id may be missing. */
  after: string | null;
  /** The first event id the history resumes at; `null`: new messages follow. */
  next: string | null;
  /** The server's line (`Gap: messages after event A may be missing; ...`). */
  raw: string;
  transport: TransportName;
}

/** Another stream of the id opened (`join`) or ended (`leave`). */
export interface Presence {
  kind: 'join' | 'leave';
  /** Its token's subject, when it had one. */
  sub?: string;
  /** The node that holds it. */
  node?: string;
  raw: string;
  transport: TransportName;
}

/** What onState is told on every change. */
export interface StateChange {
  state: ConnectionState;
  /** The transport in use (after a fallback, the new one). */
  transport: TransportName;
  /** `connecting`: failed attempts since the last success. */
  attempt?: number;
  /** `connecting` after a fallback: the transport left behind. */
  fallbackFrom?: TransportName;
  /** `reconnecting`: how long until the next attempt. */
  delayMs?: number;
  /** `reconnecting`, `closed`: the HTTP status of the refusal, if any. */
  status?: number | null;
  /** `reconnecting`: the server's Retry-After, in milliseconds, if any. */
  retryAfterMs?: number | null;
  /** `reconnecting`, `closed`: what went wrong. */
  error?: Error;
  /** Why, in words. */
  reason?: string;
}

/** A refusal or failure the client acted on. */
export class SwitchboardError extends Error {
  /** The HTTP status, when one was seen. */
  status: number | null;
  /** The server's Retry-After in milliseconds, when it gave one. */
  retryAfterMs: number | null;
  /** The body of the refusal (switchboard's is `{"error": "..."}`). */
  body: string | null;
}

/** A WebSocket constructor as browsers (and Node 22+) have it. */
export type WebSocketConstructor = new (url: string) => {
  onopen: ((ev: any) => void) | null;
  onmessage: ((ev: { data: any }) => void) | null;
  onerror: ((ev: any) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  close(code?: number, reason?: string): void;
};

/** An EventSource constructor as browsers have it. */
export type EventSourceConstructor = new (
  url: string,
  init?: { withCredentials?: boolean },
) => {
  readonly readyState: number;
  onopen: ((ev: any) => void) | null;
  onerror: ((ev: any) => void) | null;
  addEventListener(type: string, listener: (ev: { data: string; lastEventId: string }) => void): void;
  close(): void;
};

export interface ConnectOptions {
  /** A subscriber token (JWT), sent as it is; a 401 then closes for good. */
  token?: string;
  /**
   * Gives a subscriber token: called before the first attempt, again
   * before the token's `exp` (see `refreshBeforeMs`), and after a 401 or
   * an expiry the server reports.
   */
  getToken?: () => string | Promise<string>;
  /**
   * The transports to use, in order: the first, and the next one when the
   * first lets no welcome through within `fallbackAfterMs`. Default
   * `['sse', 'poll']`; `['websocket']` for WebSocket.
   */
  transports?: TransportName[];
  /** A message. */
  onMessage?: (message: Message) => void;
  /** Messages may be missing (never skipped silently). */
  onGap?: (gap: Gap) => void;
  /** The connection's state changed. */
  onState?: (change: StateChange) => void;
  /** A `join` or `leave` of another stream of the id. */
  onPresence?: (presence: Presence) => void;
  /** A refusal that closes the subscription for good. */
  onError?: (error: SwitchboardError | Error) => void;
  /** getToken gave a new token before the old one expired. */
  onTokenRefresh?: (info: { expiresAt: number | null }) => void;
  /** How long a streaming attempt may go without the welcome before the next transport is used. Default 5000. */
  fallbackAfterMs?: number;
  /** The backoff's base: attempt n waits a uniform random time below min(retryMaxMs, retryBaseMs * 2^n). Default 1000. */
  retryBaseMs?: number;
  /** The backoff's cap. Default 30000. */
  retryMaxMs?: number;
  /** How long before a token's `exp` getToken is asked again (at most half of its remaining life). Default 30000. */
  refreshBeforeMs?: number;
  /** A poll that has not answered in this long is abandoned and retried. Default 40000 (the server answers within 25 s). */
  pollTimeoutMs?: number;
  /** Start after this event id (as if resuming). */
  lastEventId?: string | number | null;
  /** Learn the status of an EventSource or WebSocket failure with one fetch. Default true. */
  probe?: boolean;
  /** EventSource's withCredentials. switchboard sends no Access-Control-Allow-Credentials yet: use a token. Default false. */
  withCredentials?: boolean;
  /** The fetch to use (default: the global one). */
  fetch?: typeof fetch;
  /** The EventSource to use (default: the global one); `null`: read SSE with fetch. */
  EventSource?: EventSourceConstructor | null;
  /** The WebSocket to use (default: the global one; Node 20 has none: pass `ws`'s). */
  WebSocket?: WebSocketConstructor;
}

/** A live subscription. */
export interface Subscription {
  /** Ends it for good (reports `closed`). */
  close(): void;
  /** The state last reported; `null` before the first attempt. */
  readonly state: ConnectionState | null;
  /** The transport in use. */
  readonly transport: TransportName;
  /** The resume point: the last event id seen, or `null`. */
  readonly lastEventId: string | null;
}

/**
 * Subscribes to the stream of `id` on the switchboard at `baseUrl`
 * (`https://host:port`, or a path prefix behind a proxy) and keeps it
 * alive, resuming after every reconnect, until `close()`.
 */
export function connect(baseUrl: string | URL, id: string, options?: ConnectOptions): Subscription;
