//! `xfmr serve` as shipped, its allocator included (mimalloc, which `xfmr` installs and the
//! library's own tests do not): a burst of large prompts leaves no memory behind (issue 43).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use xfmr_testing::http::{burst, get, large_chat, memory_of, post, request, BurstMemory};
use xfmr_testing::tiny_gguf::tiny_gguf_with_context;

/// `xfmr serve` in a child process, killed when dropped.
struct Serving(Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Three bursts of 48 concurrent chats of 1 MB each (far over the tiny model's 4096-token
/// context: each is refused, 400) against the `xfmr` binary serving the tiny GGUF model: each
/// burst's peak (the kernel's high-water mark reset before it) stays under twice the resident
/// memory before it, and 3 s after the third burst the server has given back at least half of
/// what the bursts added (issue 43: memory returned after a burst, within a stated margin).
/// 3 s: the server's blocking threads give their memory back as they stop, 1 s after their
/// last task; 1.5 s (0.5 s of margin) kept over half in 2 of 3 runs of the debug binary on
/// the Intel Xeon kind (2026-12-04, 40 MiB against 30 idle; 5 of 5 passed at 3 s).
///
/// Why half, and not issue 43's 10 % of idle: this server idles at ~30 MiB, and a burst adds
/// only ~20 MiB (admission keeps 4 MiB of bodies in flight), so what mimalloc keeps cached
/// in its threads' heaps and arena whatever the load (measured 0–10 MiB after one burst,
/// idle itself 28–40 MiB from run to run, Zen 3) is of the same size as the 10 %; a margin of
/// 10 % + 1 MiB failed stop 52's CI run and 1 local run in 3. Without the server's idle hook
/// the same three bursts kept 70–86 % of what they added, more with each burst (resident
/// memory idle 29 MiB, 48 after the first burst, 60 after the fifth): the fault this test
/// catches. On SmolLM2 (docs/reliability.md) the hook gives
/// back all but 2 % of idle.
#[test]
fn serve_binary_returns_a_bursts_memory() {
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    std::fs::write(&model, tiny_gguf_with_context(7, 4096)).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_xfmr"))
        .args(["serve", "--llm", model.to_str().unwrap(), "--port", "0"])
        .arg("--no-request-log")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the xfmr binary runs");
    let mut server = Serving(child);
    let mut stdout = BufReader::new(server.0.stdout.take().unwrap());
    let addr: SocketAddr = loop {
        let mut line = String::new();
        if stdout.read_line(&mut line).unwrap() == 0 {
            panic!("xfmr serve ended before it listened");
        }
        // `xfmr serve: http://127.0.0.1:PORT/ (OpenAI API under /v1)`
        if let Some(rest) = line.strip_prefix("xfmr serve: http://") {
            break rest.split('/').next().unwrap().parse().unwrap();
        }
    };
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    assert_eq!(get(addr, "/health").status, 200);
    let body = large_chat(1_000_000);
    let send = || request(addr, "POST", "/v1/chat/completions", &body);
    // Warm up: one of each answer, so that idle includes what a first request allocates once.
    for _ in 0..2 {
        let refused = send();
        assert_eq!(refused.status, 400, "{}", refused.json());
        assert_eq!(refused.json()["error"]["code"], "context_length_exceeded");
        let chat = serde_json::json!({"max_tokens": 2,
                                      "messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(post(addr, "/v1/chat/completions", &chat).status, 200);
    }
    std::thread::sleep(Duration::from_millis(500));
    let settle = Duration::from_millis(3000);
    let (idle_before, _) = memory_of(server.0.id());
    let mut highest = 0;
    let mut settled = 0;
    for round in 1..=3 {
        // Each burst's peak is its own: reset the high-water mark `burst` also reads.
        // Without it (a kernel that refuses), the peak is the process's highest so far.
        let reset = format!("/proc/{}/clear_refs", server.0.id());
        if let Err(e) = std::fs::write(&reset, "5") {
            eprintln!("{reset}: {e}: each peak counts the earlier ones");
        }
        let (statuses, memory) = burst(server.0.id(), 48, settle, || send().status);
        assert!(statuses.iter().all(|&s| s == 400), "{statuses:?}");
        let BurstMemory { idle, peak, after } = memory;
        eprintln!(
            "xfmr serve, burst {round} of 48 x 1 MB chats: before {} MiB, peak {} MiB, \
             {:.1} s after {} MiB",
            idle / MIB,
            peak / MIB,
            settle.as_secs_f64(),
            after / MIB
        );
        assert!(
            peak < 2 * idle,
            "burst {round}: peak {peak} bytes, before {idle}: over 2x"
        );
        highest = highest.max(peak);
        settled = after;
    }
    let added = highest.saturating_sub(idle_before);
    let kept = settled.saturating_sub(idle_before);
    assert!(
        kept <= added / 2,
        "idle {idle_before} bytes, peak {highest}, after the bursts {settled}: kept {kept} of \
         the {added} the bursts added (over half)"
    );
}
