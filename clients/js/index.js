// switchboard-client: the official JavaScript client of switchboard's
// streams. One call, `connect(baseUrl, id, options)`, keeps a subscription
// alive: it picks a transport (server-sent events first, long-poll when a
// buffering proxy holds the events back, WebSocket on request), resumes
// from the last event id on every reconnect, surfaces gaps, backs off with
// full jitter, honours Retry-After and refreshes subscriber tokens before
// they expire. No dependencies: browsers and Node.js 18+ (global fetch).
//
// The wire protocol it speaks is described in switchboard's docs/api.md and
// docs/browsers.md.

const TRANSPORTS = ['sse', 'poll', 'websocket'];
const EVENT_KINDS = ['welcome', 'tick', 'message', 'gap', 'end', 'join', 'leave'];
const ID_CHARS = /^[A-Za-z0-9._~:-]+$/;
const MAX_TIMER_MS = 2 ** 31 - 1;

const DEFAULTS = {
  transports: ['sse', 'poll'],
  fallbackAfterMs: 5000,
  retryBaseMs: 1000,
  retryMaxMs: 30000,
  refreshBeforeMs: 30000,
  pollTimeoutMs: 40000,
  probe: true,
  withCredentials: false,
};

/** An HTTP refusal (or another failure) the client acted on. */
export class SwitchboardError extends Error {
  constructor(message, { status = null, retryAfterMs = null, body = null, cause } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = 'SwitchboardError';
    /** The HTTP status, when one was seen. */
    this.status = status;
    /** The server's Retry-After, in milliseconds, when it gave one. */
    this.retryAfterMs = retryAfterMs;
    /** The body of the refusal (switchboard answers `{"error": "..."}`). */
    this.body = body;
  }
}

/**
 * Subscribes to the stream of `id` on the switchboard server at `baseUrl`
 * and keeps the subscription alive until `close()`.
 */
/** How much sooner than pollTimeoutMs a poll asks the server to answer. */
const POLL_MARGIN_MS = 10000;

export function connect(baseUrl, id, options = {}) {
  return new Subscription(baseUrl, id, options);
}

class Subscription {
  constructor(baseUrl, id, options) {
    if (typeof id !== 'string' || !ID_CHARS.test(id)) {
      throw new TypeError(`switchboard-client: bad id ${JSON.stringify(id)} (A-Za-z0-9._~-: only)`);
    }
    const o = { ...DEFAULTS, ...options };
    const transports = [...(o.transports || DEFAULTS.transports)];
    if (transports.length === 0 || transports.some((t) => !TRANSPORTS.includes(t))) {
      throw new TypeError(`switchboard-client: transports must be some of ${TRANSPORTS.join(', ')}`);
    }
    if (o.token != null && o.getToken != null) {
      throw new TypeError('switchboard-client: give token or getToken, not both');
    }
    this._o = o;
    this._base = String(baseUrl).replace(/\/+$/, '');
    this._id = id;
    this._transports = transports;
    this._index = 0; // which of `transports` is in use; only ever moves on
    this._fetch = o.fetch || globalThis.fetch?.bind(globalThis);
    this._EventSource = 'EventSource' in o ? o.EventSource : globalThis.EventSource;
    this._WebSocket = o.WebSocket || globalThis.WebSocket;
    this._lastEventId = o.lastEventId != null ? String(o.lastEventId) : null;
    this._token = o.token ?? null;
    this._tokenStale = false; // getToken must be asked before the next attempt
    this._attempt = 0; // failed attempts since the last success (for the backoff)
    this._authRetried = false; // a 401 since the last success was already retried at once
    this._state = null;
    this._gen = 0; // the attempt in progress; callbacks of older ones are ignored
    this._conn = null;
    this._timer = null; // reconnect or fallback wait
    this._fallbackTimer = null;
    this._refreshTimer = null;
    this._closed = false;
    this._why = null; // what the next 'connecting' report says led to it
    this._gapAfter = null; // the `after` of the last gap told
    for (const t of transports) {
      if (t === 'websocket' && !this._WebSocket) {
        throw new TypeError('switchboard-client: no WebSocket here: pass options.WebSocket');
      }
      if ((t === 'poll' || (t === 'sse' && !this._EventSource)) && !this._fetch) {
        throw new TypeError('switchboard-client: no fetch here: pass options.fetch');
      }
    }
    // Start after connect() returned, so callbacks can use the handle.
    Promise.resolve().then(() => this._attemptNow());
  }

  /** The state last reported to onState. */
  get state() {
    return this._state;
  }

  /** The transport in use: 'sse', 'poll' or 'websocket'. */
  get transport() {
    return this._transports[this._index];
  }

  /** The last event id seen (the resume point), or null. */
  get lastEventId() {
    return this._lastEventId;
  }

  /** Ends the subscription for good. */
  close() {
    if (this._closed) return;
    this._stopAttempt();
    clearTimeout(this._refreshTimer);
    this._closed = true;
    this._report('closed', { reason: 'closed by the application' });
  }

  // --- the attempt cycle ---------------------------------------------------

  _stopAttempt() {
    this._gen++;
    clearTimeout(this._timer);
    clearTimeout(this._fallbackTimer);
    this._timer = this._fallbackTimer = null;
    const conn = this._conn;
    this._conn = null;
    if (conn) conn.close();
  }

  async _attemptNow() {
    if (this._closed) return;
    this._stopAttempt();
    const gen = this._gen;
    const transport = this.transport;
    this._report('connecting', { attempt: this._attempt, ...this._why });
    this._why = null;
    let token;
    try {
      token = await this._currentToken();
    } catch (error) {
      if (gen !== this._gen) return;
      this._failed(gen, { error: new SwitchboardError('getToken failed', { cause: error }) });
      return;
    }
    if (gen !== this._gen) return;
    if (this._lastEventId == null && transport !== 'poll' && this._transports.slice(this._index + 1).includes('poll')) {
      // Where the id stands now, asked with a poll that answers at once
      // (a whole response passes any buffering proxy). The stream resumes
      // from it, and so does long-poll if the stream's welcome never comes
      // and the client falls back: nothing published since connect() is
      // lost in the fallback. A failed ask changes nothing: the stream's
      // own attempt then meets (and reports) what is wrong.
      const anchor = await this._anchor(token);
      if (gen !== this._gen) return;
      if (anchor != null && this._lastEventId == null) this._lastEventId = anchor;
    }
    const sink = this._sink(gen);
    if (transport === 'poll') {
      this._conn = this._poll(gen, sink);
    } else if (transport === 'websocket') {
      this._conn = openWebSocket(this._WebSocket, this._streamUrl(token, true).replace(/^http/, 'ws'), sink);
    } else if (this._EventSource) {
      this._conn = openEventSource(this._EventSource, this._streamUrl(token, false), this._o.withCredentials, sink);
    } else {
      this._conn = openFetchSse(this._fetch, this._streamUrl(null, false), this._headers(token, 'text/event-stream'), sink);
    }
    // A proxy that buffers the stream lets nothing through, the welcome
    // included: past fallbackAfterMs without it, move to the next
    // transport (long-poll) for the rest of this handle's life.
    if (transport !== 'poll' && this._index + 1 < this._transports.length) {
      this._fallbackTimer = setTimeout(() => {
        if (gen !== this._gen || this._closed) return;
        this._index++;
        this._why = { fallbackFrom: transport, reason: `no welcome within ${this._o.fallbackAfterMs} ms` };
        this._attemptNow();
      }, this._o.fallbackAfterMs);
    }
  }

  /** What a transport reports to. */
  _sink(gen) {
    const live = () => gen === this._gen && !this._closed;
    return {
      event: (kind, data, eventId) => live() && this._event(gen, kind, data, eventId),
      open: () => live() && this._opened(),
      // A long-poll is 'open' while its request waits; only an answer
      // resets the backoff.
      polling: () => live() && this._state !== 'open' && this._report('open', {}),
      fail: (failure) => live() && this._failed(gen, failure),
    };
  }

  _opened() {
    clearTimeout(this._fallbackTimer);
    this._fallbackTimer = null;
    this._attempt = 0;
    this._authRetried = false;
    if (this._state !== 'open') this._report('open', {});
  }

  /** One event of the stream (SSE, WebSocket, or a poll answer's parts). */
  _event(gen, kind, data, eventId) {
    if (eventId != null && eventId !== '') this._lastEventId = String(eventId);
    const transport = this.transport;
    switch (kind) {
      case 'welcome':
        this._opened();
        break;
      case 'message': {
        const m = parseMessage(data);
        this._call('onMessage', { data: m.data, eventId: eventId ?? null, seq: m.seq, raw: data, transport });
        break;
      }
      case 'gap': {
        const g = parseGap(data);
        this._gap({ after: g.after, next: g.next, raw: data, transport });
        break;
      }
      case 'join':
      case 'leave': {
        let detail = {};
        try {
          detail = JSON.parse(data);
        } catch {
          // Not JSON: only `raw` then.
        }
        this._call('onPresence', { ...detail, kind, raw: data, transport });
        break;
      }
      case 'end':
        // The server ends a stream whose token expired: a new token, and
        // a resume from where it stopped.
        this._failed(gen, { auth: true, error: new SwitchboardError(`the server ended the stream: ${data}`) });
        break;
      default:
        break; // ticks: the position is all they carry
    }
  }

  /**
   * Tells onGap, once per hole: a resume from the same point (a reconnect
   * before any message came) is told of the same gap again by the server.
   */
  _gap(gap) {
    if (gap.after != null && gap.after === this._gapAfter) return;
    this._gapAfter = gap.after;
    this._call('onGap', gap);
  }

  /**
   * An attempt failed or a stream ended: reconnect after a delay, or give
   * up on refusals no retry can fix. A failure of EventSource or
   * WebSocket before it opened hides its status: one fetch of the same URL
   * (aborted once its head arrives) learns it first.
   */
  _failed(gen, failure) {
    if (gen !== this._gen || this._closed) return;
    this._stopAttempt();
    if (failure.probeUrl && this._o.probe) {
      const waiting = this._gen;
      this._probe(failure.probeUrl).then((seen) => {
        if (waiting !== this._gen || this._closed) return;
        this._retry(seen.status != null ? seen : failure);
      });
      return;
    }
    this._retry(failure);
  }

  _retry({ status = null, retryAfterMs = null, body = null, auth = false, error = null, reason = null }) {
    if (status === 401) auth = true;
    const why = error || new SwitchboardError(status ? `HTTP ${status}` : 'connection failed', { status, retryAfterMs, body });
    if (status != null && status !== 401 && status !== 408 && status !== 429 && status < 500) {
      this._fatal(why);
      return;
    }
    if (auth) {
      if (!this._o.getToken) {
        this._fatal(why);
        return;
      }
      this._tokenStale = true;
    }
    let delayMs;
    if (auth && !this._authRetried && retryAfterMs == null) {
      // A token that expired or was refused: a fresh one at once, once;
      // a second refusal in a row backs off like any failure.
      this._authRetried = true;
      delayMs = 0;
    } else {
      delayMs = this._backoff(retryAfterMs);
    }
    this._report('reconnecting', { delayMs, status, retryAfterMs, error: why, reason: reason ?? why.message });
    this._timer = setTimeout(() => this._attemptNow(), delayMs);
  }

  _fatal(error) {
    this._stopAttempt();
    clearTimeout(this._refreshTimer);
    this._closed = true;
    this._call('onError', error);
    this._report('closed', { error, status: error.status ?? null });
  }

  /**
   * Full jitter: a uniform delay in [0, min(cap, base * 2^attempt)), and
   * never less than the server's Retry-After when it gave one.
   */
  _backoff(retryAfterMs) {
    const ceiling = Math.min(this._o.retryMaxMs, this._o.retryBaseMs * 2 ** Math.min(this._attempt, 30));
    this._attempt++;
    const jitter = Math.random() * ceiling;
    return Math.round(retryAfterMs != null ? retryAfterMs + jitter : jitter);
  }

  /** One fetch of a stream URL to learn why it was refused. */
  async _probe(url) {
    if (!this._fetch) return {};
    const ac = new AbortController();
    const timer = setTimeout(() => ac.abort(), 10000);
    try {
      const res = await this._fetch(url, { headers: { Accept: 'text/event-stream' }, signal: ac.signal, cache: 'no-store' });
      if (res.ok) return {};
      return await failureOf(res);
    } catch (error) {
      return { error };
    } finally {
      clearTimeout(timer);
      ac.abort();
    }
  }

  // --- long-poll ----------------------------------------------------------

  _poll(gen, sink) {
    const ac = new AbortController();
    const live = () => gen === this._gen && !this._closed;
    (async () => {
      let first = true;
      while (live()) {
        const since = this._lastEventId;
        // The server answers within `wait` (or its own, shorter,
        // stream.poll_timeout_ms), well before this client gives up on
        // the request (pollTimeoutMs), whatever the server is set to.
        const total = this._o.pollTimeoutMs;
        const wait = Math.max(1000, Math.round(total - Math.min(POLL_MARGIN_MS, total / 2)));
        const url = `${this._base}/test/${this._id}?transport=poll&wait=${wait}${since != null ? `&since=${since}` : ''}`;
        const timer = setTimeout(() => ac.abort(new Error('poll timed out')), this._o.pollTimeoutMs);
        let res;
        let answer;
        try {
          const poll = this._fetch(url, { headers: this._headers(this._token, 'application/json'), signal: ac.signal, cache: 'no-store' });
          if (first) {
            // Polling has begun: the long-poll is "open" while a request
            // waits (a refusal moves it on to 'reconnecting').
            first = false;
            sink.polling();
          }
          res = await poll;
          if (!res.ok) {
            sink.fail(await failureOf(res));
            return;
          }
          answer = await res.json();
        } catch (error) {
          sink.fail({ error });
          return;
        } finally {
          clearTimeout(timer);
        }
        if (!live()) return;
        this._attempt = 0;
        this._authRetried = false;
        const messages = Array.isArray(answer.messages) ? answer.messages : [];
        if (answer.gap) {
          const next = messages.length && messages[0].event_id != null ? String(messages[0].event_id) : null;
          const raw = `Gap: messages after event ${since} may be missing; ${next != null ? `history resumes at event ${next}` : 'new messages follow'}`;
          this._gap({ after: since, next, raw, transport: 'poll' });
        }
        for (const m of messages) {
          if (!live()) return;
          const eventId = m.event_id != null ? String(m.event_id) : null;
          if (eventId != null) this._lastEventId = eventId;
          this._call('onMessage', { data: m.data, eventId, seq: null, raw: m.data, transport: 'poll' });
        }
        if (answer.last_event_id != null) this._lastEventId = String(answer.last_event_id);
      }
    })().catch((error) => sink.fail({ error }));
    return { close: () => ac.abort() };
  }

  /** The id's current event id (`?transport=poll&wait=0`), or null. */
  async _anchor(token) {
    const ac = new AbortController();
    const timer = setTimeout(() => ac.abort(), this._o.fallbackAfterMs);
    try {
      const url = `${this._base}/test/${this._id}?transport=poll&wait=0`;
      const res = await this._fetch(url, { headers: this._headers(token, 'application/json'), signal: ac.signal, cache: 'no-store' });
      if (!res.ok) return null;
      const answer = await res.json();
      return answer.last_event_id != null ? String(answer.last_event_id) : null;
    } catch {
      return null;
    } finally {
      clearTimeout(timer);
    }
  }

  // --- tokens -------------------------------------------------------------

  async _currentToken() {
    const getToken = this._o.getToken;
    if (!getToken) return this._token;
    const exp = this._token && jwtExpiry(this._token);
    const fresh = this._token && !this._tokenStale && (exp == null || exp - Date.now() > 1000);
    if (!fresh) {
      const token = await getToken();
      if (typeof token !== 'string' || token === '') throw new TypeError('getToken gave no token');
      this._token = token;
      this._tokenStale = false;
      this._scheduleRefresh();
    }
    return this._token;
  }

  /**
   * Asks getToken again before the token's `exp` (refreshBeforeMs before
   * it, or halfway through a shorter remaining life), then reconnects a
   * streaming transport with the new token, resuming where it was. A
   * poll just sends the new token with its next request.
   */
  _scheduleRefresh() {
    clearTimeout(this._refreshTimer);
    const exp = jwtExpiry(this._token);
    const left = exp == null ? 0 : exp - Date.now();
    // No exp, or expired already: the server's refusal (or its end of the
    // stream) makes the next attempt ask getToken.
    if (left <= 0 || this._closed) return;
    const delay = Math.max(0, left - Math.min(this._o.refreshBeforeMs, left / 2));
    if (delay > MAX_TIMER_MS) {
      // setTimeout cannot wait longer (it would fire at once): look again then.
      this._refreshTimer = setTimeout(() => this._scheduleRefresh(), MAX_TIMER_MS);
      return;
    }
    this._refreshTimer = setTimeout(async () => {
      if (this._closed) return;
      try {
        const token = await this._o.getToken();
        if (typeof token !== 'string' || token === '') throw new TypeError('getToken gave no token');
        if (this._closed) return;
        this._token = token;
        this._tokenStale = false;
        this._call('onTokenRefresh', { expiresAt: jwtExpiry(token) });
      } catch {
        // Try again in a while (until the token expires: then the server
        // ends the stream, and the reconnect asks getToken, with backoff).
        const wait = Math.min(5000, Math.max(1000, (exp - Date.now()) / 4));
        this._refreshTimer = setTimeout(() => this._scheduleRefresh(), wait);
        return;
      }
      this._scheduleRefresh();
      if (this.transport !== 'poll' && this._state === 'open') {
        this._why = { reason: 'token refresh' };
        this._attemptNow();
      }
    }, delay);
  }

  // --- helpers --------------------------------------------------------------

  /** The stream URL, with the resume point and (when given) the token. */
  _streamUrl(token, ids) {
    const q = [];
    if (ids) q.push('ids=1');
    if (this._lastEventId != null) q.push(`since=${encodeURIComponent(this._lastEventId)}`);
    if (token) q.push(`token=${encodeURIComponent(token)}`);
    return `${this._base}/test/${this._id}${q.length ? `?${q.join('&')}` : ''}`;
  }

  _headers(token, accept) {
    const h = { Accept: accept };
    if (token) h.Authorization = `Bearer ${token}`;
    return h;
  }

  _report(state, info) {
    this._state = state;
    this._call('onState', { state, transport: this.transport, ...info });
  }

  _call(name, arg) {
    const f = this._o[name];
    if (typeof f !== 'function') return;
    try {
      f(arg);
    } catch (e) {
      // An application callback that throws must not stop the stream.
      setTimeout(() => {
        throw e;
      });
    }
  }
}

// --- transports ------------------------------------------------------------

/** A browser EventSource; the status of a refusal is learnt by a probe. */
function openEventSource(ES, url, withCredentials, sink) {
  const es = new ES(url, { withCredentials });
  let opened = false;
  for (const kind of EVENT_KINDS) {
    es.addEventListener(kind, (e) => sink.event(kind, e.data, e.lastEventId));
  }
  es.onopen = () => {
    opened = true;
  };
  es.onerror = () => {
    // Reconnects are ours (backoff with jitter, ?since=), not the
    // browser's: close it, whatever state it is in.
    const refused = es.readyState === 2 || !opened;
    es.close();
    sink.fail(refused ? { probeUrl: url } : { error: new SwitchboardError('the stream was cut') });
  };
  return { close: () => es.close() };
}

/** SSE read from a fetch body (Node, or a browser without EventSource). */
function openFetchSse(fetchFn, url, headers, sink) {
  const ac = new AbortController();
  (async () => {
    const res = await fetchFn(url, { headers, signal: ac.signal, cache: 'no-store' });
    if (!res.ok) {
      sink.fail(await failureOf(res));
      return;
    }
    const type = res.headers.get('content-type') || '';
    if (!type.startsWith('text/event-stream')) {
      res.body?.cancel().catch(() => {});
      sink.fail({ error: new SwitchboardError(`not an event stream (${type || 'no content type'})`, { status: res.status }) });
      return;
    }
    const parser = new SseParser((kind, data, id) => sink.event(kind, data, id));
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      parser.push(decoder.decode(value, { stream: true }));
    }
    sink.fail({ error: new SwitchboardError('the stream ended') });
  })().catch((error) => {
    if (!ac.signal.aborted) sink.fail({ error });
  });
  return { close: () => ac.abort() };
}

/** A WebSocket with `?ids=1`: each text frame is "<position> <line>". */
function openWebSocket(WS, url, sink) {
  const ws = new WS(url);
  let opened = false;
  ws.onopen = () => {
    opened = true;
  };
  ws.onmessage = (e) => {
    if (typeof e.data !== 'string') return;
    const space = e.data.indexOf(' ');
    const position = space > 0 && /^\d+$/.test(e.data.slice(0, space)) ? e.data.slice(0, space) : null;
    const line = position != null ? e.data.slice(space + 1) : e.data;
    const [kind, data] = classifyLine(line);
    sink.event(kind, data, position);
  };
  ws.onerror = () => {};
  ws.onclose = (e) => {
    if (e.code === 1008) {
      sink.fail({ auth: true, error: new SwitchboardError(`WebSocket closed: ${e.reason || 'policy'}`) });
    } else if (!opened) {
      sink.fail({ probeUrl: url.replace(/^ws/, 'http') });
    } else {
      sink.fail({ error: new SwitchboardError(`WebSocket closed (${e.code}${e.reason ? `: ${e.reason}` : ''})`) });
    }
  };
  return {
    close: () => {
      ws.onclose = ws.onmessage = null;
      try {
        ws.close(1000);
      } catch {
        // Not open yet in some implementations: nothing to close.
      }
    },
  };
}

// --- parsing ---------------------------------------------------------------

/** The event kind of a plain (WebSocket) line, and its data. */
function classifyLine(line) {
  if (line.startsWith('Recvd msg #')) return ['message', line];
  if (line.startsWith('Chunk ')) return ['tick', line];
  if (line.startsWith('Switchboard welcomes you!')) return ['welcome', line];
  if (line.startsWith('Gap: ')) return ['gap', line];
  if (line.startsWith('Join: ')) return ['join', line.slice(6)];
  if (line.startsWith('Leave: ')) return ['leave', line.slice(7)];
  return ['other', line];
}

/** "Recvd msg #N: 'THE MESSAGE'": the message, and N. */
function parseMessage(line) {
  const m = /^Recvd msg #(\d+): '/.exec(line);
  if (!m || !line.endsWith("'")) return { data: line, seq: null };
  return { data: line.slice(m[0].length, -1), seq: Number(m[1]) };
}

/** "Gap: messages after event A may be missing; history resumes at event B". */
function parseGap(line) {
  const after = /after event (\d+)/.exec(line);
  const next = /resumes at event (\d+)/.exec(line);
  return { after: after ? after[1] : null, next: next ? next[1] : null };
}

/** Server-sent events, as the HTML standard parses them. */
class SseParser {
  constructor(dispatch) {
    this._dispatch = dispatch;
    this._buf = '';
    this._data = null;
    this._event = '';
    this._id = '';
    this._sawCr = false;
  }

  push(text) {
    let buf = this._buf + text;
    if (this._sawCr && buf.startsWith('\n')) buf = buf.slice(1);
    this._sawCr = false;
    let start = 0;
    for (;;) {
      const nl = buf.indexOf('\n', start);
      const cr = buf.indexOf('\r', start);
      let end;
      if (nl < 0 && cr < 0) break;
      if (cr >= 0 && (nl < 0 || cr < nl)) {
        end = cr;
        this._line(buf.slice(start, end));
        if (buf[end + 1] === '\n') start = end + 2;
        else if (end + 1 === buf.length) {
          this._sawCr = true;
          start = end + 1;
        } else start = end + 1;
      } else {
        end = nl;
        this._line(buf.slice(start, end));
        start = end + 1;
      }
    }
    this._buf = buf.slice(start);
  }

  _line(line) {
    if (line === '') {
      if (this._data != null) {
        const data = this._data.endsWith('\n') ? this._data.slice(0, -1) : this._data;
        this._dispatch(this._event || 'message', data, this._id);
      }
      this._data = null;
      this._event = '';
      return;
    }
    if (line.startsWith(':')) return;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'data') this._data = (this._data ?? '') + value + '\n';
    else if (field === 'event') this._event = value;
    else if (field === 'id' && !value.includes('\0')) this._id = value;
  }
}

/** The status, Retry-After and body of a refusal. */
async function failureOf(res) {
  let body = null;
  try {
    body = await res.text();
  } catch {
    // The body is only for the error message.
  }
  const retryAfterMs = parseRetryAfter(res.headers.get('retry-after'));
  let reason = body;
  try {
    reason = JSON.parse(body).error ?? body;
  } catch {
    // Not JSON (a proxy's page): the text as it is.
  }
  const error = new SwitchboardError(`HTTP ${res.status}${reason ? `: ${String(reason).slice(0, 200)}` : ''}`, {
    status: res.status,
    retryAfterMs,
    body,
  });
  return { status: res.status, retryAfterMs, body, error };
}

/** Retry-After in seconds or as an HTTP date, in milliseconds from now. */
function parseRetryAfter(value) {
  if (value == null) return null;
  const v = value.trim();
  if (/^\d+$/.test(v)) return Number(v) * 1000;
  const at = Date.parse(v);
  return Number.isNaN(at) ? null : Math.max(0, at - Date.now());
}

/** A JWT's `exp` in milliseconds since the epoch (null if it has none). */
function jwtExpiry(token) {
  if (typeof token !== 'string') return null;
  const part = token.split('.')[1];
  if (!part) return null;
  try {
    const b64 = part.replace(/-/g, '+').replace(/_/g, '/');
    const text = decodeURIComponent(
      Array.from(atob(b64 + '='.repeat((4 - (b64.length % 4)) % 4)), (c) => `%${c.charCodeAt(0).toString(16).padStart(2, '0')}`).join(''),
    );
    const exp = JSON.parse(text).exp;
    return typeof exp === 'number' ? exp * 1000 : null;
  } catch {
    return null;
  }
}
