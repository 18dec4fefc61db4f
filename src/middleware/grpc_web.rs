//! The trailers of a gRPC-Web response, which travel at the end of its body (a frame whose
//! flag has its high bit set, holding `name:value` lines), read as the body passes, so that
//! a counting rule or the login layer can judge the call's `grpc-status` when the gRPC-Web
//! translation runs inside the layer. Both forms are read: binary, and the base64 text form
//! (`application/grpc-web-text`, the default of grpc-web's JavaScript client).

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
    /// For the text form: the base64 being decoded.
    text: Option<Base64Stream>,
}

/// Base64 decoded as it arrives. A gRPC-Web text body encodes each frame on its own, so
/// padding may end any group of four characters, not only the last.
#[derive(Debug, Default)]
struct Base64Stream {
    group: [u8; 4],
    have: usize,
}

impl Base64Stream {
    /// Decodes `data` onto `out`; `false` for a character that is not base64.
    fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) -> bool {
        const PAD: u8 = 64;
        for &c in data {
            let value = match c {
                b'A'..=b'Z' => c - b'A',
                b'a'..=b'z' => c - b'a' + 26,
                b'0'..=b'9' => c - b'0' + 52,
                b'+' | b'-' => 62,
                b'/' | b'_' => 63,
                b'=' => PAD,
                b'\r' | b'\n' | b' ' | b'\t' => continue,
                _ => return false,
            };
            self.group[self.have] = value;
            self.have += 1;
            if self.have < 4 {
                continue;
            }
            self.have = 0;
            let [a, b, c, d] = self.group;
            if a == PAD || b == PAD || (c == PAD && d != PAD) {
                return false;
            }
            out.push((a << 2) | (b >> 4));
            if c != PAD {
                out.push((b << 4) | (c >> 2));
                if d != PAD {
                    out.push((c << 6) | d);
                }
            }
        }
        true
    }
}

impl WebTrailers {
    /// A reader for a response with these `headers` when it is gRPC-Web (a gRPC content
    /// type, [`grpc::content_type`](crate::grpc::content_type), of the `-web` or `-web-text`
    /// form).
    pub(crate) fn for_response(headers: &HeaderMap) -> Option<Self> {
        let form = &crate::grpc::content_type(headers)?.as_bytes()["application/grpc".len()..];
        let starts = |prefix: &[u8]| {
            form.len() >= prefix.len()
                && form[..prefix.len()].eq_ignore_ascii_case(prefix)
                && form[prefix.len()..].first().is_none_or(|&b| b != b'-')
        };
        if starts(b"-web-text") {
            return Some(Self {
                text: Some(Base64Stream::default()),
                ..Self::default()
            });
        }
        starts(b"-web").then(Self::default)
    }

    /// Reads `data`, the next bytes of the body: the trailers, once their frame has ended.
    pub(crate) fn feed(&mut self, data: &[u8]) -> Option<HeaderMap> {
        let Some(text) = &mut self.text else {
            return self.read(data);
        };
        if self.done {
            return None;
        }
        let mut decoded = Vec::with_capacity(data.len() / 4 * 3 + 3);
        if !text.feed(data, &mut decoded) {
            // Not base64: nothing more is read (the call keeps its charge).
            self.done = true;
            return None;
        }
        self.read(&decoded)
    }

    /// Reads the next bytes of the frames (decoded, for the text form).
    fn read(&mut self, mut data: &[u8]) -> Option<HeaderMap> {
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
    fn what_is_not_grpc_web_or_too_large_is_not_read() {
        for ct in [
            "application/grpc",
            "application/grpc-webx",
            "application/grpc-web-textual",
        ] {
            assert!(WebTrailers::for_response(&headers(ct)).is_none(), "{ct}");
        }
        for ct in [
            "application/grpc-web",
            "Application/GRPC-Web;charset=x",
            "application/grpc-web-text",
            "application/grpc-web-text+proto",
        ] {
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

    /// The text form as tonic-web writes it: each frame base64-encoded on its own, padded.
    #[test]
    fn the_text_form_is_read_however_the_body_is_cut() {
        let encode = |bytes: &[u8]| {
            const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            let mut out = Vec::new();
            for chunk in bytes.chunks(3) {
                let n = (u32::from(chunk[0]) << 16)
                    | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
                    | u32::from(*chunk.get(2).unwrap_or(&0));
                for i in 0..4 {
                    out.push(if i <= chunk.len() {
                        ABC[((n >> (18 - 6 * i)) & 63) as usize]
                    } else {
                        b'='
                    });
                }
            }
            out
        };
        let mut body = encode(&frame(0, b"\x08\x01"));
        body.extend(encode(&frame(0x80, b"grpc-status:0\r\n")));
        let text = WebTrailers::for_response(&headers("application/grpc-web-text")).unwrap();
        for step in [1, 2, 3, 5, body.len()] {
            let mut r = WebTrailers {
                text: Some(Default::default()),
                ..Default::default()
            };
            let found = body.chunks(step).find_map(|c| r.feed(c));
            assert_eq!(found.expect("trailers")["grpc-status"], "0", "step {step}");
        }
        assert!(text.text.is_some());
        let mut r = WebTrailers::for_response(&headers("application/grpc-web-text")).unwrap();
        assert!(r.feed(b"not*base64").is_none());
        assert!(
            r.feed(&body).is_none(),
            "nothing is read after bytes that are not base64"
        );
    }
}
