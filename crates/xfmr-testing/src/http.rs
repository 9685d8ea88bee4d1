//! A small HTTP/1.1 client over `std::net::TcpStream` for the server's tests and its fuzz
//! target: whole responses (chunked bodies decoded), and server-sent events read one at a time
//! as they arrive. Feature `http`.
//!
//! Every call panics with the reason when the server's answer is not HTTP as expected: this is
//! test code, where a panic is the failure report.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

/// A response: status, headers (names lower-cased), body.
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The headers in order, names lower-cased, values trimmed.
    pub headers: Vec<(String, String)>,
    /// The body, chunked transfer decoded.
    pub body: Vec<u8>,
}

impl Response {
    /// The body as JSON (panics, showing the body, if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {}: body is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The first header called `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream
}

/// Sends a request with `Connection: close`.
pub fn send(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> BufReader<TcpStream> {
    let mut stream = connect(addr);
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    BufReader::new(stream)
}

/// Status line and headers.
fn read_head(reader: &mut BufReader<TcpStream>) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (n, v) = l.split_once(':').expect("header");
        headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    (status, headers)
}

fn is_chunked(headers: &[(String, String)]) -> bool {
    headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"))
}

/// The next chunk of a chunked body (`None` at its end).
fn read_chunk(reader: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let size = usize::from_str_radix(line.trim(), 16).expect("chunk size");
    if size == 0 {
        return None;
    }
    let mut data = vec![0; size + 2];
    reader.read_exact(&mut data).ok()?;
    data.truncate(size);
    Some(data)
}

/// A whole request and response.
pub fn request(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> Response {
    let mut reader = send(addr, method, path, body);
    let (status, headers) = read_head(&mut reader);
    let mut body = Vec::new();
    if is_chunked(&headers) {
        while let Some(chunk) = read_chunk(&mut reader) {
            body.extend(chunk);
        }
    } else {
        reader.read_to_end(&mut body).unwrap();
    }
    Response {
        status,
        headers,
        body,
    }
}

/// `GET path`.
pub fn get(addr: SocketAddr, path: &str) -> Response {
    request(addr, "GET", path, b"")
}

/// `POST path` with a JSON body.
pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Response {
    request(addr, "POST", path, body.to_string().as_bytes())
}

/// A streamed response, read event by event.
pub struct Events {
    /// The status code.
    pub status: u16,
    /// The headers, as in [`Response::headers`].
    pub headers: Vec<(String, String)>,
    reader: BufReader<TcpStream>,
    buffer: String,
}

impl Events {
    /// Posts `body` to `path` and reads the head of the streamed answer.
    pub fn open(addr: SocketAddr, path: &str, body: &Value) -> Self {
        let mut reader = send(addr, "POST", path, body.to_string().as_bytes());
        let (status, headers) = read_head(&mut reader);
        assert!(is_chunked(&headers), "a stream is chunked: {headers:?}");
        Self {
            status,
            headers,
            reader,
            buffer: String::new(),
        }
    }

    /// The next event's `data`, as soon as it has arrived.
    pub fn next_data(&mut self) -> Option<String> {
        loop {
            if let Some(at) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..at + 2).collect();
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if data.is_empty() {
                    continue; // a comment or keep-alive
                }
                return Some(data.join("\n"));
            }
            let chunk = read_chunk(&mut self.reader)?;
            self.buffer
                .push_str(&String::from_utf8(chunk).expect("UTF-8 events"));
        }
    }

    /// Every remaining event's data.
    pub fn rest(mut self) -> Vec<String> {
        std::iter::from_fn(|| self.next_data()).collect()
    }

    /// Closes the connection (a client that goes away).
    pub fn disconnect(self) {
        let _ = self.reader.into_inner().shutdown(std::net::Shutdown::Both);
    }
}

/// A process's resident memory before, during and after a burst of requests ([`burst`]),
/// bytes.
#[derive(Debug, Clone, Copy)]
pub struct BurstMemory {
    /// `VmRSS` before the burst.
    pub idle: u64,
    /// The highest `VmRSS` sampled every 2 ms during the burst, or the process's high-water
    /// mark `VmHWM` after it if higher (which counts any earlier peak too: only stricter).
    pub peak: u64,
    /// `VmRSS` `settle` after the last answer.
    pub after: u64,
}

/// `VmRSS` and `VmHWM` of process `pid`, bytes (Linux's `/proc/PID/status`).
pub fn memory_of(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kib| kib.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
            * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Sends `clients` requests at once (`send` on a thread each, returning the status) to the
/// server in process `pid`, sampling its memory meanwhile; returns every status and the
/// memory (issue 43's burst of large prompts). Call it after a warm-up, so that `idle`
/// includes what the first request of a kind allocates once.
pub fn burst(
    pid: u32,
    clients: usize,
    settle: Duration,
    send: impl Fn() -> u16 + Sync,
) -> (Vec<u16>, BurstMemory) {
    let (idle, _) = memory_of(pid);
    let done = std::sync::atomic::AtomicBool::new(false);
    let (statuses, sampled) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                peak = peak.max(memory_of(pid).0);
                std::thread::sleep(Duration::from_millis(2));
            }
            peak
        });
        let clients: Vec<_> = (0..clients).map(|_| s.spawn(&send)).collect();
        let statuses: Vec<u16> = clients.into_iter().map(|c| c.join().unwrap()).collect();
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        (statuses, sampler.join().unwrap())
    });
    let (_, high_water) = memory_of(pid);
    std::thread::sleep(settle);
    let (after, _) = memory_of(pid);
    let memory = BurstMemory {
        idle,
        peak: sampled.max(high_water),
        after,
    };
    (statuses, memory)
}

/// A chat completion's body (no model named: the server's one) with one user message of about
/// `bytes` bytes of words, and `max_tokens` 4.
pub fn large_chat(bytes: usize) -> Vec<u8> {
    let words = ["hello ", "the ", "there ", "world ", "of ", "tiny "];
    let mut text = String::with_capacity(bytes + 8);
    let mut i = 0;
    while text.len() < bytes {
        text.push_str(words[i % words.len()]);
        i += 1;
    }
    serde_json::json!({"max_tokens": 4, "messages": [{"role": "user", "content": text}]})
        .to_string()
        .into_bytes()
}
