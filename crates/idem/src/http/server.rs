//! The server loop: accepts connections on a bound listener and serves each
//! with hyper's HTTP/1.1 connection, under limits a hostile client cannot lift.
//!
//! `axum::serve` runs hyper without a timer, so hyper's header-read timeout is
//! off there and a client that never finishes its request head holds its
//! connection (a task, a buffer, a file descriptor) for ever. This loop is
//! axum's own, with the timer installed (as axum's `serve-with-hyper` example
//! and hyper-util's `server_graceful` example build it):
//!
//! - **Head deadline.** A connection must deliver a complete request head
//!   within [`Limits::header_read_timeout`], counted from when it opened or from
//!   when its previous answer went out. hyper has one timer for both, so this
//!   one value is also the keep-alive idle timeout (hyper#3828): a connection
//!   idle that long is closed, and a load balancer in front must close idle
//!   connections sooner, or it may reuse one the instance is closing. HTTP/1.1
//!   only (what axum's features build), served without protocol sniffing: an
//!   `auto` connection reads bytes to tell HTTP/1 from HTTP/2 before any
//!   timer runs, so a client that sends nothing would never time out.
//! - **Requests in flight.** At most [`Limits::max_in_flight`] `/v1` requests are
//!   worked at once; one more is answered at once with `503 overloaded` and
//!   `Retry-After`, never queued (tower's `ConcurrencyLimit` under `LoadShed`,
//!   in [`super::router_with`]). Operational routes are not counted, so a health
//!   check still answers while the API sheds.
//! - **TLS**, when given ([`Tls`]): the handshake runs on the connection's
//!   own task, under the head deadline too. idem's API is meant to sit behind
//!   a load balancer that terminates TLS; the simulator serves HTTPS through
//!   this, as a real acquirer does.
//! - **Shutdown.** When `shutdown` fires the listener is closed at once, each
//!   connection finishes the request it is in and is then closed (hyper's
//!   graceful shutdown), and [`run`] returns when the last one has.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// How long a connection may take to deliver a request head, from when it
/// opened or its previous answer went out; also the keep-alive idle timeout.
/// hyper's own default: a head of a few hundred bytes takes milliseconds even
/// on a poor mobile link, so this is slack for a pooled client's idle
/// connection between bursts, while a client that stalls gives its socket back
/// within half a minute.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// `/v1` requests worked at once before more are shed with `503`. A charge in
/// flight mostly waits on the acquirer, holding a task and a body of at most
/// 16 KiB (16 MiB for all of them) but no database connection. By Little's
/// law, one instance's measured ~1,000–1,500 new charges/s (docs/benchmarks.md)
/// against an acquirer answering in 200 ms keep about 300 in flight; 1024
/// leaves room for bursts, so only a slow acquirer or a flood reaches it, and
/// then the instance answers at once instead of piling up work it cannot finish.
pub const MAX_IN_FLIGHT: usize = 1024;

/// Requests that wait at once for a duplicate's outcome (`Prefer: wait`)
/// before more are shed with `503`: a quarter of [`MAX_IN_FLIGHT`], so that
/// waiting, which holds a request slot but no database connection, can never
/// take more than a quarter of the instance's room for work.
pub const MAX_WAITERS: usize = MAX_IN_FLIGHT / 4;

/// After a failed `accept` that is not the client's doing (out of file
/// descriptors, say), the pause before the next: long enough not to spin on
/// the error, short enough to be back as soon as descriptors free up.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// The limits a server holds its clients to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long a client waits for an answer before `504`; the charge attempt
    /// itself carries on to the end regardless.
    pub request_timeout: Duration,
    /// See [`HEADER_READ_TIMEOUT`].
    pub header_read_timeout: Duration,
    /// See [`MAX_IN_FLIGHT`].
    pub max_in_flight: usize,
    /// See [`MAX_WAITERS`].
    pub max_waiters: usize,
}

impl Limits {
    /// The given request timeout, and the defaults for the rest.
    pub fn new(request_timeout: Duration) -> Self {
        Self {
            request_timeout,
            header_read_timeout: HEADER_READ_TIMEOUT,
            max_in_flight: MAX_IN_FLIGHT,
            max_waiters: MAX_WAITERS,
        }
    }
}

/// A server's TLS: its certificate chain and key, loaded once.
#[derive(Clone)]
pub struct Tls(TlsAcceptor);

impl Tls {
    /// From PEM files: `cert` holds the chain (the server's certificate
    /// first), `key` its private key. rustls with ring; TLS 1.2 and 1.3.
    pub fn from_pem_files(cert: &Path, key: &Path) -> anyhow::Result<Self> {
        let chain = CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .with_context(|| format!("reading certificates from {}", cert.display()))?;
        anyhow::ensure!(!chain.is_empty(), "{} holds no certificate", cert.display());
        let key = PrivateKeyDer::from_pem_file(key)
            .with_context(|| format!("reading a private key from {}", key.display()))?;
        let config = ServerConfig::builder_with_provider(Arc::new(
            tokio_rustls::rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("the certificate and the key do not make a server identity")?;
        Ok(Self(TlsAcceptor::from(Arc::new(config))))
    }

    /// The acceptor, for a server loop of another kind (a test's TLS proxy).
    pub fn acceptor(&self) -> &TlsAcceptor {
        &self.0
    }
}

/// Serves `app` on `listener` until `shutdown` fires, then lets every
/// connection finish the request it is in, and returns once all are closed.
/// With `tls`, each connection first completes a TLS handshake, within the
/// same `header_read_timeout` as a request head, so a client that stalls in
/// its handshake is cut off like one that stalls in its head.
pub async fn run(
    listener: TcpListener,
    app: Router,
    header_read_timeout: Duration,
    tls: Option<Tls>,
    shutdown: CancellationToken,
) {
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let graceful = GracefulShutdown::new();
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
        };
        let service = TowerToHyperService::new(app.clone());
        let Some(tls) = &tls else {
            let connection = graceful.watch(http1.serve_connection(TokioIo::new(stream), service));
            tokio::spawn(async move {
                // A client that stalls, hangs up or breaks the protocol ends its
                // own connection; nothing to do for it but note it.
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
            });
            continue;
        };
        let (acceptor, http1, watcher) = (tls.0.clone(), http1.clone(), graceful.watcher());
        tokio::spawn(async move {
            let stream =
                match tokio::time::timeout(header_read_timeout, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!("TLS handshake timed out");
                        return;
                    }
                };
            let connection = watcher.watch(http1.serve_connection(TokioIo::new(stream), service));
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Errors of one connection, not of the listener: the next accept is fine.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}
