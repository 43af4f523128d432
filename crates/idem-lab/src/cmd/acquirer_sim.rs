//! `idem-lab acquirer-sim`: the acquirer simulator (`crate::sim`), with the
//! faults its flags inject.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::sim::{self, Fault, Faults};
use idem::cmd::parse_duration;
use idem::http;

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct Args {
    /// Address to listen on.
    #[arg(long, env = "IDEM_SIM_LISTEN", default_value = "127.0.0.1:9090")]
    pub(crate) listen: SocketAddr,
    /// Delay before each call that POSTs is processed (with --latency-p99, the median).
    #[arg(long, env = "IDEM_SIM_LATENCY", value_parser = parse_duration, default_value = "0ms")]
    pub(crate) latency: Duration,
    /// Draw each call's delay from a lognormal with --latency as its median
    /// and this as its 99th percentile, as a real acquirer's spread.
    #[arg(long, env = "IDEM_SIM_LATENCY_P99", value_parser = parse_duration)]
    pub(crate) latency_p99: Option<Duration>,
    /// Chance, 0.0 to 1.0, that a new one-step capture or authorization is declined.
    #[arg(long, env = "IDEM_SIM_DECLINE_RATE", default_value_t = 0.0, value_parser = parse_rate)]
    pub(crate) decline_rate: f64,
    /// Fault to inject into capture, refund, authorization and void calls:
    /// none, error-before, error-after, hang, drop-after, status:N (answer
    /// status N without capturing), a lie: wrong-amount, wrong-currency,
    /// wrong-order (capture that, and say so), refuse-paid (a refund, a
    /// capture of an authorization or a void already made answers 422),
    /// lenient-refunds (refunds paid past what the capture has left), or
    /// lenient-captures (captures of an authorization made past what it has
    /// left).
    #[arg(long, env = "IDEM_SIM_FAULT", default_value_t = Fault::None)]
    pub(crate) fault: Fault,
    /// Chance, 0.0 to 1.0, that a call with no --fault suffers a random one:
    /// a timeout (hang), error-before or error-after, one in three each.
    #[arg(long, env = "IDEM_SIM_FAULT_RATE", default_value_t = 0.0, value_parser = parse_rate)]
    pub(crate) fault_rate: f64,
    /// Apply the fault to this many calls only (default: every call).
    #[arg(long, env = "IDEM_SIM_FAULT_COUNT")]
    pub(crate) fault_count: Option<u64>,
    /// How long the `hang` fault withholds its answer.
    #[arg(long, env = "IDEM_SIM_HANG", value_parser = parse_duration, default_value = "120s")]
    pub(crate) hang: Duration,
    /// Serve HTTPS with this certificate chain (PEM, the server's first); needs --tls-key.
    #[arg(long, env = "IDEM_SIM_TLS_CERT", requires = "tls_key")]
    pub(crate) tls_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "IDEM_SIM_TLS_KEY", requires = "tls_cert")]
    pub(crate) tls_key: Option<std::path::PathBuf>,
    /// The Retry-After, in seconds, that a status:N fault sends (e.g. with 429).
    #[arg(long, env = "IDEM_SIM_RETRY_AFTER")]
    pub(crate) retry_after_secs: Option<u64>,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err("a rate is a number from 0.0 to 1.0".to_owned()),
    }
}

/// Starts the simulator on its configured address and runs it until `shutdown`.
pub(crate) async fn run(args: Args, shutdown: CancellationToken) -> anyhow::Result<()> {
    let faults = Faults {
        latency_ms: u64::try_from(args.latency.as_millis())?,
        latency_p99_ms: args
            .latency_p99
            .map(|p99| u64::try_from(p99.as_millis()))
            .transpose()?,
        decline_rate: args.decline_rate,
        fault: args.fault,
        fault_count: args.fault_count,
        hang_ms: u64::try_from(args.hang.as_millis())?,
        retry_after_secs: args.retry_after_secs,
        fault_rate: args.fault_rate,
    };
    faults.check().map_err(anyhow::Error::msg)?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(http::Tls::from_pem_files(cert, key)?),
        _ => None,
    };
    tracing::info!(listen = %listener.local_addr()?, https = tls.is_some(), ?faults,
        "acquirer simulator listening");
    sim::serve(listener, faults, tls, shutdown).await
}
