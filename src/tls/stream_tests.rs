//! The gateway's TLS stream over real sockets, against `tokio-rustls`'s client: what it
//! reads and writes arrives whole and in order at every size and split, an idle stream
//! holds no buffer, and every way a peer ends or breaks a connection reads as
//! `tokio-rustls` reads it.

use std::io::Write;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::*;
use crate::devcerts::{CertSpec, DevCa};

struct Ends {
    server: ServerStream,
    client: TlsStream<TcpStream>,
}

fn configs() -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
    let ca = DevCa::new("stream CA").unwrap();
    let issued = ca.issue(&CertSpec::server(&["gateway.example"])).unwrap();
    let provider = crate::tls::provider();
    let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![issued.cert_der.clone()], issued.key_der())
        .unwrap();
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert_der()).unwrap();
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    (Arc::new(server), Arc::new(client))
}

/// A handshake over loopback, the client naming `name`.
async fn ends(name: &str) -> Ends {
    let (server, client) = configs();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let name = ServerName::try_from(name.to_owned()).unwrap();
    let connecting = tokio::spawn(async move {
        let tcp = TcpStream::connect(addr).await.unwrap();
        TlsConnector::from(client).connect(name, tcp).await.unwrap()
    });
    let (tcp, _) = listener.accept().await.unwrap();
    let server = crate::tls::accept::accept(tcp, server).await.unwrap();
    Ends {
        server,
        client: connecting.await.unwrap(),
    }
}

fn noop() -> Context<'static> {
    Context::from_waker(std::task::Waker::noop())
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 251) as u8).collect()
}

#[tokio::test]
async fn bytes_cross_whole_and_in_order_at_every_size() {
    let mut e = ends("Gateway.Example").await;
    assert_eq!(e.server.server_name(), Some("gateway.example"));
    assert_eq!(e.server.session().alpn_protocol(), Some(&b"http/1.1"[..]));
    for n in [1, 400, 4096, 16 * 1024, 16 * 1024 + 1, 100_000, 300_000] {
        let sent = pattern(n);
        let (mut client, mut server) = (e.client, e.server);
        let writer = {
            let sent = sent.clone();
            tokio::spawn(async move {
                client.write_all(&sent).await.unwrap();
                client.flush().await.unwrap();
                client
            })
        };
        // Read through a small window: records larger than the reader's room are kept
        // and given in order.
        let mut got = vec![0; n];
        let mut at = 0;
        while at < n {
            let end = (at + 1000).min(n);
            let r = server.read(&mut got[at..end]).await.unwrap();
            assert!(r > 0);
            at += r;
        }
        assert!(got == sent, "{n} bytes from the client");
        client = writer.await.unwrap();
        // And back, in one write of the whole.
        let reader = tokio::spawn(async move {
            let mut back = vec![0; n];
            client.read_exact(&mut back).await.unwrap();
            (client, back)
        });
        server.write_all(&sent).await.unwrap();
        server.flush().await.unwrap();
        let (c, back) = reader.await.unwrap();
        assert!(back == sent, "{n} bytes to the client");
        e = Ends { server, client: c };
    }
}

#[tokio::test]
async fn an_idle_stream_holds_no_buffer_and_takes_them_again() {
    let mut e = ends("gateway.example").await;
    e.client.write_all(b"ping").await.unwrap();
    let mut four = [0; 4];
    e.server.read_exact(&mut four).await.unwrap();
    e.server.write_all(b"pong").await.unwrap();
    e.server.flush().await.unwrap();
    assert!(e.server.incoming.data.capacity() > 0);
    e.server.release();
    assert_eq!(e.server.incoming.data.capacity(), 0);
    assert_eq!(e.server.outgoing.data.capacity(), 0);
    assert_eq!(e.server.plain.data.capacity(), 0);
    e.client.read_exact(&mut four).await.unwrap();
    assert_eq!(&four, b"pong");
    e.client.write_all(b"again").await.unwrap();
    let mut five = [0; 5];
    e.server.read_exact(&mut five).await.unwrap();
    assert_eq!(&five, b"again");
}

#[tokio::test]
async fn a_partial_record_is_kept_across_a_release() {
    let mut e = ends("gateway.example").await;
    // The client's record, written to the socket in two halves around a release.
    e.client
        .get_mut()
        .1
        .writer()
        .write_all(b"split record")
        .unwrap();
    let mut record = Vec::new();
    e.client.get_mut().1.write_tls(&mut record).unwrap();
    let (first, second) = record.split_at(record.len() / 2);
    e.client.get_mut().0.write_all(first).await.unwrap();
    e.server.tcp().readable().await.unwrap();
    let mut got = [0; 12];
    let mut buf = ReadBuf::new(&mut got);
    let polled = Pin::new(&mut e.server).poll_read(&mut noop(), &mut buf);
    assert!(polled.is_pending(), "half a record makes no plaintext");
    assert_eq!(e.server.incoming.len(), first.len());
    e.server.release();
    assert!(
        e.server.incoming.data.capacity() > 0,
        "the half record stays"
    );
    e.client.get_mut().0.write_all(second).await.unwrap();
    e.server.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"split record");
}

#[tokio::test]
async fn plaintext_that_comes_while_writing_waits_for_the_reader() {
    let mut e = ends("gateway.example").await;
    // Two records in one segment: the server reads both from its socket at once.
    let mut records = Vec::new();
    for text in [&b"first"[..], b"second"] {
        e.client.get_mut().1.writer().write_all(text).unwrap();
        e.client.get_mut().1.write_tls(&mut records).unwrap();
    }
    e.client.get_mut().0.write_all(&records).await.unwrap();
    e.server.tcp().readable().await.unwrap();
    let mut buf = [0; 5];
    e.server.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"first");
    assert!(
        !e.server.incoming.is_empty(),
        "the second record is still unread"
    );
    e.server.write_all(b"answer").await.unwrap();
    e.server.flush().await.unwrap();
    let mut rest = [0; 6];
    e.server.read_exact(&mut rest).await.unwrap();
    assert_eq!(&rest, b"second");
    let mut answer = [0; 6];
    e.client.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"answer");
}

#[tokio::test]
async fn a_close_notify_ends_the_reads_and_a_bare_close_fails_them() {
    let mut e = ends("gateway.example").await;
    e.client.write_all(b"last").await.unwrap();
    e.client.shutdown().await.unwrap();
    let mut got = Vec::new();
    e.server.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"last");
    // Writing still works after the peer's close_notify; the server's own ends it.
    e.server.write_all(b"bye").await.unwrap();
    e.server.shutdown().await.unwrap();
    let mut bye = Vec::new();
    e.client.read_to_end(&mut bye).await.unwrap();
    assert_eq!(bye, b"bye");

    let mut e = ends("gateway.example").await;
    e.client.write_all(b"cut").await.unwrap();
    e.client.flush().await.unwrap();
    // A FIN without close_notify (shut, not dropped: a drop with the tickets unread
    // would reset the connection).
    let (mut tcp, _) = e.client.into_inner();
    tcp.shutdown().await.unwrap();
    let mut got = Vec::new();
    let err = e.server.read_to_end(&mut got).await.unwrap_err();
    assert_eq!(got, b"cut");
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
}

#[tokio::test]
async fn a_forged_record_fails_the_read_and_the_peer_is_told() {
    let mut e = ends("gateway.example").await;
    e.client.get_mut().1.writer().write_all(b"genuine").unwrap();
    let mut record = Vec::new();
    e.client.get_mut().1.write_tls(&mut record).unwrap();
    let last = record.len() - 1;
    record[last] ^= 1;
    e.client.get_mut().0.write_all(&record).await.unwrap();
    let mut got = [0; 7];
    let err = e.server.read(&mut got).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    let tls = err.get_ref().unwrap().downcast_ref::<rustls::Error>();
    assert!(matches!(tls, Some(rustls::Error::DecryptError)), "{err:?}");
    // And again at every later read and write, without reading the record again.
    let again = e.server.read(&mut got).await.unwrap_err();
    assert_eq!(again.kind(), io::ErrorKind::InvalidData);
    assert!(e.server.write_all(b"x").await.is_err());
    // The alert rustls queued reached the client.
    let mut buf = [0; 16];
    let told = e.client.read(&mut buf).await.unwrap_err();
    assert!(told.to_string().contains("BadRecordMac"), "{told}");
}

#[tokio::test]
async fn a_key_update_from_the_peer_is_followed() {
    let mut e = ends("gateway.example").await;
    for round in 0..3u8 {
        e.client.get_mut().1.refresh_traffic_keys().unwrap();
        e.client.write_all(&[round; 10]).await.unwrap();
        let mut got = [0; 10];
        e.server.read_exact(&mut got).await.unwrap();
        assert_eq!(got, [round; 10]);
        e.server.write_all(&[round + 10; 10]).await.unwrap();
        e.server.flush().await.unwrap();
        e.client.read_exact(&mut got).await.unwrap();
        assert_eq!(got, [round + 10; 10]);
    }
}

#[tokio::test]
async fn a_reader_that_stops_bounds_what_the_stream_holds() {
    let mut e = ends("gateway.example").await;
    let chunk = pattern(64 * 1024);
    let mut written = 0usize;
    // Polled once each time: pending only when the socket takes nothing more.
    while let Poll::Ready(n) = Pin::new(&mut e.server).poll_write(&mut noop(), &chunk) {
        written += n.unwrap();
        assert!(e.server.outgoing.len() <= WRITE_AHEAD + WRITE_CHUNK + 1024);
        assert!(written < 1 << 30, "never waited on the socket");
    }
    assert!(
        e.server.outgoing.len() >= WRITE_AHEAD,
        "waits only past the bound"
    );
    // Everything written reaches the client once it reads.
    let reader = tokio::spawn(async move {
        let mut n = 0usize;
        let mut buf = vec![0; 64 * 1024];
        while n < written {
            n += e.client.read(&mut buf).await.unwrap();
        }
        n
    });
    e.server.flush().await.unwrap();
    assert_eq!(reader.await.unwrap(), written);
}

#[tokio::test]
async fn a_hello_that_is_not_tls_fails_the_handshake() {
    let (server, _) = configs();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client = tokio::spawn(async move {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let _ = tcp.read_to_end(&mut answer).await;
        answer
    });
    let (tcp, _) = listener.accept().await.unwrap();
    let err = crate::tls::accept::accept(tcp, server).await.err().unwrap();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    // rustls's alert (a TLS record, type 21) went back.
    let answer = client.await.unwrap();
    assert_eq!(answer.first(), Some(&21), "{answer:?}");
}
