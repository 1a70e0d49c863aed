//! A Leader connection's TLS handshake on the gateway's stream ([`super::stream`]): the
//! server name read from its ClientHello by rustls's own `Acceptor` (rustls's unbuffered
//! connection does not tell it), then the handshake by rustls's unbuffered connection.

use std::io;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use rustls::server::Acceptor;
use tokio::net::TcpStream;

use super::stream::ServerStream;

/// The handshake of `tcp` under `config` (the caller bounds it in time).
pub(crate) async fn accept(
    tcp: TcpStream,
    config: Arc<rustls::ServerConfig>,
) -> io::Result<ServerStream> {
    let mut stream = ServerStream::new(tcp, config)?;
    let mut hello = Hello::default();
    let name = std::future::poll_fn(|cx| hello.poll_server_name(&mut stream, cx)).await?;
    drop(hello);
    stream.set_server_name(name);
    std::future::poll_fn(|cx| stream.poll_handshake(cx)).await?;
    Ok(stream)
}

/// The first ClientHello, read by rustls's `Acceptor` from a copy of the bytes the
/// connection has read so far (rustls takes the same bytes afterwards; the handshake's
/// own processing of them is unchanged).
#[derive(Default)]
struct Hello {
    acceptor: Acceptor,
    /// Bytes of the connection's read buffer already given to `acceptor`.
    fed: usize,
}

impl Hello {
    /// The ClientHello's server name, lowercased (as `ServerConnection::server_name`
    /// gives it: both come from rustls's one reading of the hello). `None` also for a
    /// hello the `Acceptor` refuses: the handshake refuses it then, with its alert.
    fn poll_server_name(
        &mut self,
        stream: &mut ServerStream,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<Option<String>>> {
        loop {
            let mut new = &stream.unread()[self.fed..];
            while !new.is_empty() {
                match self.acceptor.read_tls(&mut new) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(_) => return Poll::Ready(Ok(None)),
                }
            }
            self.fed = stream.unread().len();
            match self.acceptor.accept() {
                Ok(Some(accepted)) => {
                    let name = accepted.client_hello().server_name().map(str::to_owned);
                    return Poll::Ready(Ok(name));
                }
                Ok(None) => {
                    if ready!(stream.poll_fill(cx))? == 0 {
                        return Poll::Ready(Ok(None));
                    }
                }
                Err(_) => return Poll::Ready(Ok(None)),
            }
        }
    }
}
