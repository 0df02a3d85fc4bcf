//! What the running CRI-O says about itself, read from its socket (what a pod can see, unlike a
//! `crio` binary its image lacks):
//!
//! - [`version`]: the CRI `RuntimeService/Version` call (gRPC over HTTP/2), as the kubelet asks it;
//! - [`live_config`]: CRI-O's own `GET /config` on the same socket (what `crio status config`
//!   prints): the configuration it runs with, drop-ins merged, every key it knows.
//!
//! [`ignored_keys`] compares the drop-ins with that live configuration: a key CRI-O does not know
//! is missing from it (TOML lets CRI-O ignore it without a word), and a value another file
//! overrides differs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// The CRI method the kubelet calls first.
const VERSION_PATH: &str = "/runtime.v1.RuntimeService/Version";
/// The CRI API version the request names (CRI-O answers with its own).
const CRI_API_VERSION: &str = "v1";
/// Largest answer read from the socket (CRI-O's `/config` is about 10 KiB).
const MAX_ANSWER: usize = 1 << 20;

/// Why the socket did not answer.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The socket is missing or refuses connections.
    #[error("cannot connect to CRI-O's socket {}: {source}", path.display())]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The socket answered, but not as CRI-O does.
    #[error("CRI-O's socket {} answered {what}: {detail}", path.display())]
    Answer {
        /// The socket.
        path: PathBuf,
        /// Which call.
        what: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// No answer in time.
    #[error("CRI-O's socket {} did not answer {what} within {}", path.display(), humantime::format_duration(*.timeout))]
    Timeout {
        /// The socket.
        path: PathBuf,
        /// Which call.
        what: &'static str,
        /// The time allowed.
        timeout: Duration,
    },
}

/// The runtime's answer to the CRI `Version` call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuntimeVersion {
    /// `cri-o`.
    pub runtime_name: String,
    /// E.g. `1.34.0`.
    pub runtime_version: String,
    /// The CRI API version, e.g. `v1`.
    pub runtime_api_version: String,
}

async fn within<T>(
    path: &Path,
    what: &'static str,
    timeout: Duration,
    f: impl std::future::Future<Output = Result<T, RuntimeError>>,
) -> Result<T, RuntimeError> {
    tokio::time::timeout(timeout, f).await.unwrap_or_else(|_| {
        Err(RuntimeError::Timeout {
            path: path.to_path_buf(),
            what,
            timeout,
        })
    })
}

async fn connect(path: &Path) -> Result<UnixStream, RuntimeError> {
    UnixStream::connect(path)
        .await
        .map_err(|source| RuntimeError::Connect {
            path: path.to_path_buf(),
            source,
        })
}

/// The CRI `Version` call on `socket`.
pub async fn version(socket: &Path, timeout: Duration) -> Result<RuntimeVersion, RuntimeError> {
    const WHAT: &str = "the CRI Version call";
    let answer = |detail: String| RuntimeError::Answer {
        path: socket.to_path_buf(),
        what: WHAT,
        detail,
    };
    within(socket, WHAT, timeout, async {
        let io = connect(socket).await?;
        let (client, conn) = h2::client::handshake(io)
            .await
            .map_err(|e| answer(format!("HTTP/2 handshake: {e}")))?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        let result = async {
            let mut client = client.ready().await.map_err(|e| answer(e.to_string()))?;
            let request = http::Request::post(format!("http://localhost{VERSION_PATH}"))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(())
                .map_err(|e| answer(e.to_string()))?;
            let (response, mut send) = client
                .send_request(request, false)
                .map_err(|e| answer(e.to_string()))?;
            send.send_data(grpc_frame(&proto_string(1, CRI_API_VERSION)), true)
                .map_err(|e| answer(e.to_string()))?;
            let response = response.await.map_err(|e| answer(e.to_string()))?;
            if response.status() != http::StatusCode::OK {
                return Err(answer(format!("HTTP status {}", response.status())));
            }
            let mut header_status = grpc_status(response.headers());
            let mut body = response.into_body();
            let mut data = BytesMut::new();
            while let Some(chunk) = body.data().await {
                let chunk = chunk.map_err(|e| answer(e.to_string()))?;
                let _ = body.flow_control().release_capacity(chunk.len());
                if data.len() + chunk.len() > MAX_ANSWER {
                    return Err(answer("an answer over 1 MiB".into()));
                }
                data.extend_from_slice(&chunk);
            }
            if let Some(trailers) = body.trailers().await.map_err(|e| answer(e.to_string()))? {
                header_status = header_status.or_else(|| grpc_status(&trailers));
            }
            match header_status {
                Some((0, _)) | None => {}
                Some((code, message)) => {
                    return Err(answer(format!("gRPC status {code}: {message}")));
                }
            }
            let message = grpc_message(data.freeze()).map_err(answer)?;
            parse_version(&message).map_err(answer)
        }
        .await;
        driver.abort();
        result
    })
    .await
}

/// CRI-O's live configuration (`GET /config` on `socket`), as TOML text.
pub async fn live_config(socket: &Path, timeout: Duration) -> Result<String, RuntimeError> {
    const WHAT: &str = "GET /config";
    let answer = |detail: String| RuntimeError::Answer {
        path: socket.to_path_buf(),
        what: WHAT,
        detail,
    };
    within(socket, WHAT, timeout, async {
        let mut io = connect(socket).await?;
        // HTTP/1.0: the answer ends when the connection does, never chunked.
        io.write_all(b"GET /config HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await
            .map_err(|e| answer(e.to_string()))?;
        let mut raw = Vec::new();
        (&mut io)
            .take(MAX_ANSWER as u64 + 1)
            .read_to_end(&mut raw)
            .await
            .map_err(|e| answer(e.to_string()))?;
        http_body(&raw).map_err(answer)
    })
    .await
}

/// The body of an HTTP/1.x answer with status 200.
fn http_body(raw: &[u8]) -> Result<String, String> {
    if raw.len() > MAX_ANSWER {
        return Err("an answer over 1 MiB".into());
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of headers")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("`{status}`"));
    }
    String::from_utf8(raw[split + 4..].to_vec()).map_err(|_| "a body that is not UTF-8".into())
}

/// A length-prefixed gRPC message (uncompressed).
fn grpc_frame(message: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + message.len());
    b.put_u8(0);
    b.put_u32(message.len() as u32);
    b.put_slice(message);
    b.freeze()
}

/// The one message of a unary gRPC answer.
fn grpc_message(mut data: Bytes) -> Result<Bytes, String> {
    if data.len() < 5 {
        return Err(format!("{} bytes, not a gRPC message", data.len()));
    }
    if data.get_u8() != 0 {
        return Err("a compressed gRPC message".into());
    }
    let len = data.get_u32() as usize;
    if data.len() < len {
        return Err("a truncated gRPC message".into());
    }
    Ok(data.split_to(len))
}

/// `grpc-status` (and `grpc-message`) of a header or trailer block.
fn grpc_status(h: &http::HeaderMap) -> Option<(u32, String)> {
    let code = h.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    let message = h
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .unwrap_or_default()
        .to_string();
    Some((code, message))
}

/// A protobuf `string` field.
fn proto_string(field: u32, value: &str) -> Vec<u8> {
    let mut out = Vec::new();
    varint(&mut out, u64::from(field << 3 | 2));
    varint(&mut out, value.len() as u64);
    out.extend_from_slice(value.as_bytes());
    out
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn read_varint(b: &mut Bytes) -> Result<u64, String> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        if !b.has_remaining() {
            return Err("a truncated varint".into());
        }
        let byte = b.get_u8();
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("a varint over 64 bits".into())
}

/// `runtime.v1.VersionResponse`: version = 1, runtime_name = 2, runtime_version = 3,
/// runtime_api_version = 4 (all strings); other fields are skipped.
fn parse_version(message: &Bytes) -> Result<RuntimeVersion, String> {
    let mut b = message.clone();
    let mut fields: [String; 5] = Default::default();
    while b.has_remaining() {
        let key = read_varint(&mut b)?;
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => {
                read_varint(&mut b)?;
            }
            1 | 5 => {
                let n = if wire == 1 { 8 } else { 4 };
                if b.remaining() < n {
                    return Err("a truncated field".into());
                }
                b.advance(n);
            }
            2 => {
                let len = read_varint(&mut b)? as usize;
                if b.remaining() < len {
                    return Err("a truncated field".into());
                }
                let v = b.split_to(len);
                if let Some(slot) = fields.get_mut(field as usize) {
                    *slot = String::from_utf8_lossy(&v).into_owned();
                }
            }
            w => return Err(format!("wire type {w}, not a VersionResponse")),
        }
    }
    let [_, _, runtime_name, runtime_version, runtime_api_version] = fields;
    if runtime_version.is_empty() {
        return Err("no runtime_version in the VersionResponse".into());
    }
    Ok(RuntimeVersion {
        runtime_name,
        runtime_version,
        runtime_api_version,
    })
}

/// A drop-in key the running CRI-O did not take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ignored {
    /// The drop-in file.
    pub file: String,
    /// The key, dotted (`crio.image.short_name_mode`).
    pub key: String,
    /// The drop-in's value.
    pub wanted: String,
    /// The live value; `None`: CRI-O does not know the key.
    pub live: Option<String>,
}

impl std::fmt::Display for Ignored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.live {
            None => write!(
                f,
                "{} sets {} = {}, but the running CRI-O does not know the key (its live configuration has no such key): it is ignored",
                self.file, self.key, self.wanted
            ),
            Some(live) => write!(
                f,
                "{} sets {} = {}, but the running CRI-O has {} (a file read later or CRI-O's command line overrides it, or CRI-O rewrote the value)",
                self.file, self.key, self.wanted, live
            ),
        }
    }
}

/// Compares the drop-ins (name, parsed table), in the order CRI-O reads them, with the live
/// configuration. Tables of user-named entries (runtimes, workloads) are compared key by key too;
/// arrays and tables as values are compared whole.
pub fn ignored_keys(dropins: &[(String, toml::Table)], live: &toml::Table) -> Vec<Ignored> {
    // The last file that sets a key is the one that counts.
    let mut last: std::collections::BTreeMap<String, (String, toml::Value)> = Default::default();
    let mut order: Vec<String> = Vec::new();
    let mut sorted: Vec<&(String, toml::Table)> = dropins.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    for (file, table) in sorted {
        for (key, value) in leaves(table, "") {
            if !last.contains_key(&key) {
                order.push(key.clone());
            }
            last.insert(key, (file.clone(), value));
        }
    }
    let mut out = Vec::new();
    for key in order {
        let (file, wanted) = &last[&key];
        let live_value = lookup(live, &key);
        let differs = match live_value {
            None => true,
            Some(l) => !same(l, wanted),
        };
        if differs {
            out.push(Ignored {
                file: file.clone(),
                key,
                wanted: wanted.to_string(),
                live: live_value.map(ToString::to_string),
            });
        }
    }
    out
}

fn leaves(t: &toml::Table, prefix: &str) -> Vec<(String, toml::Value)> {
    let mut out = Vec::new();
    for (k, v) in t {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(sub) => out.extend(leaves(sub, &key)),
            v => out.push((key, v.clone())),
        }
    }
    out
}

fn lookup<'a>(t: &'a toml::Table, dotted: &str) -> Option<&'a toml::Value> {
    let mut parts = dotted.split('.');
    let mut cur = t.get(parts.next()?)?;
    for p in parts {
        cur = cur.as_table()?.get(p)?;
    }
    Some(cur)
}

/// Equal as CRI-O means them: numbers by value, the rest as TOML.
fn same(a: &toml::Value, b: &toml::Value) -> bool {
    match (a, b) {
        (toml::Value::Integer(x), toml::Value::Float(y))
        | (toml::Value::Float(y), toml::Value::Integer(x)) => (*x as f64) == *y,
        _ => a == b,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn table(s: &str) -> toml::Table {
        s.parse().unwrap()
    }

    #[test]
    fn a_version_response_is_read_field_by_field() {
        let mut m = proto_string(1, "0.1.0");
        m.extend(proto_string(2, "cri-o"));
        m.extend(proto_string(3, "1.34.0"));
        m.extend(proto_string(4, "v1"));
        m.extend([0x28, 0x07]); // an unknown varint field 5
        let v = parse_version(&Bytes::from(m)).unwrap();
        assert_eq!(
            (
                v.runtime_name.as_str(),
                v.runtime_version.as_str(),
                v.runtime_api_version.as_str()
            ),
            ("cri-o", "1.34.0", "v1")
        );
        assert!(parse_version(&Bytes::from(proto_string(2, "cri-o"))).is_err());
        assert!(parse_version(&Bytes::from_static(&[0x1a, 0x09, b'1'])).is_err());
    }

    #[test]
    fn grpc_frames_round_trip_and_refuse_truncation() {
        let f = grpc_frame(b"abc");
        assert_eq!(&f[..], &[0, 0, 0, 0, 3, b'a', b'b', b'c']);
        assert_eq!(&grpc_message(f.clone()).unwrap()[..], b"abc");
        assert!(grpc_message(f.slice(..6)).is_err());
        assert!(grpc_message(Bytes::from_static(&[1, 0, 0, 0, 0])).is_err());
    }

    #[test]
    fn an_http_answer_gives_its_body_only_with_status_200() {
        assert_eq!(
            http_body(b"HTTP/1.0 200 OK\r\nContent-Type: application/toml\r\n\r\n[crio]\n")
                .unwrap(),
            "[crio]\n"
        );
        assert!(http_body(b"HTTP/1.0 404 Not Found\r\n\r\nnope")
            .unwrap_err()
            .contains("404"));
        assert!(http_body(b"garbage").is_err());
    }

    #[test]
    fn keys_the_live_config_lacks_or_overrides_are_named_with_their_file() {
        let live = table(
            "[crio.runtime]\npids_limit = 4096\ndefault_runtime = \"runc\"\n[crio.image]\npause_image = \"p:1\"\n\
             [crio.runtime.runtimes.runc]\nruntime_path = \"/usr/sbin/runc\"\n",
        );
        let dropins = vec![
            (
                "20-b.conf".to_string(),
                table("[crio.runtime]\npids_limit = 4096\n"),
            ),
            (
                "10-a.conf".to_string(),
                table("[crio.image]\nshort_name_mode = \"enforcing\"\npause_image = \"p:1\"\n[crio.runtime]\npids_limit = 1\n"),
            ),
            (
                "30-c.conf".to_string(),
                table("[crio.runtime]\ndefault_runtime = \"crun\"\n[crio.runtime.runtimes.runc]\nruntime_path = \"/usr/sbin/runc\"\n"),
            ),
        ];
        let got = ignored_keys(&dropins, &live);
        let shown: Vec<(String, String, Option<String>)> = got
            .iter()
            .map(|i| (i.file.clone(), i.key.clone(), i.live.clone()))
            .collect();
        assert_eq!(
            shown,
            vec![
                (
                    "10-a.conf".into(),
                    "crio.image.short_name_mode".into(),
                    None
                ),
                (
                    "30-c.conf".into(),
                    "crio.runtime.default_runtime".into(),
                    Some("\"runc\"".into())
                ),
            ],
            "pids_limit: 20-b.conf (read last) wins and matches; pause_image and the runtime table match"
        );
        assert!(got[0].to_string().contains("does not know the key"));
        assert!(got[1].to_string().contains("overrides it"));
    }
}
