//! The console finds any charge: a search by charge id, refund id, order id
//! or idempotency key (the merchant chosen or typed), and a charge's page with
//! its story: the charge, its key record (how many attempts held it, its
//! stored answer), its refunds, the webhook deliveries of the events about it
//! and its refunds, and what the reconciler and the operators did to it and
//! to its refunds (the audit trail, in time order), with retry and
//! resolve where it, or one of its refunds, awaits a person. The same reads
//! as `idem charges list` and `idem charges show`.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{html, Markup};

use idem_core::domain::{
    Authorization, CaptureIntent, Charge, ChargeId, ChargeRequest, Merchant, Refund, RefundIntent,
    Step, StepKind, VoidIntent,
};
use idem_core::idempotency::AcquirerWord;
use idem_core::store::{
    AuditRecord, ChargeFilter, ChargeRecord, ChargeSummary, DeliveryInfo, StoreError,
};

use super::{actions, cents, layout, see_other, unavailable, Console, Operator, LIST_LIMIT};

/// Audit records a page shows per subject, newest first.
const HISTORY_LIMIT: i64 = 100;

#[derive(serde::Deserialize)]
pub(super) struct SearchQuery {
    /// The merchant's name; empty for any.
    merchant: Option<String>,
    q: Option<String>,
}

/// What a search's text names.
enum Sought {
    Charge(String),
    Refund(String),
    /// A capture's or a void's id.
    Step(String),
    Order(i64),
    Key(String),
}

impl Sought {
    fn of(q: &str) -> Self {
        if q.starts_with("ch_") {
            Self::Charge(q.to_owned())
        } else if q.starts_with("re_") {
            Self::Refund(q.to_owned())
        } else if q.starts_with("cp_") || q.starts_with("vd_") {
            Self::Step(q.to_owned())
        } else if let Ok(order) = q.parse::<i64>() {
            Self::Order(order)
        } else {
            Self::Key(q.to_owned())
        }
    }
}

/// The search form, for the console's pages.
pub(super) fn search_form(merchants: &[String], merchant: &str, q: &str) -> Markup {
    html! {
        form #search method="get" action="/charges" {
            label for="q" { "Find a charge" }
            input #q type="search" name="q" value=(q)
                placeholder="charge, refund, capture or void id, order id or idempotency key" required;
            input type="text" name="merchant" list="merchant-names" value=(merchant)
                placeholder="merchant (any)" aria-label="merchant";
            datalist #merchant-names { @for m in merchants { option value=(m) {} } }
            button type="submit" { "Search" }
        }
    }
}

pub(super) async fn search(
    State(console): State<Console>,
    Operator(_): Operator,
    Query(query): Query<SearchQuery>,
) -> Response {
    let q = query.q.as_deref().unwrap_or("").trim().to_owned();
    let merchant = query
        .merchant
        .as_deref()
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(str::to_owned);
    if q.is_empty() {
        return see_other("/");
    }
    let store = &console.store;
    let filter = match Sought::of(&q) {
        Sought::Charge(id) => return see_other(&format!("/charges/{}", urlencode(&id))),
        Sought::Refund(id) => {
            return match store.refund_detail(&id).await {
                Ok(Some(refund)) => see_other(&format!("/charges/{}", refund.charge_id)),
                Ok(None) => results(&console, &q, merchant.as_deref(), &[]).await,
                Err(e) => unavailable(&e),
            }
        }
        Sought::Step(id) => {
            return match store.step_detail(&id).await {
                Ok(Some(step)) => see_other(&format!("/charges/{}", step.charge_id)),
                Ok(None) => results(&console, &q, merchant.as_deref(), &[]).await,
                Err(e) => unavailable(&e),
            }
        }
        Sought::Order(order) => ChargeFilter {
            order_id: Some(order),
            merchant: merchant.clone(),
            limit: LIST_LIMIT,
            ..ChargeFilter::default()
        },
        Sought::Key(key) => ChargeFilter {
            idempotency_key: Some(key),
            merchant: merchant.clone(),
            limit: LIST_LIMIT,
            ..ChargeFilter::default()
        },
    };
    match store.charges(&filter).await {
        Ok(found) => results(&console, &q, merchant.as_deref(), &found).await,
        Err(e) => unavailable(&e),
    }
}

fn urlencode(s: &str) -> String {
    let encoded = serde_urlencoded::to_string([("", s)]).unwrap_or_default();
    encoded.trim_start_matches('=').to_owned()
}

async fn merchant_names(console: &Console) -> Result<Vec<String>, StoreError> {
    Ok(console
        .store
        .merchant_listing()
        .await?
        .into_iter()
        .map(|m| m.merchant.name)
        .collect())
}

async fn results(
    console: &Console,
    q: &str,
    merchant: Option<&str>,
    found: &[ChargeSummary],
) -> Response {
    let merchants = match merchant_names(console).await {
        Ok(m) => m,
        Err(e) => return unavailable(&e),
    };
    let body = html! {
        p { a href="/" { "← console" } }
        (search_form(&merchants, merchant.unwrap_or(""), q))
        section #results {
            h2 { "Charges for " code { (q) } @if let Some(m) = merchant { " at " (m) } }
            @if found.is_empty() {
                p.empty { "No charge found." }
            } @else {
                table {
                    thead { tr { th { "charge" } th { "merchant" } th { "order" } th { "amount" } th { "status" } th { "made" } } }
                    tbody {
                        @for c in found {
                            tr data-charge=(c.id) {
                                td { a href=(format!("/charges/{}", c.id)) { code { (c.id) } } }
                                td { (c.merchant) }
                                td { (c.order_id) }
                                td.num { (cents(c.amount_cents, &c.currency)) }
                                td { (c.status) }
                                td { (c.created_at.format("%Y-%m-%d %H:%M:%S UTC")) }
                            }
                        }
                    }
                }
            }
        }
    };
    Html(layout("Search · idem console", body).into_string()).into_response()
}

pub(super) async fn charge_page(
    State(console): State<Console>,
    Operator(_): Operator,
    Path(id): Path<String>,
) -> Response {
    let loaded = async {
        let store = &console.store;
        let Some(record) = store.charge_record(&id).await? else {
            return Ok::<_, StoreError>(None);
        };
        let refunds = match ChargeId::parse(&id) {
            Some(charge_id) => {
                store
                    .refunds_of(record.charge.merchant_id, &charge_id)
                    .await?
            }
            None => Vec::new(),
        };
        let steps = match ChargeId::parse(&id) {
            Some(charge_id) => {
                store
                    .steps_of(record.charge.merchant_id, &charge_id)
                    .await?
            }
            None => Vec::new(),
        };
        let mut history = store.audit_trail(Some(&id), HISTORY_LIMIT).await?;
        let subjects = refunds
            .iter()
            .map(|r| r.id.as_str())
            .chain(steps.iter().map(|s| s.id.as_str()));
        for subject in subjects {
            history.extend(store.audit_trail(Some(subject), HISTORY_LIMIT).await?);
        }
        history.sort_by_key(|a| (a.at, a.id));
        let deliveries = store.charge_deliveries(&id, HISTORY_LIMIT).await?;
        let merchant = Merchant {
            id: record.charge.merchant_id,
            name: record.charge.merchant.clone(),
        };
        let charge = match ChargeId::parse(&id) {
            Some(charge_id) => store.charge(merchant.id, &charge_id).await?,
            None => None,
        };
        let at_acquirer =
            at_the_acquirer(&console, &merchant, charge.as_ref(), &refunds, &steps).await;
        let mut awaiting = Vec::new();
        for refund in &refunds {
            if let Some(detail) = store.refund_detail(refund.id.as_str()).await? {
                if detail.awaiting_review() {
                    awaiting.push(detail.id);
                }
            }
        }
        for step in &steps {
            if let Some(detail) = store.step_detail(step.id.as_str()).await? {
                if detail.awaiting_review() {
                    awaiting.push(detail.id);
                }
            }
        }
        Ok(Some(Loaded {
            record,
            authorization: charge.and_then(|c| c.authorization),
            refunds,
            steps,
            history,
            awaiting,
            deliveries,
            at_acquirer,
        }))
    }
    .await;
    let Loaded {
        record,
        authorization,
        refunds,
        steps,
        history,
        awaiting,
        deliveries,
        at_acquirer,
    } = match loaded {
        Ok(Some(loaded)) => loaded,
        Ok(None) => {
            let body = html! {
                p { a href="/" { "← console" } }
                p.notice.bad { "No charge has the id " code { (id) } "." }
            };
            return (
                StatusCode::NOT_FOUND,
                Html(layout("Not found · idem console", body).into_string()),
            )
                .into_response();
        }
        Err(e) => return unavailable(&e),
    };
    let title = format!("{} · idem console", record.charge.id);
    let body = html! {
        p { a href="/" { "← console" } }
        (charge_section(&record))
        (key_section(&record))
        @if authorization.is_some() || !steps.is_empty() {
            (steps_section(&record, authorization, &steps, &awaiting))
        }
        (refunds_section(&refunds, &awaiting))
        (acquirer_section(&at_acquirer))
        (deliveries_section(&deliveries))
        (history_section(&history))
    };
    Html(layout(&title, body).into_string()).into_response()
}

fn when(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

fn charge_section(record: &ChargeRecord) -> Markup {
    let c = &record.charge;
    html! {
        section #charge {
            h1 { "Charge " code { (c.id) } }
            dl {
                dt { "status" } dd.status { (c.status) @if c.awaiting_review() { " — awaiting review" } }
                dt { "merchant" } dd { (c.merchant) }
                dt { "order" } dd { (c.order_id) }
                dt { "amount" } dd { (cents(c.amount_cents, &c.currency)) }
                @if let Some(d) = &c.description { dt { "description" } dd { (d) } }
                dt { "made" } dd { (when(c.created_at)) }
                dt { "last change" } dd { (when(c.updated_at)) }
                dt { "acquirer reference" } dd { code { (c.acquirer_reference) } }
                @if let Some(capture) = &c.acquirer_capture_id { dt { "capture" } dd { code { (capture) } } }
                @if let Some(reason) = &c.decline_reason { dt { "declined" } dd { (reason) } }
                @if c.reconcile_attempts > 0 { dt { "reconciler" } dd { (c.reconcile_attempts) " unknown answer(s)" @if let Some(next) = c.next_reconcile_at { "; looks again at " (when(next)) } } }
                @if let Some(since) = c.review_since { dt { "awaiting review since" } dd { (when(since)) ": " (c.review_reason.as_deref().unwrap_or("")) } }
            }
            @if c.awaiting_review() {
                table.act { tbody { tr data-charge=(c.id) { (actions(&format!("/charges/{}", c.id), "captured")) } } }
            }
        }
    }
}

fn key_section(record: &ChargeRecord) -> Markup {
    html! {
        section #key {
            h2 { "Idempotency key" }
            @match &record.key {
                None => p.empty { "Its key record is gone: swept after its time to live (the charge keeps its key: "
                    code { (record.charge.idempotency_key.as_deref().unwrap_or("unknown")) } ")." },
                Some(k) => dl {
                    dt { "key" } dd { code { (k.idempotency_key) } }
                    dt { "state" } dd { (k.state) }
                    dt { "attempts" } dd { (k.attempt) " (each take-over by a retry, a server or the reconciler is one more)" }
                    @if let Some(until) = k.locked_until { dt { "leased until" } dd { (when(until)) } }
                    @if let Some(status) = k.response_status { dt { "stored answer" } dd { (status) ", replayed to every retry" } }
                    dt { "honoured until" } dd { (when(k.expires_at)) }
                },
            }
        }
    }
}

/// What a charge's page shows, loaded together.
struct Loaded {
    record: ChargeRecord,
    authorization: Option<Authorization>,
    refunds: Vec<Refund>,
    steps: Vec<Step>,
    history: Vec<AuditRecord>,
    awaiting: Vec<String>,
    deliveries: Vec<DeliveryInfo>,
    at_acquirer: Vec<AcquirerLine>,
}

/// A two-step charge's authorization: what it captured, what it can still
/// capture, and its captures and void, each with retry and resolve while it
/// awaits a person.
fn steps_section(
    record: &ChargeRecord,
    authorization: Option<Authorization>,
    steps: &[Step],
    awaiting: &[String],
) -> Markup {
    let currency = record.charge.currency.as_str();
    html! {
        section #steps {
            h2 { "Captures and voids (" (steps.len()) ")" }
            @if let Some(a) = authorization {
                p { "Captured " (cents(a.amount_captured_cents, currency)) "; still capturable "
                    (cents(a.amount_capturable_cents, currency)) "." }
            }
            @if steps.is_empty() {
                p.empty { "None." }
            } @else {
                table {
                    thead { tr { th { "step" } th { "amount" } th { "final" } th { "status" } th { "made" } th { "act" } } }
                    tbody {
                        @for s in steps {
                            tr data-step=(s.id.as_str()) {
                                td { code { (s.id.as_str()) } }
                                td.num { (cents(s.amount_cents.get(), s.currency.as_str())) }
                                td { (s.final_capture.map_or("void", |f| if f { "yes" } else { "no" })) }
                                td { (s.status.as_str()) @if let Some(why) = &s.failure_reason { ": " (why) } }
                                td { (when(s.created_at)) }
                                @if awaiting.iter().any(|a| a == s.id.as_str()) {
                                    (actions(&format!("/{}s/{}", s.kind().as_str(), s.id.as_str()), "succeeded"))
                                } @else { td {} }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn refunds_section(refunds: &[Refund], awaiting: &[String]) -> Markup {
    html! {
        section #refunds {
            h2 { "Refunds (" (refunds.len()) ")" }
            @if refunds.is_empty() {
                p.empty { "None." }
            } @else {
                table {
                    thead { tr { th { "refund" } th { "amount" } th { "status" } th { "reason" } th { "made" } th { "act" } } }
                    tbody {
                        @for r in refunds {
                            tr data-refund=(r.id.as_str()) {
                                td { code { (r.id.as_str()) } }
                                td.num { (cents(r.amount_cents.get(), r.currency.as_str())) }
                                td { (r.status.as_str()) @if let Some(why) = &r.failure_reason { ": " (why) } }
                                td { (r.reason.map(|x| x.as_str()).unwrap_or("")) }
                                td { (when(r.created_at)) }
                                @if awaiting.iter().any(|a| a == r.id.as_str()) {
                                    (actions(&format!("/refunds/{}", r.id.as_str()), "succeeded"))
                                } @else { td {} }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// How long the page waits for each of the acquirer's answers.
const ACQUIRER_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// One line of what the acquirer says: what it is about (`charge` or a
/// refund's id), its reference, the acquirer's word.
type AcquirerLine = (String, String, AcquirerWord);

/// `answer` within [`ACQUIRER_WAIT`].
async fn ask(answer: impl std::future::Future<Output = AcquirerWord>) -> AcquirerWord {
    tokio::time::timeout(ACQUIRER_WAIT, answer)
        .await
        .unwrap_or_else(|_| AcquirerWord::Unknown("no answer within 3 s".to_owned()))
}

/// What the acquirer says now of the charge's reference and each of its
/// refunds', asked by lookup (a read; nothing moves), all at once, each
/// within [`ACQUIRER_WAIT`]: the ground truth beside idem's own record.
async fn at_the_acquirer(
    console: &Console,
    merchant: &Merchant,
    charge: Option<&Charge>,
    refunds: &[Refund],
    steps: &[Step],
) -> Vec<AcquirerLine> {
    let engine = &console.engine;
    // All at once: a page waits at most one `ACQUIRER_WAIT`, however many
    // refunds the charge has.
    let of_charge = async {
        match charge {
            Some(charge) => Some((
                "the charge".to_owned(),
                charge.acquirer_reference.as_str().to_owned(),
                ask(engine.ask_acquirer::<ChargeRequest>(merchant, charge)).await,
            )),
            None => None,
        }
    };
    let of_refunds = futures_util::future::join_all(refunds.iter().map(|refund| async move {
        (
            refund.id.as_str().to_owned(),
            refund.acquirer_reference.as_str().to_owned(),
            ask(engine.ask_acquirer::<RefundIntent>(merchant, refund)).await,
        )
    }));
    let of_steps = futures_util::future::join_all(steps.iter().map(|step| async move {
        let word = match step.kind() {
            StepKind::Capture => ask(engine.ask_acquirer::<CaptureIntent>(merchant, step)).await,
            StepKind::Void => ask(engine.ask_acquirer::<VoidIntent>(merchant, step)).await,
        };
        (
            step.id.as_str().to_owned(),
            step.acquirer_reference.as_str().to_owned(),
            word,
        )
    }));
    let (of_charge, (of_refunds, of_steps)) =
        futures_util::future::join(of_charge, futures_util::future::join(of_refunds, of_steps))
            .await;
    of_charge
        .into_iter()
        .chain(of_refunds)
        .chain(of_steps)
        .collect()
}

fn acquirer_section(lines: &[AcquirerLine]) -> Markup {
    html! {
        section #acquirer {
            h2 { "At the acquirer, now" }
            p.hint { "Each reference looked up at the acquirer as this page loaded (a read: nothing moves). idem keeps no row per attempt or per call: the key record counts the attempts, and traces show each one." }
            table {
                thead { tr { th { "of" } th { "reference" } th { "the acquirer says" } } }
                tbody {
                    @for (of, reference, word) in lines {
                        tr {
                            td { code { (of) } }
                            td { code { (reference) } }
                            td.word {
                                @match word {
                                    AcquirerWord::Done(id) => { "done: " code { (id) } }
                                    AcquirerWord::Refused(why) => { "refused: " (why) }
                                    AcquirerWord::Contradicted(what) => { "contradicts it: " (what) }
                                    AcquirerWord::Nothing => { "no record of this reference" }
                                    AcquirerWord::Unknown(why) => { "did not say: " (why) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn deliveries_section(deliveries: &[DeliveryInfo]) -> Markup {
    html! {
        section #deliveries {
            h2 { "Webhook deliveries (" (deliveries.len()) ")" }
            @if deliveries.is_empty() {
                p.empty { "None: no endpoint of the merchant heard an event about it." }
            } @else {
                table {
                    thead { tr { th { "event" } th { "type" } th { "endpoint" } th { "state" } th { "attempts" } th { "last answer" } th { "written" } } }
                    tbody {
                        @for d in deliveries {
                            tr data-event=(d.event_id) data-state=(d.state) {
                                td { code { (d.event_id) } }
                                td { (d.event_type) }
                                td { code { (d.endpoint_id) } }
                                td { (d.state) @if d.state == "pending" { " (next " (when(d.next_attempt_at)) ")" } }
                                td.num { (d.attempts) }
                                td { @if let Some(s) = d.last_status { (s) " " } (d.last_error.as_deref().unwrap_or("")) }
                                td { (when(d.created_at)) }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn history_section(history: &[AuditRecord]) -> Markup {
    html! {
        section #history {
            h2 { "History" }
            @if history.is_empty() {
                p.empty { "No reconciler look and no operator action yet." }
            } @else {
                table {
                    thead { tr { th { "when" } th { "who" } th { "what" } th { "of" } th { "detail" } th { "why" } } }
                    tbody {
                        @for a in history {
                            tr {
                                td { (when(a.at)) }
                                td { (a.actor) }
                                td { code { (a.action) } }
                                td { code { (a.subject) } }
                                td { (a.detail.as_deref().unwrap_or("")) }
                                td { (a.reason.as_deref().unwrap_or("")) }
                            }
                        }
                    }
                }
            }
        }
    }
}
