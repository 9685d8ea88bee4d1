//! The page in a real browser: Debian's `chromium`, headless, loads `/` with a sentence in the
//! URL, the attention explorer runs it through `/v1/attention`, and the DOM it leaves behind
//! (`--dump-dom`) has the heat grid; a screenshot shows it.

use std::path::PathBuf;
use std::process::Command;

use crate::client::get;
use crate::server::{start, translation_model, TRANSLATION};

/// The browser, or why the test cannot run: in CI (`$CI` set) a failure, elsewhere a loud skip.
fn chromium() -> Option<PathBuf> {
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .map(|name| PathBuf::from("/usr/bin").join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        let how = "install it (`apt-get install chromium`), then `cargo test --workspace --test serve serve_page`";
        if std::env::var_os("CI").is_some() {
            panic!("no chromium for the page's browser test: {how}");
        }
        eprintln!("\n*** SKIPPED serve_page: no chromium in /usr/bin; {how} ***\n");
    }
    found
}

fn headless(browser: &PathBuf) -> Command {
    let mut c = Command::new(browser);
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--virtual-time-budget=30000",
    ]);
    c
}

#[test]
fn serve_page_runs_the_attention_explorer_in_chromium() {
    let Some(browser) = chromium() else { return };
    let server = start(xfmr_serve::ServeConfig::default());
    let addr = server.addr();
    let page = get(addr, "/");
    assert_eq!(page.status, 200);
    assert!(page
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
    let html = String::from_utf8(page.body).unwrap();
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no CDN"
    );

    let sentence = "Y dijo Dios: Sea la luz";
    let url = format!(
        "http://{addr}/?attention={}&model={TRANSLATION}&view=grid&layer=2&head=3",
        sentence.replace(' ', "%20").replace(':', "%3A")
    );
    let out = headless(&browser)
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dom = String::from_utf8(out.stdout).unwrap();
    let (model, tokenizer) = translation_model();
    let want = xfmr_translate::translation_attention(&model, &tokenizer, sentence, 64).unwrap();
    let n = want.source.len();
    // The grid of the encoder's self-attention, layer 2, head 3: n × n cells.
    let grid =
        format!("id=\"grid\" data-layer=\"2\" data-head=\"3\" data-rows=\"{n}\" data-cols=\"{n}\"");
    assert!(dom.contains(&grid), "no {grid} in the DOM:\n{dom}");
    // The grid as the script built it (the script's own source, later in the DOM, excluded).
    let grid_dom = &dom[dom.find("id=\"grid\"").unwrap()..dom.find("<script").unwrap()];
    assert_eq!(grid_dom.matches("class=\"cell\"").count(), n * n);
    // The cell of query 0, key 0 carries the model's own weight.
    let w00 = want.encoder[1][2 * n * n];
    let cell = "data-q=\"0\" data-k=\"0\" data-w=\"";
    let at = dom.find(cell).expect("cell (0, 0)") + cell.len();
    let shown: f32 = dom[at..at + dom[at..].find('"').unwrap()].parse().unwrap();
    assert!((shown - w00).abs() <= 1e-4, "{shown} vs {w00}");
    assert!(dom.contains("2 map(s), 2 layers × 4 heads"), "status line");
    assert!(dom.contains(&format!("translation: “{}”", want.translation)));

    // A screenshot: a PNG of the page as a person sees it.
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("page.png");
    let status = headless(&browser)
        .arg(format!("--screenshot={}", png.display()))
        .arg("--window-size=1280,900")
        .arg(&url)
        .output()
        .unwrap();
    assert!(status.status.success());
    let bytes = std::fs::read(&png).unwrap();
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000,
        "{} bytes",
        bytes.len()
    );
}
