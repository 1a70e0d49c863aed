use super::*;
use crate::chunked::MAX_LINE_EXTRA;

fn head_of(raw: &str) -> Result<Parsed, WireError> {
    parse_head(&mut BytesMut::from(raw), &Method::POST, 8192)
}

fn framing(raw: &str) -> Result<(Framing, bool), WireError> {
    match head_of(raw)? {
        Parsed::Head(h) => Ok((h.framing, h.keep_alive)),
        other => panic!("not a head: {other:?}"),
    }
}

/// Decodes `body` fed in pieces of `piece` bytes, then reports what the decoder left of
/// the buffer.
fn decode(framing: Framing, body: &[u8], piece: usize) -> (Result<Vec<u8>, Truncated>, Vec<u8>) {
    let mut d = Decoder::new(framing);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut fed = 0;
    loop {
        match d.next(&mut buf, fed == body.len()) {
            Ok(Decoded::Data(b)) => {
                assert!(!b.is_empty(), "an empty data frame");
                out.extend_from_slice(&b)
            }
            Ok(Decoded::End) => return (Ok(out), buf.to_vec()),
            Ok(Decoded::NeedMore) => {
                assert!(fed < body.len(), "asked for more at the end of the input");
                let end = (fed + piece).min(body.len());
                buf.extend_from_slice(&body[fed..end]);
                fed = end;
            }
            Err(e) => return (Err(e), buf.to_vec()),
        }
    }
}

#[test]
fn the_request_head_is_written_with_its_own_framing() {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.insert("host", HeaderValue::from_static("evil"));
    headers.insert("transfer-encoding", HeaderValue::from_static("chunked"));
    headers.insert("connection", HeaderValue::from_static("upgrade"));
    headers.insert("content-length", HeaderValue::from_static("99"));
    headers.append("x-aip-client-aic", HeaderValue::from_static("a"));
    let mut out = Vec::new();
    encode_head(
        &mut out,
        &Method::POST,
        "/p/rpc?x=1",
        "partner:8080",
        &headers,
        402,
    );
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "POST /p/rpc?x=1 HTTP/1.1\r\nhost: partner:8080\r\ncontent-type: application/json\r\n\
         x-aip-client-aic: a\r\ncontent-length: 402\r\n\r\n"
    );
    let mut out = Vec::new();
    encode_head(&mut out, &Method::GET, "", "h", &HeaderMap::new(), 0);
    assert_eq!(
        out,
        b"GET / HTTP/1.1\r\nhost: h\r\ncontent-length: 0\r\n\r\n"
    );
}

#[test]
fn a_head_is_parsed_with_values_sliced_from_it() {
    let raw = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-a: 1\r\nx-a: 2\r\n\r\nbody";
    let mut buf = BytesMut::from(raw);
    let Parsed::Head(h) = parse_head(&mut buf, &Method::POST, 8192).unwrap() else {
        panic!("no head")
    };
    assert_eq!(h.status, StatusCode::OK);
    assert_eq!(h.version, Version::HTTP_11);
    assert_eq!(h.headers["content-type"], "text/event-stream");
    assert_eq!(h.headers.get_all("x-a").iter().count(), 2);
    assert_eq!((h.framing, h.keep_alive), (Framing::Close, false));
    assert_eq!(&buf[..], b"body", "the head is taken, the rest stays");
}

#[test]
fn every_prefix_of_a_head_asks_for_more() {
    let raw = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n";
    for cut in 0..raw.len() {
        assert!(matches!(head_of(&raw[..cut]), Ok(Parsed::Partial)), "{cut}");
    }
    assert_eq!(framing(raw).unwrap(), (Framing::Length(2), true));
}

#[test]
fn framing_follows_the_rules() {
    let cases = [
        (
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
            (Framing::Length(5), true),
        ),
        (
            "HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\ncontent-length: 5\r\n\r\n",
            (Framing::Length(5), true),
        ),
        (
            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            (Framing::Empty, true),
        ),
        (
            "HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked \r\n\r\n",
            (Framing::Chunked, true),
        ),
        (
            "HTTP/1.1 204 No Content\r\ncontent-length: 7\r\n\r\n",
            (Framing::Empty, true),
        ),
        (
            "HTTP/1.1 304 Not Modified\r\ntransfer-encoding: chunked\r\n\r\n",
            (Framing::Empty, true),
        ),
        ("HTTP/1.1 200 OK\r\n\r\n", (Framing::Close, false)),
        (
            "HTTP/1.1 200 OK\r\nconnection: keep-alive, Close\r\ncontent-length: 1\r\n\r\n",
            (Framing::Length(1), false),
        ),
        (
            "HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n",
            (Framing::Length(1), false),
        ),
        (
            "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n",
            (Framing::Length(1), true),
        ),
    ];
    for (raw, want) in cases {
        assert_eq!(framing(raw).unwrap(), want, "{raw:?}");
    }
    let head = parse_head(
        &mut BytesMut::from("HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n"),
        &Method::HEAD,
        8192,
    );
    assert!(matches!(
        head,
        Ok(Parsed::Head(Head {
            framing: Framing::Empty,
            ..
        }))
    ));
}

#[test]
fn ambiguous_framing_is_refused() {
    for raw in [
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n",
        "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: 5, 6\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
    ] {
        assert!(
            matches!(head_of(raw), Err(WireError::Framing(_))),
            "{raw:?}"
        );
    }
    for raw in [
        "HTTP/1.1 101 Switching Protocols\r\n\r\n",
        "HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
        "HTTP/1.1 200 OK\r\n folded: x\r\n\r\n",
        "HTTP/2 200 OK\r\n\r\n",
        "HTTP/1.1 20 OK\r\n\r\n",
    ] {
        assert!(matches!(head_of(raw), Err(WireError::Head(_))), "{raw:?}");
    }
}

#[test]
fn informational_responses_are_skipped() {
    let mut buf = BytesMut::from("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: x\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
    let mut informational = 0;
    loop {
        match parse_head(&mut buf, &Method::POST, 8192).unwrap() {
            Parsed::Informational => informational += 1,
            Parsed::Head(h) => {
                assert_eq!(h.status, 200);
                break;
            }
            Parsed::Partial => panic!("partial"),
        }
    }
    assert_eq!(informational, 2);
    assert!(buf.is_empty());
}

#[test]
fn a_head_over_the_bound_is_refused_complete_or_not() {
    let big = format!("HTTP/1.1 200 OK\r\nx: {}\r\n\r\n", "a".repeat(300));
    let r = parse_head(&mut BytesMut::from(&big[..]), &Method::POST, 256);
    assert_eq!(r.unwrap_err(), WireError::HeadTooLarge(256));
    let r = parse_head(&mut BytesMut::from(&big[..280]), &Method::POST, 256);
    assert_eq!(r.unwrap_err(), WireError::HeadTooLarge(256));
    let many: String = (0..MAX_HEADERS + 1)
        .map(|i| format!("x{i}: 1\r\n"))
        .collect();
    let r = head_of(&format!("HTTP/1.1 200 OK\r\n{many}\r\n"));
    assert_eq!(r.unwrap_err(), WireError::Head("too many fields"));
}

const CHUNKED: &[u8] = b"5\r\nhello\r\n1a;name=\"va;l\" ; x\r\nabcdefghijklmnopqrstuvwxyz\r\n0002 \r\n\r\n\r\n0\r\nx-trailer: 1\r\ny: 2\r\n\r\nNEXT";

#[test]
fn chunked_bodies_decode_however_they_are_cut() {
    for piece in 1..=CHUNKED.len() {
        let (body, rest) = decode(Framing::Chunked, CHUNKED, piece);
        assert_eq!(
            body.unwrap(),
            b"helloabcdefghijklmnopqrstuvwxyz\r\n",
            "pieces of {piece}"
        );
        // What follows the body is not taken from the buffer, whatever arrived with it.
        assert!(b"NEXT".starts_with(&rest), "pieces of {piece}: {rest:?}");
    }
    let (body, rest) = decode(Framing::Chunked, b"0\r\n\r\n", 5);
    assert_eq!((body.unwrap(), rest), (vec![], vec![]));
}

#[test]
fn broken_chunked_bodies_are_refused() {
    for raw in [
        &b"5\nhello\r\n0\r\n\r\n"[..],
        b"5\r\nhello\n0\r\n\r\n",
        b"5\r\nhelloX\r\n0\r\n\r\n",
        b"g\r\n",
        b"\r\n",
        b" 5\r\n",
        b"5 5\r\n",
        b"5;a\x01\r\n",
        b"11111111111111111\r\n",
        b"0\r\nx: 1\n\r\n",
        b"0\r\n\r\r",
        b"5\r\r\n",
    ] {
        let (body, _) = decode(Framing::Chunked, raw, raw.len());
        assert!(
            matches!(body, Err(Truncated::Invalid(WireError::Chunked(_)))),
            "{:?}: {body:?}",
            String::from_utf8_lossy(raw)
        );
    }
    let line = format!("1;{}\r\n", "e".repeat(MAX_LINE_EXTRA));
    let (body, _) = decode(Framing::Chunked, line.as_bytes(), 64);
    assert_eq!(
        body,
        Err(Truncated::Invalid(WireError::Chunked(
            "chunk_extension_too_long"
        )))
    );
    let trailers = format!("0\r\nx: {}\r\n\r\n", "t".repeat(MAX_LINE_EXTRA));
    let (body, _) = decode(Framing::Chunked, trailers.as_bytes(), 4096);
    assert_eq!(
        body,
        Err(Truncated::Invalid(WireError::Chunked("trailers_too_long")))
    );
    // Trailers are fields: a request line there is refused, not skipped.
    let (body, _) = decode(Framing::Chunked, b"0\r\nGET / HTTP/1.1\r\n\r\n", 5);
    assert_eq!(
        body,
        Err(Truncated::Invalid(WireError::Chunked("bad_trailer")))
    );
}

#[test]
fn a_body_cut_short_by_a_close_is_an_eof() {
    for cut in 0..CHUNKED.len() - b"NEXT".len() {
        let (body, _) = decode(Framing::Chunked, &CHUNKED[..cut], 3);
        assert_eq!(body, Err(Truncated::Eof), "{cut}");
    }
    let (body, _) = decode(Framing::Length(10), b"12345", 2);
    assert_eq!(body, Err(Truncated::Eof));
    let (body, _) = decode(Framing::Length(0), b"", 2);
    assert_eq!(body, Ok(vec![]));
}

#[test]
fn length_and_close_bodies_end_where_they_should() {
    for piece in 1..12 {
        let (body, rest) = decode(Framing::Length(5), b"helloNEXT", piece);
        assert_eq!(body.unwrap(), b"hello");
        assert!(b"NEXT".starts_with(&rest), "{piece}: {rest:?}");
        let (body, rest) = decode(Framing::Close, b"hello, until the close", piece);
        assert_eq!(
            (body.unwrap(), rest),
            (b"hello, until the close".to_vec(), vec![])
        );
    }
    let d = Decoder::new(Framing::Length(7));
    assert_eq!(d.remaining(), Some(7));
    assert!(Decoder::new(Framing::Empty).is_done());
}

#[test]
fn how_a_response_arrives_never_changes_what_is_read() {
    let mut whole =
        b"HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec();
    whole.extend_from_slice(CHUNKED);
    let want = Some((200, b"helloabcdefghijklmnopqrstuvwxyz\r\n".to_vec()));
    for piece in 1..=whole.len() {
        assert_eq!(read_in_pieces(&whole, piece), want, "{piece}");
    }
    let close = b"HTTP/1.0 200 OK\r\n\r\nto the end";
    for piece in 1..=close.len() {
        assert_eq!(
            read_in_pieces(close, piece),
            Some((200, b"to the end".to_vec()))
        );
    }
    assert_eq!(
        read_in_pieces(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nab", 1),
        None
    );
}
