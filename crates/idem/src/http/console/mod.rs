//! The operator console (`idem serve --admin-listen ADDR`): server-rendered
//! pages, no JavaScript, no asset from anywhere but itself. It finds any
//! charge and shows its story ([`charge`]), and its front page shows the charges
//! awaiting review (with "retry" and "resolve", the very operations of `idem
//! charges`, audited under the token's name), the oldest `processing` charges,
//! the outbox backlog, the merchants and their secrets' expiry, the webhook
//! endpoints with their latest deliveries (with "send again", as `idem
//! webhooks redeliver`), and the last day's outcomes as a chart.
//!
//! Signing in: a token (`--admin-token`, or one made by `idem admin token`)
//! posted once to `/login` becomes an `HttpOnly`, `SameSite=Strict` cookie;
//! every request checks it again (a token hash, one indexed read), so a
//! deleted token stops working at once. `SameSite=Strict` keeps other sites'
//! pages from posting the console's forms with it (cross-site request
//! forgery). Actions are `POST`s answered `303 See Other` back to the page,
//! with what came of them in the address.

mod charge;

use std::time::Duration;

use axum::extract::{Form, FromRequestParts, Path, Query, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, COOKIE, LOCATION, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use chrono::Utc;
use maud::{html, Markup, DOCTYPE};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use idem_core::domain::{CaptureIntent, ChargeRequest, RefundIntent, SecretHash, VoidIntent};
use idem_core::idempotency::{Engine, Outcome, Resolution};
use idem_core::store::{
    Audit, ChargeFilter, ChargeSummary, DeliveryInfo, EndpointInfo, MerchantListing, Store,
    StuckRefund,
};

/// The cookie that carries the console token.
const COOKIE_NAME: &str = "idem_admin";

/// Rows per list on the page.
const LIST_LIMIT: i64 = 50;

/// The window of the outcome chart.
const CHART_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// The actor of actions signed in with `--admin-token`, which has no name.
const FLAG_TOKEN_ACTOR: &str = "console (--admin-token)";

const CSS: &str = include_str!("console.css");

#[derive(Clone)]
struct Console {
    /// Retries and resolutions: the engine's decisions.
    engine: Engine,
    /// What the page shows, the tokens, the webhook redeliveries.
    store: Store,
    /// `--admin-token`, hashed.
    flag_token: Option<SecretHash>,
}

/// Serves the console on `listener` until `shutdown`.
pub async fn serve_console(
    listener: TcpListener,
    engine: Engine,
    store: Store,
    flag_token: Option<String>,
    shutdown: CancellationToken,
) {
    let console = Console {
        engine,
        store,
        flag_token: flag_token.map(|t| SecretHash::of(t.trim().as_bytes())),
    };
    let app = Router::new()
        .route("/", get(page))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/charges", get(charge::search))
        .route("/charges/{id}", get(charge::charge_page))
        .route("/{kind}/{id}/retry", post(retry))
        .route("/{kind}/{id}/resolve", post(resolve))
        .route("/webhooks/{event_id}/redeliver", post(redeliver))
        .route("/console.css", get(css))
        .with_state(console);
    super::run_server(listener, app, super::HEADER_READ_TIMEOUT, None, shutdown).await;
}

/// A signed-in operator: the actor their actions are audited as.
struct Operator(String);

impl FromRequestParts<Console> for Operator {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, console: &Console) -> Result<Self, Response> {
        let token = parts
            .headers
            .get_all(COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().split_once('='))
            .find(|(name, _)| *name == COOKIE_NAME)
            .map(|(_, value)| value.to_owned());
        match token {
            Some(token) => match console.actor(&token).await {
                Ok(Some(actor)) => Ok(Self(actor)),
                Ok(None) => Err(see_other("/login?error=signed-out")),
                Err(e) => Err(unavailable(&e)),
            },
            None => Err(see_other("/login")),
        }
    }
}

impl Console {
    /// Who `token` stands for: the flag's, or a named token's; `None` if neither.
    async fn actor(&self, token: &str) -> Result<Option<String>, idem_core::store::StoreError> {
        let hash = SecretHash::of(token.trim().as_bytes());
        if self.flag_token == Some(hash) {
            return Ok(Some(FLAG_TOKEN_ACTOR.to_owned()));
        }
        self.store.admin_token_name(&hash).await
    }
}

fn see_other(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(LOCATION, v);
    }
    r
}

fn unavailable(e: &dyn std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "console: the database did not answer");
    let body = layout(
        "idem console",
        html! { p.notice.bad { "The database did not answer. Reload in a moment." } },
    );
    (StatusCode::SERVICE_UNAVAILABLE, Html(body.into_string())).into_response()
}

async fn css() -> Response {
    (
        [
            (CONTENT_TYPE, "text/css; charset=utf-8"),
            (CACHE_CONTROL, "max-age=300"),
        ],
        CSS,
    )
        .into_response()
}

#[derive(serde::Deserialize)]
struct LoginQuery {
    error: Option<String>,
}

async fn login_page(Query(q): Query<LoginQuery>) -> Html<String> {
    let error = match q.error.as_deref() {
        Some("wrong-token") => Some("That token is not one of this deployment's."),
        Some("signed-out") => Some("Your token no longer works; sign in again."),
        _ => None,
    };
    Html(
        layout(
            "Sign in · idem console",
            html! {
                h1 { "idem console" }
                @if let Some(error) = error { p.notice.bad { (error) } }
                form method="post" action="/login" {
                    label for="token" { "Console token" }
                    input #token type="password" name="token" autocomplete="off" required;
                    button type="submit" { "Sign in" }
                }
                p.hint { "A token comes from " code { "idem admin token" } " or the server's " code { "--admin-token" } "." }
            },
        )
        .into_string(),
    )
}

#[derive(serde::Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(State(console): State<Console>, Form(form): Form<LoginForm>) -> Response {
    match console.actor(&form.token).await {
        Ok(Some(actor)) => {
            tracing::info!(actor, "console: signed in");
            let mut r = see_other("/");
            let cookie = format!(
                "{COOKIE_NAME}={}; HttpOnly; SameSite=Strict; Path=/",
                form.token.trim()
            );
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().insert(SET_COOKIE, v);
            }
            r
        }
        Ok(None) => see_other("/login?error=wrong-token"),
        Err(e) => unavailable(&e),
    }
}

async fn logout() -> Response {
    let mut r = see_other("/login");
    r.headers_mut().insert(
        SET_COOKIE,
        HeaderValue::from_static("idem_admin=; Max-Age=0; HttpOnly; SameSite=Strict; Path=/"),
    );
    r
}

#[derive(serde::Deserialize)]
struct Notice {
    done: Option<String>,
    failed: Option<String>,
}

async fn retry(
    State(console): State<Console>,
    Operator(actor): Operator,
    Path((kind, id)): Path<(String, String)>,
) -> Response {
    let audit = Audit {
        actor: &actor,
        reason: None,
    };
    let engine = &console.engine;
    let result = match kind.as_str() {
        "charges" => engine.retry::<ChargeRequest>(&id, audit).await,
        "refunds" => engine.retry::<RefundIntent>(&id, audit).await,
        "captures" => engine.retry::<CaptureIntent>(&id, audit).await,
        "voids" => engine.retry::<VoidIntent>(&id, audit).await,
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    acted(&id, result)
}

#[derive(serde::Deserialize)]
struct ResolveForm {
    #[serde(rename = "as")]
    resolution: String,
    reason: String,
}

async fn resolve(
    State(console): State<Console>,
    Operator(actor): Operator,
    Path((kind, id)): Path<(String, String)>,
    Form(form): Form<ResolveForm>,
) -> Response {
    // What the money did, in the subject's own word.
    let succeeded = match kind.as_str() {
        "charges" => "captured",
        "refunds" | "captures" | "voids" => "succeeded",
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    let resolution = match form.resolution.as_str() {
        word if word == succeeded => Resolution::Succeeded,
        "failed" => Resolution::Failed,
        _ => return back_with("failed", &format!("{id}: choose {succeeded} or failed")),
    };
    let reason = form.reason.trim();
    if reason.is_empty() {
        return back_with("failed", &format!("{id}: say why (the reason is audited)"));
    }
    let audit = Audit {
        actor: &actor,
        reason: Some(reason),
    };
    let engine = &console.engine;
    let result = match kind.as_str() {
        "charges" => {
            engine
                .resolve::<ChargeRequest>(&id, resolution, audit)
                .await
        }
        "captures" => {
            engine
                .resolve::<CaptureIntent>(&id, resolution, audit)
                .await
        }
        "voids" => engine.resolve::<VoidIntent>(&id, resolution, audit).await,
        _ => engine.resolve::<RefundIntent>(&id, resolution, audit).await,
    };
    acted(&id, result)
}

async fn redeliver(
    State(console): State<Console>,
    Operator(actor): Operator,
    Path(event_id): Path<String>,
) -> Response {
    let audit = Audit {
        actor: &actor,
        reason: None,
    };
    match console.store.redeliver_webhook(&event_id, &audit).await {
        Ok(0) => back_with(
            "failed",
            &format!("{event_id}: nothing to send again (still being sent?)"),
        ),
        Ok(n) => back_with("done", &format!("{event_id}: {n} deliveries to send again")),
        Err(e) => back_with("failed", &e.to_string()),
    }
}

/// Back to the page, saying what an action came to.
fn acted(id: &str, result: Result<Outcome, idem_core::idempotency::OperatorError>) -> Response {
    match result {
        Ok(Outcome::Completed { response, .. }) => back_with(
            "done",
            &format!("{id}: final; answer {} stored", response.status),
        ),
        Ok(Outcome::Unknown { .. }) => back_with(
            "failed",
            &format!("{id}: the acquirer's outcome is still unknown"),
        ),
        Ok(Outcome::UnderReview { .. }) => back_with(
            "failed",
            &format!("{id}: the acquirer's answer still cannot settle it; it awaits review"),
        ),
        Ok(other) => back_with(
            "failed",
            &format!("{id}: another attempt holds it ({})", other.label()),
        ),
        Err(e) => back_with("failed", &e.to_string()),
    }
}

fn back_with(kind: &str, message: &str) -> Response {
    let query = serde_urlencoded::to_string([(kind, message)]).unwrap_or_default();
    see_other(&format!("/?{query}"))
}

async fn page(
    State(console): State<Console>,
    Operator(actor): Operator,
    Query(notice): Query<Notice>,
) -> Response {
    let store = &console.store;
    let review = ChargeFilter {
        awaiting_review: true,
        oldest_first: true,
        limit: LIST_LIMIT,
        ..ChargeFilter::default()
    };
    let processing = ChargeFilter {
        status: Some(idem_core::domain::ChargeStatus::Processing),
        oldest_first: true,
        limit: 10,
        ..ChargeFilter::default()
    };
    let loaded = async {
        Ok::<_, idem_core::store::StoreError>((
            store.charges(&review).await?,
            store.stuck_refunds().await?,
            store.charges(&processing).await?,
            store.outbox_backlog().await?,
            store.merchant_listing().await?,
            store.outcome_counts(CHART_WINDOW).await?,
            store.webhook_endpoints().await?,
            store.webhook_deliveries(LIST_LIMIT).await?,
        ))
    }
    .await;
    let (review, refunds, processing, backlog, listing, counts, endpoints, deliveries) =
        match loaded {
            Ok(l) => l,
            Err(e) => return unavailable(&e),
        };
    let merchant_names: Vec<String> = listing.iter().map(|m| m.merchant.name.clone()).collect();
    let body = html! {
        header {
            h1 { "idem console" }
            form.logout method="post" action="/logout" {
                span { "Signed in as " strong { (actor) } }
                button type="submit" { "Sign out" }
            }
        }
        @if let Some(done) = &notice.done { p.notice.good role="status" { (done) } }
        @if let Some(failed) = &notice.failed { p.notice.bad role="alert" { (failed) } }
        (charge::search_form(&merchant_names, "", ""))
        (review_section(&review))
        (refund_review_section(&refunds))
        (processing_section(&processing))
        section #outbox {
            h2 { "Outbox" }
            p { strong { (backlog.0) } " message(s) waiting to be published; the oldest for "
                (format!("{:.0}", backlog.1)) " s." }
        }
        (merchants_section(&listing))
        (webhooks_section(&endpoints, &deliveries))
        (chart_section(&counts))
    };
    Html(layout("idem console", body).into_string()).into_response()
}

fn layout(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) }
                link rel="stylesheet" href="/console.css";
            }
            body { main { (body) } }
        }
    }
}

fn money(c: &ChargeSummary) -> String {
    cents(c.amount_cents, &c.currency)
}

/// An amount in cents as money: `250.00 BRL`.
fn cents(amount_cents: i64, currency: &str) -> String {
    format!(
        "{}.{:02} {currency}",
        amount_cents / 100,
        amount_cents % 100
    )
}

fn review_section(charges: &[ChargeSummary]) -> Markup {
    html! {
        section #review {
            h2 { "Awaiting review (" (charges.len()) ")" }
            @if charges.is_empty() {
                p.empty { "No charge awaits a person." }
            } @else {
                p.hint { "Past the settle deadline with no outcome at the acquirer. Retry asks the acquirer again (and captures under the same reference only if it has nothing); resolve records what the acquirer's own records show." }
                table {
                    thead { tr { th { "charge" } th { "merchant" } th { "order" } th { "amount" } th { "since" } th { "why" } th { "act" } } }
                    tbody {
                        @for c in charges {
                            tr data-charge=(c.id) {
                                td { code { (c.id) } }
                                td { (c.merchant) }
                                td { (c.order_id) }
                                td.num { (money(c)) }
                                td { (c.review_since.map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string()).unwrap_or_default()) }
                                td { (c.review_reason.as_deref().unwrap_or("")) }
                                (actions(&format!("/charges/{}", c.id), "captured"))
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A subject's retry and resolve buttons; `succeeded`: what the money did,
/// in its own word (a charge `captured`, a refund `succeeded`).
fn actions(path: &str, succeeded: &str) -> Markup {
    html! {
        td.actions {
            form method="post" action=(format!("{path}/retry")) {
                button.retry type="submit" { "Retry" }
            }
            form.resolve method="post" action=(format!("{path}/resolve")) {
                select name="as" aria-label="resolve as" {
                    option value=(succeeded) { (succeeded) }
                    option value="failed" { "failed" }
                }
                input type="text" name="reason" placeholder="reason (audited)" required;
                button.resolve type="submit" { "Resolve" }
            }
        }
    }
}

fn refund_review_section(refunds: &[StuckRefund]) -> Markup {
    html! {
        section #refund-review {
            h2 { "Refunds awaiting review (" (refunds.len()) ")" }
            @if refunds.is_empty() {
                p.empty { "No refund awaits a person." }
            } @else {
                p.hint { "The acquirer's answer contradicted the refund, or it had none by the settle deadline; its amount stays reserved against its charge. Retry asks the acquirer again (and refunds under the same reference only if it has nothing); resolve records what the acquirer's own records show (failed gives the amount back)." }
                table {
                    thead { tr { th { "refund" } th { "charge" } th { "merchant" } th { "amount" } th { "since" } th { "why" } th { "act" } } }
                    tbody {
                        @for r in refunds {
                            tr data-refund=(r.id) {
                                td { code { (r.id) } }
                                td { code { (r.charge_id) } }
                                td { (r.merchant) }
                                td.num { (cents(r.amount_cents, &r.currency)) }
                                td { (r.review_since.format("%Y-%m-%d %H:%M UTC")) }
                                td { (r.review_reason.as_deref().unwrap_or("")) }
                                (actions(&format!("/refunds/{}", r.id), "succeeded"))
                            }
                        }
                    }
                }
            }
        }
    }
}

fn processing_section(charges: &[ChargeSummary]) -> Markup {
    let now = Utc::now();
    html! {
        section #processing {
            h2 { "Oldest processing" }
            @if charges.is_empty() {
                p.empty { "No charge is processing." }
            } @else {
                table {
                    thead { tr { th { "charge" } th { "merchant" } th { "order" } th { "amount" } th { "age" } th { "state" } } }
                    tbody {
                        @for c in charges {
                            tr {
                                td { code { (c.id) } }
                                td { (c.merchant) }
                                td { (c.order_id) }
                                td.num { (money(c)) }
                                td.num { (humantime::format_duration(Duration::from_secs((now - c.created_at).num_seconds().max(0).unsigned_abs()))) }
                                td { @if c.review_since.is_some() { "awaiting review" } @else { "the reconciler is on it" } }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn merchants_section(listing: &[MerchantListing]) -> Markup {
    let now = Utc::now();
    html! {
        section #merchants {
            h2 { "Merchants" }
            table {
                thead { tr { th { "name" } th { "state" } th { "secrets" } } }
                tbody {
                    @for t in listing {
                        tr {
                            td { (t.merchant.name) }
                            td { @match t.disabled_at { Some(at) => { "disabled since " (at.format("%Y-%m-%d %H:%M UTC")) }, None => "enabled" } }
                            td {
                                ul.secrets {
                                    @for s in &t.secrets {
                                        li {
                                            "#" (s.id) " made " (s.created_at.format("%Y-%m-%d")) ": "
                                            @match s.expires_at {
                                                None => "live",
                                                Some(at) if at > now => { "live until " (at.format("%Y-%m-%d %H:%M UTC")) },
                                                Some(at) => { "expired " (at.format("%Y-%m-%d %H:%M UTC")) },
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The endpoints, and the latest deliveries with what each last met; a
/// delivery that is over (delivered or failed) can be sent again.
fn webhooks_section(endpoints: &[EndpointInfo], deliveries: &[DeliveryInfo]) -> Markup {
    html! {
        section #webhooks {
            h2 { "Webhooks" }
            table.endpoints {
                thead { tr { th { "endpoint" } th { "merchant" } th { "url" } th { "events" } th { "state" } } }
                tbody {
                    @for e in endpoints {
                        tr data-endpoint=(e.id) {
                            td { (e.id) }
                            td { (e.merchant) }
                            td { (e.url) }
                            td { (e.events.as_ref().map_or_else(|| "all".to_owned(), |e| e.join(", "))) }
                            td { @match e.disabled_at { Some(at) => { "disabled since " (at.format("%Y-%m-%d %H:%M UTC")) }, None => "enabled" } }
                        }
                    }
                }
            }
            h3 { "Latest deliveries" }
            table.deliveries {
                thead { tr { th { "event" } th { "endpoint" } th { "type" } th { "state" } th { "attempts" } th { "last answer" } th {} } }
                tbody {
                    @for d in deliveries {
                        tr data-event=(d.event_id) data-state=(d.state) {
                            td { (d.event_id) }
                            td { (d.endpoint_id) }
                            td { (d.event_type) }
                            td { (d.state) @if d.state == "pending" { " (next " (d.next_attempt_at.format("%H:%M:%S UTC")) ")" } }
                            td { (d.attempts) }
                            td { (d.last_error.clone().or_else(|| d.last_status.map(|s| s.to_string())).unwrap_or_default()) }
                            td {
                                @if d.state != "pending" {
                                    form method="post" action=(format!("/webhooks/{}/redeliver", d.event_id)) {
                                        button.redeliver type="submit" { "Send again" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Charges of the last day by status, as horizontal bars in inline SVG.
fn chart_section(counts: &[(String, i64)]) -> Markup {
    const WIDTH: i64 = 400;
    const ROW: i64 = 28;
    let max = counts.iter().map(|(_, n)| *n).max().unwrap_or(0).max(1);
    let height = ROW * i64::try_from(counts.len()).unwrap_or(0).max(1);
    html! {
        section #outcomes {
            h2 { "Outcomes, last 24 h" }
            @if counts.is_empty() {
                p.empty { "No charge in the last 24 hours." }
            } @else {
                svg width=(WIDTH + 200) height=(height) role="img" aria-label="charges by status, last 24 hours" {
                    @for (i, (status, n)) in counts.iter().enumerate() {
                        @let y = ROW * i64::try_from(i).unwrap_or(0);
                        text x="0" y=(y + 18) { (status) }
                        rect class=(format!("bar {status}")) x="100" y=(y + 4) height="20" width=((WIDTH * n / max).max(1)) {}
                        text x=(110 + WIDTH * n / max) y=(y + 18) { (n) }
                    }
                }
            }
        }
    }
}
