// Stream clients people use from Node.js, for tests/clients.rs.
//
//     node clients.mjs <http|fetch|eventsource|ws> <url>
//
// Prints every line (plain), event data (SSE) or text frame (WebSocket) the
// server sends, one per line; a refusal prints "ERROR: <status> <body>" and
// exits 1. `http` and `fetch` are Node's own; `eventsource` and `ws` are the
// npm packages of those names (`npm ci` in this folder; .ci/run does it).
import http from "node:http";

const [kind, url] = process.argv.slice(2);
const out = (text) => process.stdout.write(text + "\n");
const fail = (status, body) => {
  out(`ERROR: ${status} ${body}`);
  process.exit(1);
};

function lines(onLine) {
  let rest = "";
  return (text) => {
    rest += text;
    let at;
    while ((at = rest.indexOf("\n")) >= 0) {
      onLine(rest.slice(0, at));
      rest = rest.slice(at + 1);
    }
  };
}

if (kind === "http") {
  http.get(url, (res) => {
    res.setEncoding("utf8");
    if (res.statusCode !== 200) {
      let body = "";
      res.on("data", (d) => (body += d));
      res.on("end", () => fail(res.statusCode, body));
      return;
    }
    res.on("data", lines(out));
  }).on("error", (e) => fail("-", e.message));
} else if (kind === "fetch") {
  const res = await fetch(url);
  if (res.status !== 200) fail(res.status, await res.text());
  const decoder = new TextDecoder();
  const feed = lines(out);
  for await (const chunk of res.body) feed(decoder.decode(chunk, { stream: true }));
} else if (kind === "eventsource") {
  const { EventSource } = await import("eventsource");
  const es = new EventSource(url);
  for (const type of ["welcome", "tick", "message", "gap"]) {
    es.addEventListener(type, (e) => out(e.data));
  }
  es.onerror = (e) => {
    if (e.code) fail(e.code, e.message);
  };
} else if (kind === "ws") {
  const { default: WebSocket } = await import("ws");
  const ws = new WebSocket(url);
  ws.on("message", (data) => out(data.toString()));
  ws.on("unexpected-response", (_req, res) => {
    let body = "";
    res.on("data", (d) => (body += d));
    res.on("end", () => fail(res.statusCode, body));
  });
  ws.on("error", (e) => fail("-", e.message));
} else {
  fail("-", `unknown client ${kind}`);
}
