//! `idem-lab conformance-env`: what the clients' conformance suite
//! (`clients/conformance/`) runs against. A real `idem serve` on a fresh
//! database (`--key-ttl 2s`, the reconciler an hour apart), the acquirer simulator, and two endpoints that misbehave the way a
//! client must survive: `lossy`, an instance that charges and goes away before
//! answering, and `refused`, a port nobody listens on. Prints where they are as
//! one line of JSON on stdout, then runs until stdin closes or a signal comes.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::harness::{self, Started};
use crate::sim::{self, Faults};
use idem::cmd::parse_duration;

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct Args {
    /// The database server to make a fresh database on (postgres://...);
    /// without it, a fresh SQLite file of this process's own.
    #[arg(long)]
    database_url: Option<String>,
    /// `idem serve --key-ttl`: short, so a scenario can outlive a key.
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    key_ttl: Duration,
}

/// What the runners read: the first line on stdout.
#[derive(serde::Serialize)]
struct Ready {
    endpoints: Endpoints,
    simulator: String,
    secret: String,
    key_ttl_secs: u64,
}

#[derive(serde::Serialize)]
struct Endpoints {
    idem: String,
    lossy: String,
    refused: String,
}

/// A request or an answer head larger than this is not one a client of the
/// suite sends or idem gives; the lossy proxy drops such a connection.
const MAX_MESSAGE: usize = 64 * 1024;

pub(crate) async fn run(args: Args, shutdown: CancellationToken) -> anyhow::Result<()> {
    let stop = CancellationToken::new();
    let mut started = Started {
        children: Vec::new(),
        stop: stop.clone(),
    };
    let sim_listener = TcpListener::bind("127.0.0.1:0").await?;
    let simulator = format!("http://{}", sim_listener.local_addr()?);
    tokio::spawn(sim::serve(
        sim_listener,
        Faults::default(),
        None,
        stop.clone(),
    ));

    // One database per environment, so suites of several clients can run at once.
    let name = format!("idem_conformance_{}", std::process::id());
    let server = args.database_url.as_deref().unwrap_or("sqlite:");
    let db_url = harness::fresh_database(server, &name).await?;
    let key_ttl = humantime::format_duration(args.key_ttl).to_string();
    // The reconciler kept out of the way: a charge whose outcome is unknown is
    // settled by the client's retry, which is what the suite tests.
    let (mut urls, secret) = harness::start_idem(
        &db_url,
        &simulator,
        "conformance",
        1,
        &["--key-ttl", &key_ttl, "--reconcile-interval", "1h"],
        &mut started,
    )
    .await?;
    let idem = urls.pop().context("idem serve did not start")?;
    let idem_addr: SocketAddr = idem
        .trim_start_matches("http://")
        .parse()
        .context("idem's address")?;

    let lossy_listener = TcpListener::bind("127.0.0.1:0").await?;
    let lossy = format!("http://{}", lossy_listener.local_addr()?);
    tokio::spawn(serve_lossy(lossy_listener, idem_addr, stop.clone()));
    // Bound and let go: nothing listens there, so a connection is refused.
    let refused = format!(
        "http://{}",
        std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?
    );

    let ready = Ready {
        endpoints: Endpoints {
            idem,
            lossy,
            refused,
        },
        simulator,
        secret,
        key_ttl_secs: args.key_ttl.as_secs(),
    };
    let mut stdout = tokio::io::stdout();
    stdout
        .write_all(format!("{}\n", serde_json::to_string(&ready)?).as_bytes())
        .await?;
    stdout.flush().await?;
    eprintln!("idem-lab conformance-env: ready; close stdin or press Ctrl-C to stop");

    tokio::select! {
        () = stdin_closed() => {}
        () = shutdown.cancelled() => {}
    }
    drop(started);
    harness::remove_scratch_dir();
    Ok(())
}

/// Resolves when stdin reaches its end (or fails): the runner that started
/// this process is gone or done with it.
async fn stdin_closed() {
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 256];
    while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
}

/// Every connection: the request forwarded to idem whole, idem's answer
/// awaited (so the charge is made and its outcome stored), then both
/// connections closed with not one byte of the answer sent back.
async fn serve_lossy(listener: TcpListener, idem: SocketAddr, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => return,
        };
        let Ok((client, _)) = accepted else { continue };
        tokio::spawn(async move {
            if let Err(e) = lose_the_answer(client, idem).await {
                eprintln!("idem-lab conformance-env: lossy endpoint: {e:#}");
            }
        });
    }
}

async fn lose_the_answer(mut client: TcpStream, idem: SocketAddr) -> anyhow::Result<()> {
    let request = read_request(&mut client).await?;
    let mut upstream = TcpStream::connect(idem).await?;
    upstream.write_all(&request).await?;
    read_head(&mut upstream, Vec::new()).await?;
    // Dropping both sockets closes them: the client sees its connection end
    // with no answer, as from an instance that died after committing.
    Ok(())
}

/// One HTTP/1.1 request: its head and a `Content-Length` body, or a chunked
/// body up to its last chunk.
async fn read_request(stream: &mut TcpStream) -> anyhow::Result<Vec<u8>> {
    let (mut message, head_end) = read_head(stream, Vec::new()).await?;
    let head = String::from_utf8_lossy(&message[..head_end]).to_ascii_lowercase();
    let length = head.lines().find_map(|line| {
        let value = line.strip_prefix("content-length:")?;
        value.trim().parse::<usize>().ok()
    });
    let chunked = head
        .lines()
        .any(|line| line.starts_with("transfer-encoding:") && line.contains("chunked"));
    loop {
        let body = &message[head_end..];
        let complete = match length {
            Some(n) => body.len() >= n,
            None if chunked => body.ends_with(b"0\r\n\r\n"),
            None => true,
        };
        if complete {
            return Ok(message);
        }
        read_more(stream, &mut message).await?;
    }
}

/// Reads until the blank line that ends a head; returns what was read and
/// where the head ends.
async fn read_head(stream: &mut TcpStream, mut read: Vec<u8>) -> anyhow::Result<(Vec<u8>, usize)> {
    loop {
        if let Some(at) = read.windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok((read, at + 4));
        }
        read_more(stream, &mut read).await?;
    }
}

async fn read_more(stream: &mut TcpStream, into: &mut Vec<u8>) -> anyhow::Result<()> {
    anyhow::ensure!(
        into.len() < MAX_MESSAGE,
        "a message over {MAX_MESSAGE} bytes"
    );
    let mut buf = [0u8; 8192];
    let n = stream.read(&mut buf).await?;
    anyhow::ensure!(n > 0, "the peer closed the connection mid-message");
    into.extend_from_slice(&buf[..n]);
    Ok(())
}
