//! The trailers of a gRPC-Web response, which travel at the end of its body (a frame whose
//! flag has its high bit set, holding `name:value` lines), read as the body passes, so that
//! a counting rule can judge the call's `grpc-status` when the gRPC-Web translation runs
//! inside the layer.

use http::{HeaderMap, HeaderName, HeaderValue};

/// The most trailer bytes kept: a status and a message take a few dozen; a frame that claims
/// more is not read (the call keeps its charge).
const MAX_TRAILERS: usize = 16 * 1024;

/// A reader of a binary gRPC-Web body's frames, keeping only the trailers.
#[derive(Debug, Default)]
pub(crate) struct WebTrailers {
    /// The flag and length of the frame being read, as far as they have arrived.
    header: [u8; 5],
    have: usize,
    /// Bytes of the frame's payload still to come.
    remaining: usize,
    trailers: bool,
    buf: Vec<u8>,
    done: bool,
}

impl WebTrailers {
    /// A reader for a response with these `headers` when it is binary gRPC-Web (a gRPC
    /// content type, [`grpc::content_type`](crate::grpc::content_type), of the `-web` form);
    /// the text form (`application/grpc-web-text`, base64) is not read.
    pub(crate) fn for_response(headers: &HeaderMap) -> Option<Self> {
        let form = &crate::grpc::content_type(headers)?.as_bytes()["application/grpc".len()..];
        let web = form.len() >= 4
            && form[..4].eq_ignore_ascii_case(b"-web")
            && form[4..].first().is_none_or(|&b| b != b'-');
        web.then(Self::default)
    }

    /// Reads `data`, the next bytes of the body: the trailers, once their frame has ended.
    pub(crate) fn feed(&mut self, mut data: &[u8]) -> Option<HeaderMap> {
        while !data.is_empty() && !self.done {
            if self.have < self.header.len() {
                let n = (self.header.len() - self.have).min(data.len());
                self.header[self.have..self.have + n].copy_from_slice(&data[..n]);
                self.have += n;
                data = &data[n..];
                if self.have == self.header.len() {
                    let [flag, a, b, c, d] = self.header;
                    self.trailers = flag & 0x80 != 0;
                    self.remaining = u32::from_be_bytes([a, b, c, d]) as usize;
                    if self.trailers && self.remaining > MAX_TRAILERS {
                        self.done = true;
                        return None;
                    }
                    if self.remaining == 0 {
                        if let Some(trailers) = self.frame_ended() {
                            return Some(trailers);
                        }
                    }
                }
                continue;
            }
            let n = self.remaining.min(data.len());
            if self.trailers {
                self.buf.extend_from_slice(&data[..n]);
            }
            self.remaining -= n;
            data = &data[n..];
            if self.remaining == 0 {
                if let Some(trailers) = self.frame_ended() {
                    return Some(trailers);
                }
            }
        }
        None
    }

    /// A frame ended: the trailers, if it held them.
    fn frame_ended(&mut self) -> Option<HeaderMap> {
        self.have = 0;
        if !self.trailers {
            return None;
        }
        self.done = true;
        let mut map = HeaderMap::new();
        for line in self.buf.split(|&b| b == b'\n') {
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                continue;
            };
            let name = HeaderName::from_bytes(line[..colon].trim_ascii());
            let value = HeaderValue::from_bytes(line[colon + 1..].trim_ascii());
            if let (Ok(name), Ok(value)) = (name, value) {
                map.append(name, value);
            }
        }
        Some(map)
    }
}

#[cfg(test)]
mod tests {
    use super::WebTrailers;

    fn frame(flag: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![flag];
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn headers(content_type: &'static str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert("content-type", http::HeaderValue::from_static(content_type));
        h
    }

    fn reader() -> WebTrailers {
        WebTrailers::for_response(&headers("application/grpc-web+proto")).unwrap()
    }

    #[test]
    fn the_trailers_are_read_however_the_body_is_cut() {
        let mut body = frame(0, b"\x08\x01");
        body.extend(frame(0x80, b"grpc-status:16\r\nGrpc-Message: no\r\n"));
        for cut in 0..=body.len() {
            for step in [1, 2, 3, 7, body.len().max(1)] {
                let mut r = reader();
                let mut found = None;
                let (head, tail) = body.split_at(cut);
                for chunk in head.chunks(step).chain(tail.chunks(step)) {
                    if let Some(t) = r.feed(chunk) {
                        found = Some(t);
                    }
                }
                let t = found.unwrap_or_else(|| panic!("cut {cut}, step {step}"));
                assert_eq!(t["grpc-status"], "16");
                assert_eq!(t["grpc-message"], "no");
            }
        }
    }

    #[test]
    fn what_is_not_binary_grpc_web_or_too_large_is_not_read() {
        for ct in [
            "application/grpc-web-text",
            "application/grpc-web-text+proto",
            "application/grpc",
            "application/grpc-webx",
        ] {
            assert!(WebTrailers::for_response(&headers(ct)).is_none(), "{ct}");
        }
        for ct in ["application/grpc-web", "Application/GRPC-Web;charset=x"] {
            assert!(WebTrailers::for_response(&headers(ct)).is_some(), "{ct}");
        }
        let mut r = reader();
        let mut big = vec![0x80];
        big.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(r.feed(&big).is_none());
        assert!(r.feed(&frame(0x80, b"grpc-status:0")).is_none());
        // A body of data frames alone has no trailers.
        let mut r = reader();
        assert!(r.feed(&frame(0, &[7; 40])).is_none());
    }
}
