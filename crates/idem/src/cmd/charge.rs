//! `idem charge`: sends one charge with the retrying client (`idem-client`)
//! and prints the final answer.

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct Args {
    /// The merchant's order number.
    #[arg(long)]
    pub(crate) order: i64,
    /// The amount in cents.
    #[arg(long)]
    pub(crate) amount: i64,
    /// ISO 4217 code; the server's default (BRL) when absent.
    #[arg(long)]
    pub(crate) currency: Option<String>,
    /// The Idempotency-Key; a fresh random one when absent (one per intent).
    #[arg(long)]
    pub(crate) key: Option<String>,
    /// The API's base URL; repeat for several instances.
    #[arg(
        long = "url",
        env = "IDEM_URL",
        default_value = "http://127.0.0.1:8080",
        value_delimiter = ','
    )]
    pub(crate) urls: Vec<String>,
    /// The merchant's secret.
    #[arg(long, env = "IDEM_SECRET", hide_env_values = true)]
    pub(crate) secret: String,
}

/// One intent through the retrying client.
pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let client =
        idem_client::Client::new(args.urls, args.secret, idem_client::RetryPolicy::default())?;
    let request = idem_client::ChargeRequest {
        order_id: args.order,
        amount_cents: args.amount,
        currency: args.currency,
        description: None,
    };
    let answer = match &args.key {
        Some(key) => client.charge_with_key(key, &request).await?,
        None => client.charge(&request).await?,
    };
    eprintln!(
        "key {} · {} attempt(s) · status {}{}",
        answer.key,
        answer.attempts.len(),
        answer.status,
        if answer.replayed { " · replayed" } else { "" }
    );
    println!("{}", String::from_utf8_lossy(&answer.body));
    anyhow::ensure!(
        (200..300).contains(&answer.status),
        "the charge was not captured (status {})",
        answer.status
    );
    Ok(())
}
