//! The fake API server's side of the wire: one connection's request, its
//! list or watch answered from the shared state.

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{pod, Shared, CACHED};

fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

pub(super) fn serve(stream: TcpStream, shared: &Shared) {
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    loop {
        let mut header = String::new();
        match reader.read_line(&mut header) {
            Ok(0) | Err(_) => return,
            Ok(_) if header == "\r\n" => break,
            Ok(_) => {}
        }
    }
    let target = request_line.split(' ').nth(1).unwrap_or_default();
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let selector = Selector::of(query);
    let node = selector.node.clone();
    let mut out = stream;
    if path != "/api/v1/pods" {
        let _ = respond(
            &mut out,
            404,
            &json!({"kind": "Status", "code": 404, "message": "not found"}),
        );
        return;
    }
    if query_param(query, "watch").is_some() {
        let version: u64 = query_param(query, "resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let timeout = query_param(query, "timeoutSeconds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(60);
        watch(
            out,
            shared,
            &selector,
            version,
            Duration::from_secs(timeout),
        );
    } else {
        let s = {
            let mut s = shared.lock();
            // With its version, as `list node since N` for one no older than N.
            let since = match (
                query_param(query, "resourceVersion"),
                query_param(query, "resourceVersionMatch"),
            ) {
                (Some(v), Some("NotOlderThan")) => format!(" since {v}"),
                _ => String::new(),
            };
            s.requests.push(format!("list {node}{since}"));
            if let (left @ 1.., code, secs) = s.throttled {
                s.throttled = (left - 1, code, secs);
                drop(s);
                let _ = write_response(
                    &mut out,
                    code,
                    &format!("Retry-After: {secs}\r\n"),
                    &json!({"kind": "Status", "code": code,
                            "message": "Too many requests, please try again later."}),
                );
                return;
            }
            if s.cache_lags && !since.is_empty() {
                drop(s);
                let _ = respond(
                    &mut out,
                    504,
                    &json!({"kind": "Status", "code": 504, "message": "Too large resource version"}),
                );
                return;
            }
            if let Some(per_page) = s.endless_list {
                let page = s.requests.len();
                let items: Vec<Value> = (0..per_page)
                    .map(|i| {
                        pod(
                            "ns",
                            &format!("p{page}-{i}"),
                            &format!("u{page}-{i}"),
                            &node,
                            &[],
                        )
                    })
                    .collect();
                json!({ "kind": "PodList", "apiVersion": "v1",
                        "metadata": { "resourceVersion": s.version.to_string(), "continue": "more" },
                        "items": items })
            } else {
                // `limit` and `continue` as the API server pages: the token
                // here is the offset of the page's first pod.
                let from: usize = query_param(query, "continue")
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                // `resourceVersion=0`: served whole from the API server's
                // watch cache, which ignores `limit` (before 1.31).
                let cached = query_param(query, "resourceVersion") == Some("0");
                let limit: usize = query_param(query, "limit")
                    .and_then(|l| l.parse().ok())
                    .filter(|_| !cached)
                    .unwrap_or(usize::MAX);
                s.pages.push((from, if cached { CACHED } else { limit }));
                let all: Vec<&Value> = s.pods.values().filter(|p| selector.lists(p)).collect();
                let end = from.saturating_add(limit).min(all.len());
                let items: Vec<Value> = all[from.min(end)..end]
                    .iter()
                    .map(|p| (*p).clone())
                    .collect();
                let cont = if end < all.len() {
                    end.to_string()
                } else {
                    String::new()
                };
                json!({ "kind": "PodList", "apiVersion": "v1",
                        "metadata": { "resourceVersion": s.version.to_string(), "continue": cont },
                        "items": items })
            }
        };
        let _ = respond(&mut out, 200, &s);
    }
}

fn respond(out: &mut TcpStream, code: u16, body: &Value) -> std::io::Result<()> {
    write_response(out, code, "", body)
}

/// A response with `headers` (each line ending in CRLF) besides the usual ones.
fn write_response(
    out: &mut TcpStream,
    code: u16,
    headers: &str,
    body: &Value,
) -> std::io::Result<()> {
    let body = body.to_string();
    write!(
        out,
        "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn chunk(out: &mut TcpStream, line: &Value) -> std::io::Result<()> {
    let text = format!("{line}\n");
    write!(out, "{:x}\r\n{text}\r\n", text.len())?;
    out.flush()
}

/// A pod list's field selector: `spec.nodeName=<node>` and any
/// `status.phase!=<phase>` terms, percent-encoded as the client sends them.
struct Selector {
    node: String,
    not_phases: Vec<String>,
}

impl Selector {
    fn of(query: &str) -> Selector {
        let mut sel = Selector {
            node: String::new(),
            not_phases: Vec::new(),
        };
        let terms = query_param(query, "fieldSelector").unwrap_or_default();
        for term in terms.split("%2C") {
            if let Some(node) = term.strip_prefix("spec.nodeName%3D") {
                sel.node = node.to_string();
            } else if let Some(phase) = term.strip_prefix("status.phase%21%3D") {
                sel.not_phases.push(phase.to_string());
            }
        }
        sel
    }

    fn lists(&self, p: &Value) -> bool {
        p["spec"]["nodeName"] == self.node.as_str() && !self.phase_excluded(p)
    }

    fn phase_excluded(&self, p: &Value) -> bool {
        let phase = p["status"]["phase"].as_str().unwrap_or_default();
        self.not_phases.iter().any(|n| n == phase)
    }
}

fn watch(mut out: TcpStream, shared: &Shared, sel: &Selector, from: u64, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let (drops, expiries, failing) = {
        let mut s = shared.lock();
        // Recorded with what the watch will be told of: a drop or an expiry
        // after a test saw this request reaches it.
        s.requests.push(format!("watch {from}"));
        if from < s.compacted_below {
            drop(s);
            let gone = json!({"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"});
            let _ = respond(&mut out, 410, &gone);
            return;
        }
        if s.watch_lags > 0 {
            s.watch_lags -= 1;
            drop(s);
            let lags =
                json!({"kind": "Status", "code": 504, "message": "Too large resource version"});
            let _ = respond(&mut out, 504, &lags);
            return;
        }
        (s.drops, s.expiries, s.watch_error)
    };
    if write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .is_err()
    {
        return;
    }
    if let Some(code) = failing {
        return end_with_error(&mut out, code, "InternalError", "etcd watch failed");
    }
    let mut sent = from;
    let mut s = shared.lock();
    loop {
        if s.drops != drops {
            let _ = out.shutdown(Shutdown::Both);
            return;
        }
        if s.expiries != expiries {
            return end_with_error(&mut out, 410, "Expired", "too old resource version");
        }
        let pending: Vec<Value> = s
            .events
            .iter()
            .filter(|(v, _, p)| *v > sent && p["spec"]["nodeName"] == sel.node.as_str())
            // An object that no longer matches the selector is sent as deleted.
            .map(|(_, kind, p)| {
                let kind = if sel.phase_excluded(p) {
                    "DELETED"
                } else {
                    kind
                };
                json!({ "type": kind, "object": p })
            })
            .collect();
        sent = s.version;
        if !pending.is_empty() {
            drop(s);
            for e in &pending {
                if chunk(&mut out, e).is_err() {
                    return;
                }
            }
            s = shared.lock();
            continue;
        }
        let now = Instant::now();
        if now >= deadline {
            let _ = write!(out, "0\r\n\r\n");
            return;
        }
        s = shared
            .changed
            .wait_timeout(s, deadline - now)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// Sends an ERROR event with a Status of `code` and ends the watch's stream.
fn end_with_error(out: &mut TcpStream, code: u16, reason: &str, message: &str) {
    let event = json!({"type": "ERROR", "object": {"kind": "Status", "code": code, "reason": reason, "message": message}});
    let _ = chunk(out, &event);
    let _ = write!(out, "0\r\n\r\n");
}
