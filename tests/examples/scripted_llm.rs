//! The tests' scripted OpenAI-compatible server (`primus_tests::chat`) on its own, to run
//! `primus tune --searcher agent` against by hand:
//!
//! ```console
//! $ cargo run -p primus-tests --example scripted_llm -- 8088 read &
//! $ primus tune -f plan.yaml --searcher agent --agent-endpoint http://127.0.0.1:8088/v1 \
//!       --agent-model scripted --trials trials.jsonl --plot best.svg
//! ```
//!
//! Arguments: the port (0: any free one), then the script, one answer per request (the last
//! repeats): `read`, `reasoning`, `malformed`, `500`, `never`. It serves until killed.

use primus_tests::chat::{Answer, ChatServer};

fn main() {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let script: Vec<Answer> = args
        .map(|a| match a.as_str() {
            "read" => Answer::Read,
            "reasoning" => Answer::Reasoning,
            "malformed" => Answer::Content("I would use more tensor parallelism.".into()),
            "500" => Answer::Raw(500, "{\"error\": \"overloaded\"}".into()),
            "never" => Answer::Never,
            other => {
                eprintln!("unknown answer {other:?}: read, reasoning, malformed, 500, never");
                std::process::exit(2);
            }
        })
        .collect();
    let script = if script.is_empty() {
        vec![Answer::Read]
    } else {
        script
    };
    let server = ChatServer::start_on(&format!("127.0.0.1:{port}"), script);
    println!("{}", server.base_url());
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}
