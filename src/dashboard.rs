//! The live page at `GET /`, and the stream that feeds it.
//!
//! One HTML file compiled into the binary (`dashboard.html`: no build
//! step, nothing fetched from elsewhere), with the figures of the moment
//! filled in, so it is readable without JavaScript (it then reloads every
//! 5 s). With JavaScript it opens an `EventSource` on
//! `GET /dashboard/events`: once a second, a JSON object with the `/stats`
//! document and, in cluster mode, every node's row from `/cluster`. The
//! page works out the rates (connects/s, messages/s) from two samples.

use std::sync::Arc;
use std::time::Duration;

use actix_web::HttpResponse;
use actix_web::http::header;
use actix_web::web::{Bytes, Data};
use serde_json::{Value, json};

use crate::state::ServerState;

/// The page; `{{name}}` marks what [`page`] fills in.
const PAGE: &str = include_str!("dashboard.html");

/// How often the feed sends a sample.
const INTERVAL: Duration = Duration::from_secs(1);

/// How old a cluster view a sample may show: so that every open dashboard
/// together costs one read from Redis a second.
const VIEW_MAX_AGE: Duration = Duration::from_millis(900);

/// `GET /`: the page, with the figures of the moment.
pub(crate) async fn page(state: Data<ServerState>) -> HttpResponse {
    let s = state.stats_document();
    let node = state.node_name();
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let per = s["memory"]["bytes_per_connection"].as_u64();
    let (router, counter) = (
        n(&s["actors"]["router"]["restarts"]),
        n(&s["actors"]["counter"]["restarts"]),
    );
    let bus = s["cluster"]["restarts"].as_u64();
    let refused = ["streams", "stream_opens", "publishes", "tls_handshakes"]
        .iter()
        .map(|k| n(&s["limits"]["refused"][*k]))
        .sum::<u64>();
    let fill: [(&str, String); 16] = [
        ("node", escape(&node)),
        ("uptime", format!("{} s", n(&s["uptime_s"]))),
        ("streams", n(&s["connections"]["active"]).to_string()),
        ("opened", n(&s["connections"]["opened"]).to_string()),
        ("routed", n(&s["messages"]["routed"]).to_string()),
        ("delivered", n(&s["messages"]["delivered"]).to_string()),
        ("dropped", n(&s["messages"]["dropped"]).to_string()),
        ("slow", n(&s["connections"]["slow_disconnects"]).to_string()),
        ("refused", refused.to_string()),
        ("rss", n(&s["memory"]["rss_bytes"]).to_string()),
        ("rss_text", bytes(n(&s["memory"]["rss_bytes"]))),
        ("per_stream", per.map_or_else(String::new, |b| b.to_string())),
        ("per_stream_text", per.map_or_else(|| "–".to_owned(), bytes)),
        ("restarts", (router + counter + bus.unwrap_or(0)).to_string()),
        (
            "restarts_detail",
            match bus {
                Some(bus) => format!("router {router} · dispatcher {counter} · bus {bus}"),
                None => format!("router {router} · dispatcher {counter}"),
            },
        ),
        (
            "cluster_hidden",
            if state.hub.cluster().is_some() {
                ""
            } else {
                "hidden"
            }
            .to_owned(),
        ),
    ];
    let mut html = PAGE.to_owned();
    for (key, value) in &fill {
        html = html.replace(&format!("{{{{{key}}}}}"), value);
    }
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .body(html)
}

/// `GET /dashboard/events`: an SSE stream of one sample per second, until
/// the client goes or the server shuts down.
pub(crate) async fn events(state: Data<ServerState>) -> HttpResponse {
    let state = state.into_inner();
    let body = futures_util::stream::unfold((state, true), |(state, first)| async move {
        if !first {
            tokio::select! {
                () = state.admission.shutdown.cancelled() => return None,
                () = tokio::time::sleep(INTERVAL) => {}
            }
        }
        if state.admission.shutdown.is_cancelled() {
            return None;
        }
        let sample = sample(&state).await;
        let event = Bytes::from(format!("data: {sample}\n\n"));
        Some((Ok::<_, std::convert::Infallible>(event), (state, false)))
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .streaming(body)
}

/// One sample: this node's `/stats`, and the cluster's nodes.
async fn sample(state: &Arc<ServerState>) -> Value {
    let cluster = match state.hub.cluster() {
        // Shared by every open dashboard: one read from Redis a second.
        Some(c) => match c.recent_view(VIEW_MAX_AGE).await {
            Ok(view) => serde_json::to_value(view).unwrap_or(Value::Null),
            Err(e) => json!({ "error": e.to_string() }),
        },
        None => Value::Null,
    };
    let stats = state.stats_document();
    json!({
        "node": state.node_name(),
        "uptime_s": state.stats.uptime().as_secs_f64(),
        "stats": stats,
        "cluster": cluster,
    })
}

/// `n` bytes for people.
fn bytes(n: u64) -> String {
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < 3 {
        v /= 1024.0;
        unit += 1;
    }
    let units = ["B", "KiB", "MiB", "GiB"];
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[unit])
    }
}

/// `text` safe inside HTML text and attribute values.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_is_known() {
        let known = [
            "node",
            "uptime",
            "streams",
            "opened",
            "routed",
            "delivered",
            "dropped",
            "slow",
            "refused",
            "rss",
            "rss_text",
            "per_stream",
            "per_stream_text",
            "restarts",
            "restarts_detail",
            "cluster_hidden",
        ];
        for part in PAGE.split("{{").skip(1) {
            let key = part.split("}}").next().unwrap();
            assert!(known.contains(&key), "unknown placeholder {{{{{key}}}}}");
        }
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(escape("<a&\">"), "&lt;a&amp;&quot;&gt;");
    }
}
