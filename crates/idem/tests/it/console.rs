//! The operator console in a real browser: headless Chromium from Debian,
//! driven through ChromeDriver (WebDriver), signs in and clicks "Resolve" on
//! a charge awaiting review (and on a refund awaiting review); the API then
//! replays what the person decided.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{ClientBuilder, Locator};
use idem_lab::sim::{Fault, Faults};

use crate::helpers::*;

const TOKEN: &str = "adm_console_test_token_0123456789";

/// A program the test set-up installs (scripts/ensure-chromium), by its
/// variable or its Debian path.
fn program(var: &str, debian: &str) -> String {
    let path = std::env::var(var).unwrap_or_else(|_| debian.to_owned());
    assert!(
        std::path::Path::new(&path).exists(),
        "NO {path}: run scripts/ensure-chromium (scripts/test and CI do) or set {var}"
    );
    path
}

/// ChromeDriver on a port of its own, in a process group of its own with
/// the browsers it starts, all killed when dropped (a test that fails before
/// closing its session would otherwise leave Chromium running), with the
/// browser profile it made removed.
struct Driver {
    child: Child,
    url: String,
    profile: std::path::PathBuf,
}

impl Driver {
    async fn start() -> Self {
        let port = free_port();
        let child = Command::new(program("IDEM_TEST_CHROMEDRIVER", "/usr/bin/chromedriver"))
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let url = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        while reqwest::get(format!("{url}/status")).await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "chromedriver did not start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = std::env::temp_dir().join(format!("idem-console-{}", uuid::Uuid::new_v4()));
        Self {
            child,
            url,
            profile,
        }
    }

    async fn browser(&self) -> fantoccini::Client {
        let profile = &self.profile;
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".to_owned(),
            serde_json::json!({
                "binary": program("IDEM_TEST_CHROMIUM", "/usr/bin/chromium"),
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                         "--disable-background-networking", "--disable-component-update",
                         format!("--user-data-dir={}", profile.display())],
            }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&self.url)
            .await
            .expect("a Chromium session")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// A real `idem serve` with the console on its own address (the flag's
/// token) and no workers, a merchant `loja` and its client, and one webhook
/// endpoint nothing delivers to (`--no-workers`): its deliveries wait, and
/// the console shows them.
struct Setup {
    db: TestDb,
    sim: TestSim,
    /// The console's `host:port`.
    admin: String,
    server: ServeProcess,
    client: Client,
}

impl Setup {
    async fn start() -> Self {
        let db = TestDb::new().await;
        let sim = TestSim::start(Faults::default()).await;
        let secret = db.merchant("loja").await;
        let admin = format!("127.0.0.1:{}", free_port());
        let server = ServeProcess::start(
            &db,
            &sim,
            &[
                "--no-workers",
                "--admin-listen",
                &admin,
                "--admin-token",
                TOKEN,
            ],
        )
        .await;
        let client = Client::new(&server.url, &secret);
        let (status, _, stderr) = run_idem(
            &db,
            &[
                "webhooks",
                "add",
                "loja",
                "http://127.0.0.1:9/hook",
                "--webhook-allow-private",
                "--actor",
                "ana",
            ],
        )
        .await;
        assert!(status.success(), "{stderr}");
        Self {
            db,
            sim,
            admin,
            server,
            client,
        }
    }
}

#[tokio::test]
async fn a_person_resolves_a_charge_in_the_console_and_the_api_replays_it_resolved() {
    let Setup {
        db,
        sim,
        admin,
        server: _server,
        client,
    } = Setup::start().await;

    // A charge awaiting review: the capture failed before the acquirer saw
    // it, and the reconciler's last look found nothing.
    sim.set_faults(failing(Fault::ErrorBefore)).await;
    let (key, body) = (new_key(), body(42, 25_000));
    assert_eq!(client.charge(&key, &body).await.status, 503);
    sim.set_faults(Faults::default()).await;
    let reconciler = test_reconciler_with(&db, &sim, Duration::from_secs(2), Duration::ZERO);
    assert_eq!(reconciler.pass().await.unwrap().marked_for_review, 1);
    let (id,): (String,) = sqlx::query_as("select id from charges")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    // The review's webhook, written with the mark, given up as if its
    // schedule had run out.
    let (review_event,): (String,) = sqlx::query_as(
        "select event_id from webhook_deliveries where event_type = 'charge.review_required'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("charge.review_required written with the mark");
    db.exec("update webhook_deliveries set state = 'failed', attempts = 11")
        .await;

    let driver = Driver::start().await;
    let browser = driver.browser().await;
    let console = format!("http://{admin}");

    // Not signed in: the login page; a wrong token is told so.
    browser.goto(&console).await.unwrap();
    assert!(browser
        .current_url()
        .await
        .unwrap()
        .path()
        .ends_with("/login"));
    browser
        .find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys("adm_wrong")
        .await
        .unwrap();
    browser
        .find(Locator::Css("button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let refused = browser
        .wait()
        .for_element(Locator::Css(".notice.bad"))
        .await
        .unwrap();
    assert!(refused
        .text()
        .await
        .unwrap()
        .contains("not one of this deployment's"));

    // Signed in: the page shows the charge awaiting review, the merchants, the outbox.
    browser
        .find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
    browser
        .find(Locator::Css("button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let row = browser
        .wait()
        .for_element(Locator::Css(&format!("#review tr[data-charge='{id}']")))
        .await
        .expect("the charge awaiting review is listed");
    let page = browser.source().await.unwrap();
    assert!(page.contains("Signed in as") && page.contains("console (--admin-token)"));
    assert!(browser
        .find(Locator::Css("#merchants"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
        .contains("loja"));
    assert!(browser.find(Locator::Css("#outbox")).await.is_ok());
    assert!(
        browser.find(Locator::Css("#outcomes svg")).await.is_ok(),
        "the chart"
    );

    // Resolve as captured, with a reason.
    row.find(Locator::Css("select[name=as]"))
        .await
        .unwrap()
        .select_by_value("captured")
        .await
        .unwrap();
    row.find(Locator::Css("input[name=reason]"))
        .await
        .unwrap()
        .send_keys("acquirer portal shows it captured")
        .await
        .unwrap();
    row.find(Locator::Css("button.resolve"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let done = browser
        .wait()
        .for_element(Locator::Css(".notice.good"))
        .await
        .unwrap();
    let said = done.text().await.unwrap();
    assert!(
        said.contains(&id) && said.contains("answer 201 stored"),
        "{said}"
    );
    assert!(
        browser
            .find(Locator::Css(&format!("tr[data-charge='{id}']")))
            .await
            .is_err(),
        "no longer awaiting review"
    );

    // The failed webhook, sent again from the console.
    browser
        .find(Locator::Css(&format!(
            "#webhooks tr[data-event='{review_event}'][data-state='failed'] button.redeliver"
        )))
        .await
        .expect("a failed delivery offers to be sent again")
        .click()
        .await
        .unwrap();
    // The next page's notice (the last page's is still there until it loads).
    let done = browser
        .wait()
        .for_element(Locator::XPath(&format!(
            "//p[contains(@class, 'good') and contains(., '{review_event}')]"
        )))
        .await
        .unwrap();
    let said = done.text().await.unwrap();
    assert!(said.contains("1 deliveries to send again"), "{said}");
    assert!(browser
        .find(Locator::Css(&format!(
            "#webhooks tr[data-event='{review_event}'][data-state='pending']"
        )))
        .await
        .is_ok());
    browser.close().await.unwrap();
    let events: Vec<(String,)> =
        sqlx::query_as("select event_type from webhook_deliveries order by id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        events,
        [
            ("charge.review_required".to_owned(),),
            ("charge.resolved".to_owned(),)
        ],
        "the resolution's webhook, written with it"
    );
    let (unnamed,): (i64,) = sqlx::query_as(
        "select count(*) from webhook_deliveries where charge_id is null or charge_id <> $1",
    )
    .bind(&id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(unnamed, 0, "each delivery names its charge");
    let trail = db.store.audit_trail(Some(&review_event), 10).await.unwrap();
    assert!(
        trail
            .iter()
            .any(|a| a.action == "webhook.redeliver" && a.actor == "console (--admin-token)"),
        "{trail:?}"
    );

    // The API replays the charge as resolved; no money moved at idem's hand.
    let late = client.charge(&key, &body).await;
    assert_eq!((late.status, late.replayed()), (201, true));
    assert_eq!(late.json()["status"], "captured");
    assert!(sim.ledger().await.captures.is_empty());
    let trail = db.store.audit_trail(Some(&id), 10).await.unwrap();
    let resolve = trail
        .iter()
        .find(|a| a.action == "charge.resolve")
        .expect("audited");
    assert_eq!(resolve.actor, "console (--admin-token)");
    assert_eq!(
        resolve.reason.as_deref(),
        Some("acquirer portal shows it captured")
    );
}

/// Signs in to the console at `console` with the flag's token.
async fn sign_in(browser: &fantoccini::Client, console: &str) {
    browser.goto(&format!("{console}/login")).await.unwrap();
    browser
        .find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
    browser
        .find(Locator::Css("button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

/// A refund the acquirer contradicted awaits review; a person resolves it as
/// failed in the console: its amount is the charge's again, the API replays
/// the refusal to the client's late retry, and the decision is audited under
/// the token's name. Then the console finds the charge by its order id and
/// its merchant (and by the refund's id) and shows its story: the charge, its
/// key record, its refunds, what the acquirer says of each, the deliveries,
/// and the history with the resolution.
#[tokio::test]
async fn a_person_resolves_a_refund_in_the_console_and_finds_its_charges_story() {
    let Setup {
        db,
        sim,
        admin,
        server: _server,
        client,
    } = Setup::start().await;
    let charge = client.charge(&new_key(), &body(7, 1_000)).await;
    assert_eq!(charge.status, 201);
    let charge_id = charge.json()["id"].as_str().unwrap().to_owned();
    sim.set_faults(Faults {
        fault_count: Some(1),
        ..failing(Fault::WrongAmount)
    })
    .await;
    let key = new_key();
    let lied = client
        .refund(&charge_id, &key, r#"{"amount_cents": 400}"#)
        .await;
    assert_eq!(lied.problem_type(), "urn:idem:problem:refund-under-review");
    let id = lied.json()["refund_id"].as_str().unwrap().to_owned();

    let driver = Driver::start().await;
    let browser = driver.browser().await;
    let console = format!("http://{admin}");
    sign_in(&browser, &console).await;
    let row = browser
        .wait()
        .for_element(Locator::Css(&format!(
            "#refund-review tr[data-refund='{id}']"
        )))
        .await
        .expect("the refund awaiting review is listed");
    assert!(row.text().await.unwrap().contains(&charge_id));
    row.find(Locator::Css("select[name=as]"))
        .await
        .unwrap()
        .select_by_value("failed")
        .await
        .unwrap();
    row.find(Locator::Css("input[name=reason]"))
        .await
        .unwrap()
        .send_keys("the acquirer's report has no such refund")
        .await
        .unwrap();
    row.find(Locator::Css("button.resolve"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let done = browser
        .wait()
        .for_element(Locator::Css(".notice.good"))
        .await
        .unwrap();
    let said = done.text().await.unwrap();
    assert!(
        said.contains(&id) && said.contains("answer 422 stored"),
        "{said}"
    );
    assert!(
        browser
            .find(Locator::Css(&format!("tr[data-refund='{id}']")))
            .await
            .is_err(),
        "no longer awaiting review"
    );

    // Found by its order and its merchant, then its whole story on one page.
    let search = browser
        .find(Locator::Css("form#search input[name=q]"))
        .await
        .expect("the search form");
    search.send_keys("7").await.unwrap();
    browser
        .find(Locator::Css("form#search input[name=merchant]"))
        .await
        .unwrap()
        .send_keys("loja")
        .await
        .unwrap();
    browser
        .find(Locator::Css("form#search button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser
        .wait()
        .for_element(Locator::Css(&format!(
            "#results tr[data-charge='{charge_id}'] a"
        )))
        .await
        .expect("the charge of order 7 found")
        .click()
        .await
        .unwrap();
    let status = browser
        .wait()
        .for_element(Locator::Css("#charge dd.status"))
        .await
        .expect("the charge's page");
    assert_eq!(status.text().await.unwrap(), "captured");
    let section = |css: &'static str| {
        let browser = browser.clone();
        async move {
            browser
                .find(Locator::Css(css))
                .await
                .unwrap_or_else(|_| panic!("{css}"))
                .text()
                .await
                .unwrap()
        }
    };
    assert!(section("#charge").await.contains(&charge_id));
    assert!(
        section("#key").await.contains("completed"),
        "the key record"
    );
    let refunds = section("#refunds").await;
    assert!(
        refunds.contains(&id) && refunds.contains("failed"),
        "{refunds}"
    );
    // The acquirer's own word, looked up as the page loaded: the capture, and
    // the refund it paid with another amount than asked.
    let acquirer = section("#acquirer").await;
    assert!(
        acquirer.contains("done: cap_") && acquirer.contains("contradicts it"),
        "{acquirer}"
    );
    let deliveries = section("#deliveries").await;
    for event in [
        "charge.captured",
        "refund.review_required",
        "refund.resolved",
    ] {
        assert!(deliveries.contains(event), "{event}: {deliveries}");
    }
    let history = section("#history").await;
    assert!(
        history.contains("refund.resolve")
            && history.contains("the acquirer's report has no such refund"),
        "{history}"
    );
    // docs/operations.md's picture of the page, when asked for.
    if let Ok(path) = std::env::var("IDEM_CONSOLE_SCREENSHOT") {
        browser
            .set_window_size(1200, 1700)
            .await
            .expect("window size");
        let png = browser.screenshot().await.expect("a screenshot");
        std::fs::write(&path, png).expect("write the screenshot");
    }
    // A refund id finds its charge too; an unknown charge is a 404 page.
    browser
        .goto(&format!("{console}/charges?q={id}"))
        .await
        .unwrap();
    browser
        .wait()
        .for_element(Locator::Css("#charge"))
        .await
        .expect("the refund's charge");
    assert!(browser
        .current_url()
        .await
        .unwrap()
        .path()
        .ends_with(&charge_id));
    browser
        .goto(&format!("{console}/charges/ch_000000000000000000000000"))
        .await
        .unwrap();
    assert!(browser
        .source()
        .await
        .unwrap()
        .contains("No charge has the id"));
    browser.close().await.unwrap();

    let late = client
        .refund(&charge_id, &key, r#"{"amount_cents": 400}"#)
        .await;
    assert_eq!((late.status, late.replayed()), (422, true));
    assert_eq!(late.problem_type(), "urn:idem:problem:refund-failed");
    let over = client
        .refund(&charge_id, &new_key(), r#"{"amount_cents": 1001}"#)
        .await;
    assert_eq!(over.json()["remaining_cents"], 1_000, "the 400 given back");
    let trail = db.store.audit_trail(Some(&id), 10).await.unwrap();
    let resolve = trail
        .iter()
        .find(|a| a.action == "refund.resolve")
        .expect("audited");
    assert_eq!(
        (resolve.actor.as_str(), resolve.detail.as_deref()),
        ("console (--admin-token)", Some("resolved as failed"))
    );
}

#[tokio::test]
async fn the_console_signs_in_only_with_a_known_token_and_audits_under_its_name() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let admin = format!("127.0.0.1:{}", free_port());
    let _server = ServeProcess::start(&db, &sim, &["--no-workers", "--admin-listen", &admin]).await;
    let (status, token, err) = run_idem(
        &db,
        &["admin", "token", "--name", "ana", "--actor", "root-ops"],
    )
    .await;
    assert!(status.success(), "{err}");
    let token = token.trim();
    assert!(token.starts_with("adm_"), "{token}");

    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let console = format!("http://{admin}");
    let anonymous = http.get(&console).send().await.unwrap();
    assert_eq!(anonymous.status(), 303);
    assert_eq!(anonymous.headers()["location"], "/login");
    for (cookie, expect) in [("idem_admin=adm_made_up", 303), ("other=1", 303)] {
        let r = http
            .get(&console)
            .header("cookie", cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), expect, "{cookie}");
    }
    let login = http
        .post(format!("{console}/login"))
        .form(&[("token", token)])
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 303);
    let cookie = login.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let page = http
        .get(&console)
        .header("cookie", cookie.split(';').next().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(html.contains("Signed in as <strong>ana</strong>"), "{html}");
    assert!(!html.contains("<script"), "no JavaScript");
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no asset from elsewhere"
    );
    let trail = db.store.audit_trail(Some("ana"), 10).await.unwrap();
    assert_eq!(
        (trail[0].actor.as_str(), trail[0].action.as_str()),
        ("root-ops", "admin.token")
    );
}

/// A two-step charge's page shows what it captured and can still capture,
/// its captures with what the acquirer says of each, and a capture the
/// acquirer contradicted is found by its id and resolved there, through the
/// same finalize as any attempt (its amount given back to the authorization).
#[tokio::test]
async fn a_person_finds_a_capture_by_its_id_and_resolves_it_on_its_charges_page() {
    let Setup {
        db: _db,
        sim,
        admin,
        server: _server,
        client,
    } = Setup::start().await;
    let authorized = client
        .charge(
            &new_key(),
            r#"{"order_id": 8, "amount_cents": 1000, "capture": false}"#,
        )
        .await;
    assert_eq!(authorized.status, 201, "{authorized:?}");
    let charge_id = authorized.json()["id"].as_str().unwrap().to_owned();
    let made = client
        .capture(
            &charge_id,
            &new_key(),
            r#"{"amount_cents": 200, "final": false}"#,
        )
        .await;
    assert_eq!(made.status, 201, "{made:?}");
    sim.set_faults(Faults {
        fault_count: Some(1),
        ..failing(Fault::WrongAmount)
    })
    .await;
    let lied = client
        .capture(
            &charge_id,
            &new_key(),
            r#"{"amount_cents": 300, "final": false}"#,
        )
        .await;
    assert_eq!(lied.problem_type(), "urn:idem:problem:step-under-review");
    let id = lied.json()["capture_id"].as_str().unwrap().to_owned();
    sim.set_faults(Faults::default()).await;

    let driver = Driver::start().await;
    let browser = driver.browser().await;
    let console = format!("http://{admin}");
    sign_in(&browser, &console).await;
    // The dashboard is loaded after the sign-in's redirect, not when the
    // click returns: wait for its form rather than look once.
    browser
        .wait()
        .for_element(Locator::Css("form#search input[name=q]"))
        .await
        .expect("the search form")
        .send_keys(&id)
        .await
        .unwrap();
    browser
        .find(Locator::Css("form#search button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let steps = browser
        .wait()
        .for_element(Locator::Css("#steps"))
        .await
        .expect("the charge's page, with its captures");
    let text = steps.text().await.unwrap();
    assert!(
        text.contains("Captured 2.00 BRL") && text.contains("still capturable 5.00 BRL"),
        "{text}"
    );
    let acquirer = browser
        .find(Locator::Css("#acquirer"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        acquirer.contains(&id),
        "the acquirer asked of the capture: {acquirer}"
    );
    let row = browser
        .find(Locator::Css(&format!("#steps tr[data-step='{id}']")))
        .await
        .expect("the capture's row");
    row.find(Locator::Css("select[name=as]"))
        .await
        .unwrap()
        .select_by_value("failed")
        .await
        .unwrap();
    row.find(Locator::Css("input[name=reason]"))
        .await
        .unwrap()
        .send_keys("the acquirer reversed it")
        .await
        .unwrap();
    row.find(Locator::Css("button.resolve"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let said = browser
        .wait()
        .for_element(Locator::Css(".notice.good"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        said.contains(&id) && said.contains("answer 422 stored"),
        "{said}"
    );
    let charge = client.get_charge(&charge_id).await.json();
    assert_eq!(
        charge["amount_capturable_cents"], 800,
        "the 300 given back: {charge}"
    );
}
