//! Issue 42: fleetd's dashboard in a real browser. Debian's chromium, headless, driven through
//! chromium-driver (WebDriver) with fantoccini, against a cluster of two machines whose fleetd
//! serves its API over TLS with roles. The browser reaches it through local proxies that
//! present an operator's or a viewer's certificate ([`proxy`]), so the role the page shows
//! and acts by is the certificate's. Each check waits for what it is about; screenshots of
//! each page (cluster, unit, machine, events) at 1280×800 are written to
//! `target/dashboard-screenshots/`. Needs root.

#[path = "dashboard/proxy.rs"]
mod proxy;
mod support;

use anyhow::{Context, Result, bail, ensure};
use fantoccini::{Client, ClientBuilder, Locator};
use fleet_functional_tests::{ApiCerts, Cluster, FleetdSpec, Machine, OutputExt};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::{finish, sleeper, start};

const PORT: u16 = 49160;
/// The page's size in the browser, and so the screenshots'.
const VIEW: (u32, u32) = (1280, 800);
/// Submitted, then started with its page open: a line on its journal every 0.5 s.
const ECHO: &str = "echo.service";
/// How soon a change must show on the page without a reload (the issue's figure).
const LIVE_WITHIN: Duration = Duration::from_secs(2);
/// How long anything else may take to show.
const SHOWN_WITHIN: Duration = Duration::from_secs(20);
/// Metadata with markup in it: it must show as text.
const HOSTILE: &str = "<b>bold</b><script>alert(1)</script>";

/// chromium-driver on a free loopback port, killed when dropped.
struct Driver {
    child: Child,
    addr: SocketAddr,
}

impl Driver {
    fn start() -> Result<Driver> {
        let port = fleet_testing::free_ports(1)[0];
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting chromedriver (make deps installs chromium-driver)")?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let driver = Driver { child, addr };
        let up = Instant::now();
        while std::net::TcpStream::connect(addr).is_err() {
            ensure!(up.elapsed() < SHOWN_WITHIN, "chromedriver never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(driver)
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The browser's console messages at level SEVERE since the last call (chromedriver's
    /// log endpoint; errors, CSP violations and failed loads land there).
    fn severe(&self, session: &str) -> Result<Vec<String>> {
        let path = format!("/session/{session}/se/log");
        let answer = self.post(&path, r#"{"type":"browser"}"#)?;
        let log: Value = serde_json::from_str(&answer).with_context(|| answer.clone())?;
        Ok(log["value"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
            .collect())
    }
}

impl Driver {
    /// `POST path` of `body`; the answer's body, read as far as its Content-Length says
    /// (chromedriver keeps the connection open).
    fn post(&self, path: &str, body: &str) -> Result<String> {
        use std::io::{BufRead, BufReader, Read, Write};
        let mut stream = std::net::TcpStream::connect(self.addr)?;
        stream.set_read_timeout(Some(SHOWN_WITHIN))?;
        write!(
            stream,
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        let mut reader = BufReader::new(stream);
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line)?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse()?;
            }
        }
        let mut answer = vec![0; length];
        reader.read_exact(&mut answer)?;
        Ok(String::from_utf8_lossy(&answer).into_owned())
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn browser(driver: &Driver, profile: &Path) -> Result<Client> {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,800", format!("--user-data-dir={}", profile.display())],
        }),
    );
    caps.insert("goog:loggingPrefs".into(), json!({"browser": "ALL"}));
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let client = ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&driver.url())
        .await?;
    // The window's size holds headless chromium's own bars too: grown by them, the page
    // (and so each screenshot) is 1280×800.
    let bars = client
        .execute(
            "return [window.outerWidth - window.innerWidth, window.outerHeight - window.innerHeight]",
            vec![],
        )
        .await?;
    let bar = |i: usize| u32::try_from(bars[i].as_u64().unwrap_or(0)).unwrap_or(0);
    client
        .set_window_size(VIEW.0 + bar(0), VIEW.1 + bar(1))
        .await?;
    Ok(client)
}

fn screenshots() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/dashboard-screenshots")
}

async fn shoot(client: &Client, name: &str) -> Result<()> {
    let png = client.screenshot().await?;
    std::fs::create_dir_all(screenshots())?;
    std::fs::write(screenshots().join(format!("{name}.png")), png)?;
    Ok(())
}

/// Waits until `css` matches, for at most `within`; the time it took.
async fn shows(client: &Client, css: &str, within: Duration) -> Result<Duration> {
    let began = Instant::now();
    client
        .wait()
        .at_most(within)
        .every(Duration::from_millis(50))
        .for_element(Locator::Css(css))
        .await
        .with_context(|| format!("{css} not shown within {within:?}"))?;
    Ok(began.elapsed())
}

/// Waits until `script` (a function body returning a boolean) is true.
async fn until(client: &Client, script: &str, within: Duration) -> Result<()> {
    let began = Instant::now();
    loop {
        if client.execute(script, vec![]).await? == Value::Bool(true) {
            return Ok(());
        }
        if began.elapsed() > within {
            bail!("not true within {within:?}: {script}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Clicks the element `css` matches, once it does.
async fn click(client: &Client, css: &str) -> Result<()> {
    let script = format!(
        "const e = document.querySelector({css:?}); if (!e) return false; e.click(); return true;"
    );
    until(client, &script, SHOWN_WITHIN).await
}

fn write_unit(cluster: &Cluster, name: &str, text: &str) -> Result<String> {
    let dir = cluster.dir().join("units");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    Ok(path.display().to_string())
}

fn fleetctl_ok(cluster: &Cluster, args: &[&str]) -> Result<String> {
    cluster.fleetctl(args)?.checked()
}

/// What the cluster holds before the page opens: two sleepers, an echoer on `m1` submitted
/// but not started (its page is opened first: its history and journal then grow as it
/// starts), and markup in `m2`'s metadata.
fn populate(cluster: &Cluster, m1: &Machine, m2: &Machine) -> Result<()> {
    let paths = [
        write_unit(cluster, "hello1.service", &sleeper(420_001))?,
        write_unit(cluster, "hello2.service", &sleeper(420_002))?,
    ];
    let mut args = vec!["start"];
    args.extend(paths.iter().map(String::as_str));
    fleetctl_ok(cluster, &args)?;
    let echo = format!(
        "[Service]\nExecStart=/bin/sh -c 'while :; do echo tick-$$RANDOM; sleep 0.5; done'\n\
         [X-Fleet]\nMachineID={}\n",
        m1.id()
    );
    fleetctl_ok(cluster, &["submit", &write_unit(cluster, ECHO, &echo)?])?;
    fleetctl_ok(
        cluster,
        &["set-metadata", m2.id().as_str(), &format!("note={HOSTILE}")],
    )?;
    Ok(())
}

async fn cluster_page(client: &Client, driver: &Driver, session: &str, base: &str) -> Result<()> {
    client.goto(&format!("{base}/ui/")).await?;
    shows(client, "[data-machine]", SHOWN_WITHIN).await?;
    for unit in ["hello1.service", "hello2.service"] {
        shows(client, &format!("[data-unit='{unit}']"), SHOWN_WITHIN).await?;
    }
    until(
        client,
        "return document.querySelectorAll('[data-machine]').length === 2",
        SHOWN_WITHIN,
    )
    .await?;
    // Markup in metadata is text: shown as written, no element made of it, no alert.
    let hostile = format!("return document.body.textContent.includes({HOSTILE:?})");
    until(client, &hostile, SHOWN_WITHIN).await?;
    let made = client
        .execute(
            "return document.querySelectorAll('main b, main script').length",
            vec![],
        )
        .await?;
    ensure!(
        made == json!(0),
        "markup from metadata became {made} elements"
    );
    ensure!(
        client.get_alert_text().await.is_err(),
        "a script from metadata ran"
    );
    role_is(client, "operator").await?;
    let severe = driver.severe(session)?;
    ensure!(severe.is_empty(), "console errors: {severe:?}");
    Ok(())
}

/// The role the page shows: the one fleetd gave the certificate.
async fn role_is(client: &Client, role: &str) -> Result<()> {
    let script = format!("return document.getElementById('role').textContent === {role:?}");
    until(client, &script, SHOWN_WITHIN)
        .await
        .with_context(|| format!("the page never said role {role}"))
}

async fn live_updates(client: &Client, cluster: &Cluster) -> Result<()> {
    let path = write_unit(cluster, "arrives.service", &sleeper(420_003))?;
    fleetctl_ok(cluster, &["start", &path])?;
    let took = shows(client, "[data-unit='arrives.service']", LIVE_WITHIN).await?;
    eprintln!("a started unit showed on the page {took:?} after fleetctl returned");
    let crashy = "[Service]\nExecStart=/bin/sh -c 'sleep 1; exit 3'\n";
    let path = write_unit(cluster, "crashy.service", crashy)?;
    fleetctl_ok(cluster, &["start", "--no-block", &path])?;
    shows(
        client,
        "[data-unit='crashy.service'].shade-failed",
        SHOWN_WITHIN,
    )
    .await
    .context("the failing unit never turned red")?;
    shoot(client, "cluster").await?;
    // Its page says how it last exited and how often it was restarted (issue 41's facts).
    let back = client.current_url().await?;
    client
        .goto(back.join("#/unit/crashy.service")?.as_str())
        .await?;
    let exit = "const c = document.querySelector('#unit-states .state-exit');
                return !!c && c.textContent.includes('exit status 3')";
    until(client, exit, SHOWN_WITHIN)
        .await
        .context("the unit page never showed the last exit")?;
    client.goto(back.as_str()).await?;
    Ok(())
}

/// A write made by hand in the page, without the dashboard's header, is refused.
async fn hand_made_write(client: &Client, cluster: &Cluster) -> Result<()> {
    let status = client
        .execute_async(
            "const done = arguments[arguments.length - 1];
             fetch('/fleet/v1/units/hello2.service', {method: 'DELETE'})
               .then((r) => done(r.status), (e) => done(String(e)));",
            vec![],
        )
        .await?;
    ensure!(
        status == json!(403),
        "a DELETE without the header got {status}"
    );
    let status = client
        .execute_async(
            "const done = arguments[arguments.length - 1];
             fetch('/fleet/v1/units/hello2.service', {method: 'PUT',
               headers: {'Content-Type': 'application/json'}, body: '{\"desiredState\":\"inactive\"}'})
               .then((r) => done(r.status), (e) => done(String(e)));",
            vec![],
        )
        .await?;
    ensure!(
        status == json!(403),
        "a PUT without the header got {status}"
    );
    let files = fleetctl_ok(cluster, &["list-unit-files", "--no-legend"])?;
    let line = files.lines().find(|l| l.starts_with("hello2.service"));
    ensure!(
        line.is_some_and(|l| l.split_whitespace().nth(2) == Some("launched")),
        "it was destroyed or stopped: {files}"
    );
    Ok(())
}

/// The count of journal lines of the echoer on the page.
const ECHO_LINES: &str =
    "return document.getElementById('unit-journal').textContent.split('tick-').length - 1";

/// The echoer's page, opened before it starts: its history shows the start as it happens,
/// then its journal grows a line each half second.
async fn unit_page(client: &Client, cluster: &Cluster, base: &str) -> Result<()> {
    client.goto(&format!("{base}/ui/#/unit/{ECHO}")).await?;
    shows(
        client,
        "#unit-events tr[data-kind='submitted']",
        SHOWN_WITHIN,
    )
    .await
    .context("the unit's history")?;
    fleetctl_ok(cluster, &["start", "--no-block", ECHO])?;
    for kind in ["desired-changed", "scheduled", "started"] {
        shows(
            client,
            &format!("#unit-events tr[data-kind='{kind}']"),
            SHOWN_WITHIN,
        )
        .await
        .with_context(|| format!("no {kind} event in the live history"))?;
    }
    shows(client, "#unit-states [data-state-machine]", SHOWN_WITHIN).await?;
    let lines = format!("{ECHO_LINES} > 0");
    until(client, &lines, SHOWN_WITHIN)
        .await
        .context("no journal line on the unit page")?;
    let before = client
        .execute(ECHO_LINES, vec![])
        .await?
        .as_u64()
        .unwrap_or(0);
    let grew = format!("{ECHO_LINES} >= {}", before + 2);
    until(client, &grew, SHOWN_WITHIN)
        .await
        .context("the journal did not grow as lines were written")?;
    shoot(client, "unit").await
}

async fn stop_from_the_page(client: &Client, cluster: &Cluster, base: &str) -> Result<()> {
    client
        .goto(&format!("{base}/ui/#/unit/hello1.service"))
        .await?;
    until(
        client,
        "const h = document.getElementById('unit-name'); return !!h && h.textContent === 'hello1.service'",
        SHOWN_WITHIN,
    )
    .await?;
    shows(client, "#actions [data-action='stop']", SHOWN_WITHIN).await?;
    // Clicked in the page: the live parts are re-rendered as the cluster changes, so a
    // WebDriver element found a moment before may be gone.
    click(client, "#actions [data-action='stop']").await?;
    shows(client, "#confirm:not([hidden])", SHOWN_WITHIN).await?;
    click(client, "#confirm-yes").await?;
    let began = Instant::now();
    loop {
        let units = fleetctl_ok(cluster, &["list-unit-files", "--no-legend"])?;
        let line = units
            .lines()
            .find(|l| l.starts_with("hello1.service"))
            .unwrap_or_default()
            .to_owned();
        if line.split_whitespace().nth(2) == Some("loaded") {
            return Ok(());
        }
        if began.elapsed() > SHOWN_WITHIN {
            let said = client
                .execute(
                    "return document.getElementById('error').textContent",
                    vec![],
                )
                .await?;
            bail!("not stopped: {line:?}; the page says {said}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn machine_page(client: &Client, m2: &Machine, base: &str) -> Result<()> {
    client
        .goto(&format!("{base}/ui/#/machine/{}", m2.id()))
        .await?;
    shows(client, "#machine-metadata td", SHOWN_WITHIN).await?;
    shows(
        client,
        "#machine-events tr[data-kind='metadata-set']",
        SHOWN_WITHIN,
    )
    .await
    .context("the machine's events")?;
    shoot(client, "machine").await
}

/// The cluster's events, from the cluster page's link: live, and filtered by kind.
async fn events_page(client: &Client, cluster: &Cluster, base: &str) -> Result<()> {
    client.goto(&format!("{base}/ui/")).await?;
    click(client, "#to-events").await?;
    shows(client, "#events tr[data-kind='scheduled']", SHOWN_WITHIN).await?;
    let path = write_unit(cluster, "late.service", &sleeper(420_004))?;
    fleetctl_ok(cluster, &["start", "--no-block", &path])?;
    let took = shows(
        client,
        "#events tr[data-event-unit='late.service']",
        LIVE_WITHIN,
    )
    .await?;
    eprintln!("an event showed on the events page {took:?} after fleetctl returned");
    shows(
        client,
        "#events tr[data-kind='failed'][data-event-unit='crashy.service']",
        SHOWN_WITHIN,
    )
    .await?;
    shoot(client, "events").await?;
    client
        .goto(&format!("{base}/ui/#/events?kind=failed"))
        .await?;
    shows(client, "#events tr[data-kind='failed']", SHOWN_WITHIN).await?;
    let only = "return [...document.querySelectorAll('#events tr[data-kind]')].every((r) => r.dataset.kind === 'failed')";
    until(client, only, SHOWN_WITHIN)
        .await
        .context("the kind filter")?;
    Ok(())
}

/// Through a viewer's certificate the page says so and offers no action: not on a unit,
/// not on a machine; a write made by hand with the header is refused by fleetd's role.
async fn viewer_sees_no_actions(client: &Client, m2: &Machine, viewer: &str) -> Result<()> {
    client
        .goto(&format!("{viewer}/ui/#/unit/hello2.service"))
        .await?;
    role_is(client, "viewer").await?;
    shows(client, "#unit-states [data-state-machine]", SHOWN_WITHIN).await?;
    client
        .goto(&format!("{viewer}/ui/#/machine/{}", m2.id()))
        .await?;
    shows(client, "#machine-metadata td", SHOWN_WITHIN).await?;
    for page in ["#/unit/hello2.service", &format!("#/machine/{}", m2.id())] {
        client.goto(&format!("{viewer}/ui/{page}")).await?;
        shows(client, "#unit-live, #machine-live", SHOWN_WITHIN).await?;
        let controls = client
            .execute(
                "return document.querySelectorAll('#actions, button[data-action]').length",
                vec![],
            )
            .await?;
        ensure!(
            controls == json!(0),
            "a viewer sees {controls} action controls on {page}"
        );
    }
    let status = client
        .execute_async(
            "const done = arguments[arguments.length - 1];
             fetch('/fleet/v1/units/hello2.service', {method: 'DELETE', headers: {'X-Fleet-CSRF': '1'}})
               .then((r) => done(r.status), (e) => done(String(e)));",
            vec![],
        )
        .await?;
    ensure!(status == json!(403), "a viewer's DELETE got {status}");
    Ok(())
}

/// The proxies' addresses: the operator's and the viewer's certificate to `m1`'s fleetd.
async fn proxies(cluster: &Cluster, m1: &Machine) -> Result<(String, String)> {
    let certs: ApiCerts = cluster.api_certs().context("no certificates")?;
    let fleetd = SocketAddr::from((m1.ip(), PORT));
    let operator = certs.client("olga", "olga", &[])?;
    let viewer = certs.client("vera", "vera", &[])?;
    let operator = proxy::start(&certs.ca(), &operator, fleetd).await?;
    let viewer = proxy::start(&certs.ca(), &viewer, fleetd).await?;
    Ok((format!("http://{operator}"), format!("http://{viewer}")))
}

#[test]
fn the_dashboard_shows_the_cluster_live_escapes_what_it_shows_and_acts_by_role() -> Result<()> {
    let spec = FleetdSpec::default()
        .with_api_tls(PORT)
        .with_env("FLEET_API_OPERATORS", "CN=olga")
        .with_env("FLEET_API_VIEWERS", "CN=vera");
    let (cluster, _registry) = start(2, spec)?;
    let (m1, m2) = (&cluster.machines()[0], &cluster.machines()[1]);
    populate(&cluster, m1, m2)?;
    let driver = Driver::start()?;
    let profile = cluster.dir().join("chromium-profile");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (base, viewer) = proxies(&cluster, m1).await?;
        let client = browser(&driver, &profile).await?;
        let session = client.session_id().await?.context("no session id")?;
        let checks = async {
            cluster_page(&client, &driver, &session, &base).await?;
            live_updates(&client, &cluster).await?;
            hand_made_write(&client, &cluster).await?;
            unit_page(&client, &cluster, &base).await?;
            stop_from_the_page(&client, &cluster, &base).await?;
            machine_page(&client, m2, &base).await?;
            events_page(&client, &cluster, &base).await?;
            viewer_sees_no_actions(&client, m2, &viewer).await?;
            let severe = driver.severe(&session)?;
            // The hand-made writes' 403s are the errors the test itself caused.
            let unexpected: Vec<_> = severe.iter().filter(|m| !m.contains("403")).collect();
            ensure!(unexpected.is_empty(), "console errors: {unexpected:?}");
            anyhow::Ok(())
        };
        let res = checks.await;
        if res.is_err() {
            let _ = shoot(&client, "failure").await;
        }
        let _ = client.close().await;
        res
    })?;
    drop(driver);
    finish(cluster)
}
