//! hyper's own answers to requests it cannot parse (400, 414, 431, written with empty bodies
//! before any handler runs), rewritten on their way out to carry OpenAI's error JSON.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use crate::error::ApiError;

/// A connection whose answers to requests hyper could not parse (its own 400, 414 and 431,
/// written with empty bodies before any handler runs) are rewritten to carry OpenAI's error
/// JSON. Such an answer is recognised as one whole head of one of those statuses with
/// `content-length: 0` (every answer of the server's own has a JSON body); everything else
/// passes through untouched.
pub(crate) struct JsonParseErrors<I> {
    inner: I,
    /// A rewritten answer not yet written, and how much of it was.
    pending: Vec<u8>,
    written: usize,
}

impl<I> JsonParseErrors<I> {
    /// Wraps a connection.
    pub(crate) fn new(inner: I) -> Self {
        Self {
            inner,
            pending: Vec::new(),
            written: 0,
        }
    }
}

impl<I: hyper::rt::Write + Unpin> JsonParseErrors<I> {
    /// Writes what is left of a rewritten answer.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n =
                ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.pending.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

/// hyper's own answer to a request it could not parse, rewritten with OpenAI's error JSON; `None`
/// for every other write.
pub(crate) fn rewrite_parse_error(buf: &[u8]) -> Option<Vec<u8>> {
    // Cheap for every other write (a response's body may be megabytes): hyper's error heads
    // are short and begin so.
    if buf.len() > 1024 || !buf.starts_with(b"HTTP/1.1 4") {
        return None;
    }
    let head = std::str::from_utf8(buf).ok()?;
    let head = head.strip_suffix("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let error = match lines.next()? {
        "HTTP/1.1 400 Bad Request" => ApiError::invalid(
            None,
            "the request is not valid HTTP/1.1 (its request line or a header could not be parsed)",
        ),
        "HTTP/1.1 414 URI Too Long" => ApiError::uri_too_long(65_535, 65_534),
        "HTTP/1.1 431 Request Header Fields Too Large" => ApiError::headers_too_large_parser(),
        _ => return None,
    };
    let rest: Vec<&str> = lines.collect();
    if !rest
        .iter()
        .any(|l| l.eq_ignore_ascii_case("content-length: 0"))
    {
        return None;
    }
    let body = serde_json::to_string(&error.error_body()).ok()?;
    let mut out = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         x-content-type-options: nosniff\r\nconnection: close\r\n",
        error.status.as_u16(),
        error.status.canonical_reason().unwrap_or(""),
        body.len()
    );
    for line in rest {
        let name = line.split(':').next().unwrap_or("").trim();
        if !["content-length", "connection"]
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n))
        {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("\r\n");
    out.push_str(&body);
    Some(out.into_bytes())
}

impl<I: hyper::rt::Read + Unpin> hyper::rt::Read for JsonParseErrors<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: hyper::rt::Write + Unpin> hyper::rt::Write for JsonParseErrors<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_pending(cx))?;
        if let Some(answer) = rewrite_parse_error(buf) {
            self.pending = answer;
            self.written = 0;
            // What is not written now is by the next write, flush or shutdown.
            if let Poll::Ready(Err(e)) = self.poll_pending(cx) {
                return Poll::Ready(Err(e));
            }
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    /// As the connection's, so that hyper keeps writing a response's head and body without
    /// copying them into one buffer.
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut non_empty = bufs.iter().filter(|b| !b.is_empty());
        match (non_empty.next(), non_empty.next()) {
            // One piece: perhaps an error head alone, which `poll_write` rewrites.
            (Some(only), None) => self.poll_write(cx, only),
            _ => {
                ready!(self.poll_pending(cx))?;
                Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hypers_empty_error_heads_are_rewritten() {
        let hyper = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let out = String::from_utf8(rewrite_parse_error(hyper).unwrap()).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
        assert!(head.contains("date: x"), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["error"]["type"], "invalid_request_error");
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 10\r\n\r\n";
        assert!(rewrite_parse_error(ours).is_none());
        assert!(rewrite_parse_error(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
    }
}
