//! The web dashboard at `/ui/` (SPEC section 9), in a real browser: Debian's headless
//! `chromium`, driven over WebDriver through `chromedriver` (started here on a free port)
//! with the `fantoccini` crate. A host with API tokens and a sink of its own: the page asks
//! for the token, a read token is refused an act with the API's error shown, then an
//! admin token books a Life, finds it listed, opens and cancels it, pauses a queue, runs
//! a timer now and edits it, reschedules a Life, purges a queue, re-runs a task that
//! failed for good, uploads a plugin (seeing the Lives and timers that use it, and its
//! delete refused while they do) and deletes it; each is checked in the page and in
//! Redis, through the API or at the sink. A screenshot of every page is saved under
//! `target/ui-screenshots/` for review. Plugin uploads need the components built from
//! `plugins/` (`scripts/test` builds them).
//!
//! Needs `chromium` and `chromedriver` (Debian: `apt-get install -y chromium
//! chromium-driver`; `scripts/test` installs them). Without them it fails and says so.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use kairos_e2e::*;
use serde_json::{json, Value};

/// Longest wait for anything in the page.
const WAIT: Duration = Duration::from_secs(15);

/// `name` on PATH (or at `/usr/bin/name`), else None.
fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// A chromedriver of this test's own on a free port, killed on drop.
struct Driver {
    port: u16,
    child: Child,
}

impl Driver {
    fn start() -> Driver {
        let missing = "install Debian's headless Chromium and its WebDriver: \
            `apt-get install -y chromium chromium-driver` (scripts/test does this)";
        let driver = which("chromedriver")
            .unwrap_or_else(|| panic!("chromedriver is not installed: {missing}"));
        assert!(
            which("chromium").is_some(),
            "chromium is not installed: {missing}"
        );
        let port = free_port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("chromedriver does not start ({e}): {missing}"));
        let deadline = Instant::now() + Duration::from_secs(15);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "chromedriver did not listen on port {port} within 15 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Driver { port, child }
    }

    /// A headless Chromium session (a fixed window size, so screenshots compare).
    async fn browser(&self) -> Client {
        let mut args = vec![
            "--headless=new",
            "--window-size=1400,1000",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-extensions",
        ];
        // Root (containers, CI) has no user namespace sandbox for Chromium.
        if unsafe { libc::geteuid() } == 0 {
            args.push("--no-sandbox");
        }
        let mut options = json!({ "args": args });
        if let Some(binary) = which("chromium") {
            options["binary"] = json!(binary);
        }
        let mut caps = serde_json::Map::new();
        caps.insert("goog:chromeOptions".into(), options);
        caps.insert("pageLoadStrategy".into(), json!("normal"));
        let mut builder =
            ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new());
        builder.capabilities(caps);
        let url = format!("http://127.0.0.1:{}", self.port);
        let connect = builder.connect(&url);
        tokio::time::timeout(Duration::from_secs(60), connect)
            .await
            .expect("chromedriver started chromium within 60 s")
            .unwrap_or_else(|e| panic!("chromedriver could not start chromium: {e}"))
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn screenshots_dir() -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The page, driven with bounded waits.
struct Page {
    client: Client,
    base: String,
}

impl Page {
    async fn goto(&self, hash: &str) {
        let url = format!("{}/ui/{hash}", self.base);
        let current = self.client.current_url().await.unwrap();
        if current.as_str().starts_with(&format!("{}/ui/", self.base)) {
            // Same document: a hash change renders the page without a reload. The page's
            // ready mark goes first, so that only the render of this hash sets it again;
            // going to the hash the page is on changes nothing, so the page is rendered
            // afresh as a hash change would (else a render from before, such as the one
            // an act's reload made while a task still ran, would pass for this one).
            self.js(&format!(
                "const main = document.querySelector('main'); if (main) delete main.dataset.ready; const same = location.hash === {0}; location.hash = {0}; if (same) window.dispatchEvent(new HashChangeEvent('hashchange')); return 0",
                json!(hash)
            ))
            .await;
        } else {
            self.client.goto(&url).await.unwrap();
        }
    }

    async fn js(&self, script: &str) -> Value {
        self.client
            .execute(script, Vec::new())
            .await
            .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Waits until `expr` (a JavaScript expression) is truthy; panics with `what` and the
    /// page's text after `WAIT`.
    async fn until(&self, what: &str, expr: &str) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let v = self
                .js(&format!(
                    "try {{ return ({expr}) || null; }} catch (e) {{ return null; }}"
                ))
                .await;
            if !v.is_null() && v != json!(false) {
                return v;
            }
            if Instant::now() >= deadline {
                let text = self
                    .js("return (document.body ? document.body.innerText : '') + '\\n[at ' + location.href + ', main ' + JSON.stringify(Object.assign({}, document.querySelector('main') && document.querySelector('main').dataset)) + ']'")
                    .await;
                panic!(
                    "the page did not show {what} within {WAIT:?}; it shows:\n{}",
                    text.as_str().unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for the page `name` to have rendered (`main[data-ready]`).
    async fn ready(&self, name: &str) {
        self.until(
            &format!("the {name} page"),
            &format!(
                "document.querySelector('main').dataset.ready === {} && document.querySelector('main').dataset.page === {}",
                json!(name),
                json!(name)
            ),
        )
        .await;
    }

    async fn click(&self, css: &str) {
        self.until(
            &format!("an enabled {css}"),
            &format!(
                "document.querySelector({}) && !document.querySelector({0}).disabled",
                json!(css)
            ),
        )
        .await;
        // A notice still shown from an earlier act must not pass for this one's.
        self.js("const n = document.getElementById('notice'); if (n) { n.hidden = true; n.dataset.kind = ''; } return 0")
            .await;
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap()
            .click()
            .await
            .unwrap_or_else(|e| panic!("cannot click {css}: {e}"));
    }

    async fn type_into(&self, css: &str, text: &str) {
        self.until(
            &format!("the field {css}"),
            &format!("document.querySelector({})", json!(css)),
        )
        .await;
        let field = self.client.find(Locator::Css(css)).await.unwrap();
        field.clear().await.unwrap();
        field.send_keys(text).await.unwrap();
    }

    /// Picks `value` in the drop-down `css`, as a person's choice would (a change event).
    async fn select(&self, css: &str, value: &str) {
        self.until(
            &format!("the drop-down {css} with {value}"),
            &format!(
                "document.querySelector({0}) && [...document.querySelector({0}).options].some((o) => o.value === {1})",
                json!(css),
                json!(value)
            ),
        )
        .await;
        self.js(&format!(
            "const s = document.querySelector({}); s.value = {}; s.dispatchEvent(new Event('change', {{ bubbles: true }})); return 0",
            json!(css),
            json!(value)
        ))
        .await;
    }

    async fn text(&self, css: &str) -> String {
        self.until(css, &format!("document.querySelector({})", json!(css)))
            .await;
        self.js(&format!(
            "return document.querySelector({}).textContent",
            json!(css)
        ))
        .await
        .as_str()
        .unwrap_or_default()
        .to_string()
    }

    /// Waits until the notice line says `kind` (`ok` or `error`) and returns its text.
    async fn notice(&self, kind: &str) -> String {
        self.until(
            &format!("an {kind} notice"),
            &format!("!document.getElementById('notice').hidden && document.getElementById('notice').dataset.kind === {} && document.getElementById('notice').textContent", json!(kind)),
        )
        .await
        .as_str()
        .unwrap_or_default()
        .to_string()
    }

    async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
        std::fs::write(screenshots_dir().join(format!("{name}.png")), png).unwrap();
    }

    async fn login(&self, token: &str) {
        self.until("the token form", "document.getElementById('token-input')")
            .await;
        self.type_into("#token-input", token).await;
        self.click("#login button[type=submit]").await;
    }
}

async fn hget(redis: &RedisServer, key: &str, field: &str) -> Option<String> {
    let mut conn = redis.conn().await;
    redis::cmd("HGET")
        .arg(key)
        .arg(field)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// Polls a hash field until it is `want`; panics after `WAIT`.
async fn wait_hash(redis: &RedisServer, key: &str, field: &str, want: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let got = hget(redis, key, field).await;
        if got.as_deref() == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{key} {field} is {got:?} in Redis, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_books_cancels_pauses_and_runs_in_a_real_browser() {
    let driver = Driver::start();
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(
        &redis.url(),
        &flags(
            &sink,
            &[("--api-tokens", "r3ad:read,b00k:book,adm1n:admin")],
        ),
    );
    let admin = Api::new(&host).with_token("adm1n");
    let ks = redis.keyspace().await;

    // What there is to see: a queue with a task waiting, a timer, a Life.
    let (status, reply) = admin
        .put(
            "/queues/mail",
            &json!({"rate": 10, "bucket_size": 5, "max_concurrent": 2}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    // Its token bucket, as the queue page shows it: full until a task takes one.
    let (_, queue) = admin.get("/queues/mail").await;
    assert_eq!(
        queue["bucket"],
        json!({"tokens": 5.0, "size": 5}),
        "{queue}"
    );
    let (status, reply) = admin
        .post(
            "/queues/mail/tasks",
            &json!({"name": "welcome-1", "countdown": 3600, "action": hook("task")}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let (status, reply) = admin
        .post(
            "/timers",
            &json!({"name": "nightly", "schedule": "0 3 * * *", "action": hook("timer")}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    book(
        &admin,
        &term(
            "api0booked",
            now_ms() + 3_600_000,
            now_ms() + 7_200_000,
            hook("b"),
            hook("d"),
        ),
    )
    .await;

    let page = Page {
        client: driver.browser().await,
        base: format!("http://{}", host.addr),
    };
    let result = tokio::time::timeout(
        Duration::from_secs(360),
        drive(&page, &redis, &sink, &ks, &admin),
    )
    .await;
    let _ = page.client.clone().close().await;
    result.expect("the browser session finished within 360 s");
}

async fn drive(page: &Page, redis: &RedisServer, sink: &Sink, ks: &Keyspace, admin: &Api) {
    // The page and its scripts need no token; the page asks for one.
    page.client
        .goto(&format!("{}/ui", page.base))
        .await
        .unwrap();
    assert!(page
        .client
        .current_url()
        .await
        .unwrap()
        .as_str()
        .ends_with("/ui/"));
    page.login("r3ad").await;
    page.ready("overview").await;
    assert_eq!(
        page.text("[data-metric='Hosts alive'] .value").await,
        "1",
        "one host is alive"
    );
    // Lives per state: the one term booked over the API waits for its birth.
    assert_eq!(
        page.text("[data-metric='Inexistent'] .value").await,
        "1",
        "one Life booked"
    );
    assert_eq!(page.text("[data-metric='Alive'] .value").await, "0");
    assert_eq!(page.text("#failed-runs").await, "0");
    // A few samples of /metrics for the charts.
    page.until(
        "the fires/s chart drawn from two samples",
        "document.querySelector('.chart polyline')",
    )
    .await;
    // With axes: three value gridlines labelled in its unit, and the first and last
    // sample's times.
    let axes = page
        .js("const c = document.querySelector('.chart'); return [c.querySelectorAll('line.grid').length, [...c.querySelectorAll('text.axis')].map((t) => t.textContent)]")
        .await;
    assert_eq!(axes[0], json!(3), "{axes}");
    let labels: Vec<&str> = axes[1]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(labels.len(), 5, "{labels:?}");
    assert!(labels[..3].iter().all(|l| l.ends_with("/s")), "{labels:?}");
    assert!(
        labels[3..].iter().all(|l| l.matches(':').count() == 2),
        "{labels:?}"
    );
    page.until(
        "the due-soon list (nothing in the next hour but the timer)",
        "document.body.innerText.includes('nightly')",
    )
    .await;
    page.screenshot("overview").await;

    // A read token sees what it may not do: each acting button is disabled and says why
    // (the answers' X-Kairos-Scope), here and on a queue's and a Life's page.
    page.goto("#/schedules").await;
    page.ready("schedules").await;
    page.until(
        "the Life booked over the API",
        "document.querySelector('tr[data-life=api0booked]')",
    )
    .await;
    let why = |css: &str| {
        format!(
            "(() => {{ const b = document.querySelector({0}); return b && b.disabled && b.title; }})()",
            json!(css)
        )
    };
    let said = page
        .until("a disabled Book button", &why("#book button[type=submit]"))
        .await;
    assert_eq!(
        said,
        json!("This token has the read scope; this needs book.")
    );
    page.goto("#/schedules/api0booked").await;
    page.ready("schedules").await;
    page.until("a disabled Cancel", &why("#cancel")).await;
    page.goto("#/queues/mail").await;
    page.ready("queues").await;
    let said = page.until("a disabled Purge", &why("#purge")).await;
    assert!(said.as_str().unwrap().ends_with("needs admin."), "{said}");
    page.screenshot("read-token").await;
    // The server refuses all the same: a button enabled by hand gets the API's 403, its
    // code and message shown.
    page.goto("#/schedules").await;
    page.ready("schedules").await;
    page.type_into("#book-id", "ui0booked").await;
    page.type_into("#book-birth", "+30m").await;
    page.js("const b = document.querySelector('#book button[type=submit]'); b.disabled = false; b.classList.remove('no-scope'); return 0")
        .await;
    page.click("#book button[type=submit]").await;
    let refused = page.notice("error").await;
    assert!(
        refused.starts_with("forbidden:") && refused.contains("book"),
        "{refused}"
    );
    assert_eq!(admin.get("/schedules/ui0booked").await.0, 404);

    // Another token: forget this one, give the admin token.
    page.click("#forget-token").await;
    page.login("adm1n").await;
    page.ready("schedules").await;

    // Book a term Life in the page.
    page.type_into("#book-id", "ui0booked").await;
    page.type_into("#book-resource", "conn-ui").await;
    page.js("document.getElementById('book-type').value = 'term'; return 0")
        .await;
    page.type_into("#book-birth", "+30m").await;
    page.type_into("#book-death", "+40m").await;
    page.click("#book button[type=submit]").await;
    page.notice("ok").await;
    // It opens the new Life.
    page.until(
        "the booked Life's page",
        "location.hash === '#/schedules/ui0booked' && document.querySelector('main').dataset.ready === 'schedules' && document.getElementById('life-state')",
    )
    .await;
    // Read as a person says it, the seed's name beside.
    assert_eq!(page.text("#life-state .badge").await, "Pending");
    assert_eq!(page.text("#life-state .seed").await, "Inexistent");
    assert_eq!(
        page.js("return document.querySelector('#life-state .badge').dataset.state")
            .await,
        json!("Inexistent")
    );
    let shard = ks.resource("conn-ui").clone();
    let (record, _) = redis.life_record(&shard, "ui0booked").await.unwrap();
    assert_eq!(record.state, "Inexistent");
    assert_eq!(record.resource_id.as_deref(), Some("conn-ui"));

    // Listed, filtered by resource; opened from the list.
    page.goto("#/schedules?resource_id=conn-ui").await;
    page.ready("schedules").await;
    page.until(
        "the booked Life in the list",
        "document.querySelector('tr[data-life=ui0booked]')",
    )
    .await;
    let rows = page
        .js("return document.querySelectorAll('tr[data-life]').length")
        .await;
    assert_eq!(rows, json!(1), "the filter leaves the other Life out");
    page.goto("#/schedules").await;
    page.ready("schedules").await;
    page.until(
        "both Lives in the list",
        "document.querySelectorAll('tr[data-life]').length === 2",
    )
    .await;
    page.screenshot("schedules").await;
    page.click("tr[data-life=ui0booked] a").await;
    page.until(
        "the Life's page from the list",
        "location.hash === '#/schedules/ui0booked' && document.getElementById('life-state')",
    )
    .await;
    page.until(
        "its two Plans",
        "document.querySelectorAll('tr[data-plan]').length === 2",
    )
    .await;
    page.screenshot("life").await;

    // Cancel it: asked once more, then Stillbirth in the page and in Redis.
    page.click("#cancel").await;
    page.click("[data-confirm=yes]").await;
    page.notice("ok").await;
    page.until(
        "the Life as Stillbirth",
        "document.querySelector('#life-state .badge') && document.querySelector('#life-state .badge').dataset.state === 'Stillbirth' && document.querySelector('#life-state').innerText.includes('Cancelled') && document.querySelector('#life-state .badge').dataset.outcome === 'cancelled'",
    )
    .await;
    let deadline = Instant::now() + WAIT;
    while redis
        .life_record(&shard, "ui0booked")
        .await
        .unwrap()
        .0
        .state
        != "Stillbirth"
    {
        assert!(
            Instant::now() < deadline,
            "the record never became Stillbirth"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        admin.get("/schedules/ui0booked").await.1["state"],
        "Stillbirth"
    );

    // Pause a queue from the list.
    page.goto("#/queues").await;
    page.ready("queues").await;
    page.until(
        "the queue's depth",
        "document.querySelector('tr[data-queue=mail] td:nth-child(4)').textContent === '1'",
    )
    .await;
    page.click("button[data-action=pause][data-queue=mail]")
        .await;
    page.notice("ok").await;
    page.until(
        "the queue as paused",
        "document.querySelector('button[data-action=resume][data-queue=mail]') && document.querySelector('tr[data-queue=mail] .badge').textContent === 'paused'",
    )
    .await;
    wait_hash(redis, &ks.queue("mail").queue("mail"), "state", "paused").await;
    page.screenshot("queues").await;
    page.goto("#/queues/mail").await;
    page.ready("queues").await;
    assert_eq!(page.text("#queue-state").await, "paused");
    assert_eq!(page.text("#queue-depth").await, "1");
    assert_eq!(
        page.text("#queue-bucket").await,
        "10/s, bucket 5, 5.0 tokens now"
    );
    page.until(
        "the waiting task",
        "document.querySelector('tr[data-task=welcome-1]')",
    )
    .await;
    page.screenshot("queue").await;

    // Run a timer now: the sink gets its call; its run shows in the page and in Redis.
    page.goto("#/timers").await;
    page.ready("timers").await;
    page.screenshot("timers").await;
    page.goto("#/timers/nightly").await;
    page.ready("timers").await;
    page.until(
        "five next fire times",
        "document.querySelectorAll('#preview li').length === 5",
    )
    .await;
    page.click("button[data-action=run][data-timer=nightly]")
        .await;
    page.notice("ok").await;
    sink.wait_until("the timer's call", WAIT, |got| {
        got.iter()
            .any(|r| r.header("x-kairos-timer") == Some("nightly"))
    })
    .await;
    let timer_key = ks.timer("nightly").timer("nightly");
    let deadline = Instant::now() + WAIT;
    while hget(redis, &timer_key, "last_run_at_ms").await.is_none() {
        assert!(
            Instant::now() < deadline,
            "the timer's run was not recorded in Redis"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let outcome = hget(redis, &timer_key, "last_outcome").await.unwrap();
    assert_eq!(outcome, "success", "as the run's record says it");
    // The page shows the run once it is recorded (Refresh until then).
    let deadline = Instant::now() + WAIT;
    loop {
        page.click("button.secondary").await;
        page.ready("timers").await;
        let shown = page
            .js("return document.querySelectorAll('#runs tbody tr').length > 0")
            .await;
        if shown == json!(true) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the timer's run did not show in the page"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    page.screenshot("timer").await;

    edit_a_timer(page, redis, ks).await;
    reschedule_a_life(page, redis, ks, admin).await;
    purge_a_queue(page, admin).await;
    see_what_failed(page, sink, admin).await;
    rerun_a_failed_task(page, sink, admin).await;
    upload_and_delete_a_plugin(page, admin).await;
}

/// Polls the API until `check` holds of `path`'s answer; panics after `WAIT`.
async fn wait_api(admin: &Api, path: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, body) = admin.get(path).await;
        if status == 200 && check(&body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: GET {path} answers {status} {body:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Edit a timer's schedule in its page: saved in Redis, shown in the page.
async fn edit_a_timer(page: &Page, redis: &RedisServer, ks: &Keyspace) {
    page.goto("#/timers/nightly").await;
    page.ready("timers").await;
    page.type_into("#edit-schedule", "30 4 * * *").await;
    page.type_into("#edit-priority", "1").await;
    page.click("#edit-timer button[type=submit]").await;
    page.notice("ok").await;
    let timer_key = ks.timer("nightly").timer("nightly");
    wait_hash(redis, &timer_key, "schedule", "30 4 * * *").await;
    assert_eq!(
        hget(redis, &timer_key, "priority").await.as_deref(),
        Some("1")
    );
    page.until(
        "the new schedule on the timer's page",
        "document.querySelector('main').dataset.ready === 'timers' && [...document.querySelectorAll('.card code')].some((c) => c.textContent === '30 4 * * *') && document.querySelector('#preview li') && document.querySelector('#preview li').textContent.includes('04:30')",
    )
    .await;
    page.screenshot("timer-edited").await;
}

/// Move a Life's birth with the reschedule form (PATCH): the new time in the page, in
/// Redis and through the API.
async fn reschedule_a_life(page: &Page, redis: &RedisServer, ks: &Keyspace, admin: &Api) {
    let (_, before) = admin.get("/schedules/api0booked").await;
    let old_ms = before["birth_time_ms"].as_i64().unwrap();
    page.goto("#/schedules/api0booked").await;
    page.ready("schedules").await;
    page.type_into("#patch-birth", "+90m").await;
    let asked_ms = now_ms() + 90 * 60_000;
    page.click("#reschedule button[type=submit]").await;
    page.notice("ok").await;
    let after = wait_api(admin, "/schedules/api0booked", "the new birth", |l| {
        l["birth_time_ms"].as_i64() != Some(old_ms)
    })
    .await;
    let new_ms = after["birth_time_ms"].as_i64().unwrap();
    assert!(
        (new_ms - asked_ms).abs() < 10_000,
        "birth moved to {new_ms}, asked about {asked_ms}"
    );
    assert_eq!(plan(&after, "birth")["fire_at_ms"].as_i64(), Some(new_ms));
    let (record, _) = redis
        .life_record(ks.life("api0booked"), "api0booked")
        .await
        .unwrap();
    assert_eq!(record.birth_ms, new_ms, "the Life's record in Redis");
    // The page shows the API's time as it reads it (`T` a space, no fraction).
    let birth = after["birth_time"].as_str().unwrap();
    page.until(
        "the new birth time in the page",
        &format!(
            "document.getElementById('life-state') && document.querySelector('tr[data-plan=birth] td:nth-child(3) span').title === {}",
            json!(birth)
        ),
    )
    .await;
    page.screenshot("life-rescheduled").await;
}

/// Purge the paused queue from its page: its waiting task is gone.
async fn purge_a_queue(page: &Page, admin: &Api) {
    page.goto("#/queues/mail").await;
    page.ready("queues").await;
    assert_eq!(page.text("#queue-depth").await, "1");
    page.click("#purge").await;
    page.click("[data-confirm=yes]").await;
    let said = page.notice("ok").await;
    assert!(said.contains("purged"), "{said}");
    page.until(
        "the queue empty",
        "document.getElementById('queue-depth') && document.getElementById('queue-depth').textContent === '0' && !document.querySelector('tr[data-task=welcome-1]')",
    )
    .await;
    let (_, queue) = admin.get("/queues/mail").await;
    assert_eq!(queue["tasks"]["pending"], 0, "{queue}");
    assert_eq!(admin.get("/queues/mail/tasks/welcome-1").await.0, 404);
}

/// The overview's failed count leads to the Failures page, which lists a queue task, a
/// timer's last run and a Life's birth that failed for good, each with its error, and
/// re-runs the task from there.
async fn see_what_failed(page: &Page, sink: &Sink, admin: &Api) {
    sink.answer_paths(&[("/broken", 500), ("/missing", 404)]);
    let broken = json!({"path": "/broken", "method": "POST"});
    let missing = json!({"path": "/missing", "method": "POST", "retry_count": 0});
    let (status, reply) = admin
        .put("/queues/fragile", &json!({"retry": {"limit": 0}}))
        .await;
    assert_eq!(status, 200, "{reply}");
    let (status, reply) = admin
        .post(
            "/queues/fragile/tasks",
            &json!({"name": "ft1", "action": broken}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let (status, reply) = admin
        .post(
            "/timers",
            &json!({"name": "doomed", "schedule": "* * * * * *", "timezone": "UTC", "retries": 0,
                    "action": {"path": "/missing", "method": "POST"}}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let (status, reply) = admin
        .post(
            "/schedules",
            &json!({"life_uuid": "lost", "birth_time": kairos_e2e::at_ms_from_now(2_000), "birth": missing}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    wait_api(admin, "/queues/fragile", "the task failed", |q| {
        q["tasks"]["failed"] == 1
    })
    .await;
    wait_api(admin, "/timers/doomed", "the timer failed", |t| {
        t["last_outcome"] == "failed"
    })
    .await;
    wait_api(admin, "/schedules/lost", "the birth failed", |l| {
        l["state"] == "Stillbirth"
    })
    .await;
    let (status, _) = admin.post("/timers/doomed/deactivate", &json!({})).await;
    assert_eq!(status, 200);

    page.goto("#/").await;
    page.ready("overview").await;
    page.click("#count-failed").await;
    page.ready("failures").await;
    for (row, error) in [
        ("#failed-tasks tr[data-task=ft1]", "500"),
        ("#failed-timers tr[data-timer=doomed]", "404"),
        ("#failed-lives tr[data-life=lost]", "404"),
        ("#failed-lives tr[data-life=lost]", "Birth failed"),
        ("#failed-lives tr[data-life=lost]", "birth_failed"),
    ] {
        page.until(
            &format!("{row} with {error}"),
            &format!("document.querySelector('{row}') && document.querySelector('{row}').innerText.includes('{error}')"),
        )
        .await;
    }
    page.screenshot("failures").await;
    page.click("#failed-tasks tr[data-task=ft1] button[data-action=run-task]")
        .await;
    let said = page.notice("ok").await;
    assert!(said.contains("re-run"), "{said}");
    sink.wait_until("the task's second call", WAIT, |got| {
        got.iter()
            .filter(|r| r.header("x-kairos-task") == Some("ft1"))
            .count()
            == 2
    })
    .await;
    wait_api(admin, "/queues/fragile", "the task failed again", |q| {
        q["tasks"]["failed"] == 1
    })
    .await;

    // The queue's own page: its failed tasks with their failure time, re-run all of them
    // at once, then delete all of them at once.
    page.goto("#/queues/fragile").await;
    page.ready("queues").await;
    let failed_at = page.text("#failed tr[data-task=ft1] td:nth-child(3)").await;
    assert!(
        failed_at.starts_with("20") && failed_at.contains("ago"),
        "{failed_at}"
    );
    page.click("#rerun-all-failed").await;
    page.click("[data-confirm=yes]").await;
    let said = page.notice("ok").await;
    assert!(said.contains("re-run"), "{said}");
    sink.wait_until("the task's third call", WAIT, |got| {
        got.iter()
            .filter(|r| r.header("x-kairos-task") == Some("ft1"))
            .count()
            == 3
    })
    .await;
    wait_api(
        admin,
        "/queues/fragile",
        "the task failed a third time",
        |q| q["tasks"]["failed"] == 1,
    )
    .await;
    // The task's own page: its attempts, newest first, each with its answer.
    page.goto("#/queues/fragile/tasks/ft1").await;
    page.ready("queues").await;
    page.until(
        "the task's three attempts",
        "document.querySelectorAll('#task-runs tbody tr').length === 3 && [...document.querySelectorAll('#task-runs tbody tr')].every((r) => r.innerText.includes('target answered 500'))",
    )
    .await;
    page.screenshot("task").await;
    page.goto("#/queues/fragile").await;
    page.ready("queues").await;
    page.click("#delete-all-failed").await;
    page.click("[data-confirm=yes]").await;
    let said = page.notice("ok").await;
    assert!(said.contains("deleted"), "{said}");
    wait_api(admin, "/queues/fragile", "no failed task left", |q| {
        q["tasks"]["failed"] == 0
    })
    .await;
    assert_eq!(admin.get("/queues/fragile/tasks/ft1").await.0, 404);

    // The list says how many Lives there are in all (the shards' census), and a Life is
    // found by its id.
    page.goto("#/schedules").await;
    page.ready("schedules").await;
    let count = page.text("#list-count").await;
    let (_, metrics) = admin.text("/metrics").await;
    let lives: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("kairos_lives{"))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
        .sum();
    assert!(lives >= 2.0, "{metrics}");
    assert!(
        count.contains(&format!(" of {lives}, ")),
        "{count} vs {lives} Lives"
    );
    // One time zone for every column, chosen in the header: UTC, then this browser's.
    let birth = "document.querySelector('tr[data-life=lost] td:nth-child(6) span.time').firstChild.textContent";
    page.select("#zone-toggle", "utc").await;
    page.ready("schedules").await;
    let utc = page.js(&format!("return {birth}")).await;
    assert!(
        utc.as_str()
            .is_some_and(|t| t.ends_with('Z') && t.len() == 20),
        "{utc}"
    );
    page.select("#zone-toggle", "local").await;
    page.ready("schedules").await;
    let local = page.js(&format!("return {birth}")).await;
    let local = local.as_str().unwrap_or_default().to_string();
    let offset = &local[local.len().saturating_sub(6)..];
    assert!(
        local.len() == 25
            && (offset.starts_with('+') || offset.starts_with('-'))
            && &offset[3..4] == ":",
        "{local}"
    );
    page.select("#zone-toggle", "host").await;
    page.ready("schedules").await;

    // Filtered on outcome, newest first: the Life whose birth failed, with why.
    page.select("#filter-outcome", "birth_failed").await;
    page.select("#filter-order", "desc").await;
    page.click("#filters button[type=submit]").await;
    page.until(
        "the Lives whose birth failed, newest first",
        "location.hash.includes('outcome=birth_failed') && location.hash.includes('order=desc') && document.querySelector('main').dataset.ready === 'schedules' && document.querySelector('tr[data-life=lost] td:nth-child(4)') && document.querySelector('tr[data-life=lost] td:nth-child(4)').title.includes('404') && document.getElementById('list-count').innerText.includes('newest first')",
    )
    .await;
    page.screenshot("lives-failed-newest-first").await;
    page.type_into("#find-life", "lost").await;
    page.click("#find button[type=submit]").await;
    page.until(
        "the Life's page",
        "location.hash === '#/schedules/lost' && document.querySelector('main').dataset.ready === 'schedules' && document.querySelector('h1').innerText.includes('lost')",
    )
    .await;

    // Auto-refresh: the page renders itself again within 5 s while it is on, and stays on
    // across pages until it is turned off.
    page.goto("#/failures").await;
    page.ready("failures").await;
    page.click("#auto-refresh").await;
    page.js("document.querySelector('h1').dataset.old = '1'; return true")
        .await;
    page.until(
        "a refresh of its own",
        "document.querySelector('main').dataset.ready === 'failures' && document.querySelector('h1') && !document.querySelector('h1').dataset.old",
    )
    .await;
    page.goto("#/queues").await;
    page.ready("queues").await;
    assert_eq!(
        page.js("return document.getElementById('auto-refresh').checked")
            .await,
        json!(true)
    );
    page.click("#auto-refresh").await;
    assert_eq!(
        page.js("return sessionStorage.getItem('kairos.autoRefresh')")
            .await,
        json!("0")
    );
}

/// A task that failed for good (the sink answers 500, no retry) is listed as failed and
/// re-run from the page; it then succeeds.
async fn rerun_a_failed_task(page: &Page, sink: &Sink, admin: &Api) {
    let (status, reply) = admin
        .put("/queues/flaky", &json!({"retry": {"limit": 0}}))
        .await;
    assert_eq!(status, 200, "{reply}");
    sink.answer(&[500]);
    let (status, reply) = admin
        .post(
            "/queues/flaky/tasks",
            &json!({"name": "t1", "action": hook("flaky")}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    wait_api(admin, "/queues/flaky", "the task failed", |q| {
        q["tasks"]["failed"] == 1
    })
    .await;
    page.goto("#/queues/flaky").await;
    page.ready("queues").await;
    page.until(
        "the failed task with its error",
        "document.querySelector('#failed tr[data-task=t1]') && document.querySelector('#failed tr[data-task=t1]').innerText.includes('500')",
    )
    .await;
    page.screenshot("queue-failed").await;
    page.click("#failed tr[data-task=t1] button[data-action=run-task]")
        .await;
    let said = page.notice("ok").await;
    assert!(said.contains("re-run"), "{said}");
    sink.wait_until("the task's second call", WAIT, |got| {
        got.iter()
            .filter(|r| r.header("x-kairos-task") == Some("t1"))
            .count()
            == 2
    })
    .await;
    wait_api(admin, "/queues/flaky", "the task done", |q| {
        q["tasks"]["failed"] == 0 && q["tasks"]["pending"] == 0 && q["tasks"]["running"] == 0
    })
    .await;
    let deadline = Instant::now() + WAIT;
    loop {
        page.click("button.secondary").await;
        page.ready("queues").await;
        let gone = page
            .js("return !document.querySelector('tr[data-task=t1]')")
            .await;
        if gone == json!(true) {
            break;
        }
        assert!(Instant::now() < deadline, "the re-run task still shows");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The component file of a plugin built from `plugins/` (as `plugin_wasm` finds it).
fn plugin_file(crate_name: &str) -> PathBuf {
    let dir = std::env::var("KAIROS_PLUGINS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../target-plugins/wasm32-wasip2/release")
        });
    let file = dir.join(format!("{crate_name}.wasm"));
    std::fs::canonicalize(&file).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; build the plugins first (scripts/test does: cargo build --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml --target-dir target-plugins)",
            file.display()
        )
    })
}

/// Upload a component in the page, see how many Lives use it, be refused its delete
/// while one does, then delete it.
async fn upload_and_delete_a_plugin(page: &Page, admin: &Api) {
    page.goto("#/plugins").await;
    page.ready("plugins").await;
    page.type_into("#upload-name", "noop").await;
    // A file input takes the file's path as keys (chromedriver runs here).
    let file = plugin_file("noop");
    page.client
        .find(Locator::Css("#upload-file"))
        .await
        .unwrap()
        .send_keys(file.to_str().unwrap())
        .await
        .unwrap();
    page.type_into("#upload-timeout", "5s").await;
    page.click("#upload button[type=submit]").await;
    page.notice("ok").await;
    page.until(
        "the uploaded plugin's page",
        "location.hash === '#/plugins/noop' && document.querySelector('main').dataset.ready === 'plugins' && document.getElementById('plugin-lives')",
    )
    .await;
    let (status, meta) = admin.get("/plugins/noop").await;
    assert_eq!(status, 200, "{meta}");
    assert_eq!(meta["version"], 1);
    assert_eq!(meta["timeout_ms"], 5000);
    assert_eq!(
        meta["size"].as_u64(),
        Some(std::fs::metadata(&file).unwrap().len()),
        "the file's bytes, whole"
    );
    let digest = meta["digest"].as_str().unwrap().to_string();
    assert!(page
        .js("return document.querySelector('main').innerText")
        .await
        .as_str()
        .unwrap()
        .contains(&digest));
    assert_eq!(page.text("#plugin-lives").await, "0");
    // noop declares no input schema (http-forward's is shown as JSON).
    assert_eq!(
        page.text("#plugin-schema").await,
        "none: any input is booked"
    );

    // A Life and a timer use it: counted on its page and in the list.
    book(
        admin,
        &point(
            "uses0noop",
            now_ms() + 3_600_000,
            json!({"plugin": "noop", "input": {}}),
        ),
    )
    .await;
    let (status, reply) = admin
        .post(
            "/timers",
            &json!({"name": "noop-timer", "schedule": "0 5 * * *", "action": {"plugin": "noop@1", "input": {}}, "active": false}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let (_, meta) = admin.get("/plugins/noop").await;
    assert_eq!(meta["unfinished_lives"], 1, "{meta}");
    assert_eq!(meta["timers"], json!(["noop-timer"]), "{meta}");
    page.goto("#/plugins").await;
    page.ready("plugins").await;
    page.until(
        "one Life using it in the list",
        "document.querySelector('tr[data-plugin=noop] .lives-using').textContent === '1' && document.querySelector('tr[data-plugin=noop]').innerText.includes('noop-timer')",
    )
    .await;
    page.screenshot("plugins").await;
    page.click("tr[data-plugin=noop] a").await;
    page.until(
        "the plugin's page with its users",
        "location.hash === '#/plugins/noop' && document.getElementById('plugin-lives') && document.getElementById('plugin-lives').textContent === '1' && document.getElementById('plugin-timers').textContent.includes('noop-timer')",
    )
    .await;
    page.screenshot("plugin").await;

    // In use: the delete is refused with the API's code.
    page.click("#delete-plugin").await;
    page.click("[data-confirm=yes]").await;
    let refused = page.notice("error").await;
    assert!(refused.starts_with("plugin_in_use:"), "{refused}");
    assert_eq!(admin.get("/plugins/noop").await.0, 200);

    // Once nothing uses it, deleted; gone from the list and the API.
    assert_eq!(admin.delete("/schedules/uses0noop").await.0, 200);
    assert_eq!(admin.delete("/timers/noop-timer").await.0, 200);
    page.click("button.secondary").await;
    page.until(
        "no user left",
        "document.getElementById('plugin-lives') && document.getElementById('plugin-lives').textContent === '0' && document.getElementById('plugin-timers').textContent === 'none'",
    )
    .await;
    page.click("#delete-plugin").await;
    page.click("[data-confirm=yes]").await;
    page.notice("ok").await;
    page.until(
        "the plugin list without it",
        "location.hash === '#/plugins' && document.querySelector('main').dataset.ready === 'plugins' && !document.querySelector('tr[data-plugin=noop]')",
    )
    .await;
    assert_eq!(admin.get("/plugins/noop").await.0, 404);
}

/// Without a browser: the page and its scripts answer without a token (with a policy
/// that forbids inline and foreign scripts), the API behind them still wants one, and
/// the dashboard is no part of the API's document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_needs_no_token_and_is_not_in_the_api_document() {
    let redis = RedisServer::start();
    let host = Host::start(
        &redis.url(),
        &flags_with(fast_flags(), &[("--api-tokens", "r3ad:read")]),
    );
    let anon = Api::new(&host);
    let (status, headers, _) = anon
        .call(axum::http::Method::GET, "/ui", Vec::new(), &[])
        .await;
    assert_eq!(status, 308);
    assert_eq!(headers["location"], "ui/");
    for (path, kind) in [
        ("/ui/", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/lib.js", "text/javascript"),
        ("/ui/pages.js", "text/javascript"),
        ("/ui/failures.js", "text/javascript"),
        ("/ui/queues.js", "text/javascript"),
        ("/ui/style.css", "text/css"),
    ] {
        let (status, headers, _) = anon
            .call(axum::http::Method::GET, path, Vec::new(), &[])
            .await;
        assert_eq!(status, 200, "{path}");
        let content_type = headers["content-type"].to_str().unwrap();
        assert!(content_type.starts_with(kind), "{path}: {content_type}");
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("script-src 'self'"), "{path}: {csp}");
    }
    let (status, body) = anon.get("/ui/nosuch.js").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    assert_eq!(anon.get("/schedules").await.0, 401);

    let (status, doc) = anon.with_token("r3ad").get("/openapi.json").await;
    assert_eq!(status, 200);
    let paths: Vec<&String> = doc["paths"].as_object().unwrap().keys().collect();
    assert!(
        paths.iter().all(|p| !p.starts_with("/ui")),
        "the dashboard is not an API route: {paths:?}"
    );
}
