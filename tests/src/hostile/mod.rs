//! Hostile input, run safely (issue 13): each generated case runs in its own thread with a
//! small stack, under a time budget and an allocation budget (a counting global allocator the
//! test binary installs, [`Counting`]), and the whole property test runs in a child process
//! whose address space is capped (`ulimit -v`), so a stack overflow or a runaway allocation
//! (which abort rather than panic) fails the test with the case that did it instead of taking
//! the test run, or the machine, down.
//!
//! A test binary declares `#[global_allocator] static A: Counting = Counting;` and pairs a
//! driver test that calls [`in_capped_child`] with the child test that runs the cases through
//! [`Cases`] (it returns at once outside the child). The generators of hostile plans, jobs,
//! annotations, Megatron arguments and pipeline layouts are in [`inputs`].

pub mod inputs;

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write as _;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting the bytes live in the process and their peak.
pub struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's arguments.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                let grow = new_size - layout.size();
                let now = LIVE.fetch_add(grow, Ordering::Relaxed) + grow;
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

/// Whether [`Counting`] is the global allocator of this binary.
pub fn counting_installed() -> bool {
    let before = PEAK.load(Ordering::Relaxed);
    let probe = vec![0u8; 1 << 20];
    let seen = PEAK.load(Ordering::Relaxed) >= before.max(probe.len());
    drop(std::hint::black_box(probe));
    seen
}

/// What one case may use.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Stack of the thread the case runs on.
    pub stack: usize,
    /// Wall time of the case.
    pub time: Duration,
    /// Bytes the case may hold live at once (process-wide peak above the start).
    pub bytes: usize,
}

/// Environment variable that marks the child process.
const CHILD: &str = "PRIMUS_HOSTILE_CHILD";

/// Whether this process is the capped child that runs the cases.
pub fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// Cases per property: `PRIMUS_HOSTILE_CASES`, else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("PRIMUS_HOSTILE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Run the test `child_test` of this binary in a child process with its address space capped
/// at `address_space` bytes (`ulimit -v`); fail with the tail of its output when it fails,
/// panics or aborts. Returns its stdout (the case counts it printed).
pub fn in_capped_child(child_test: &str, address_space: u64) -> String {
    let exe = std::env::current_exe().expect("the test binary");
    let kib = address_space / 1024;
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {kib} && exec \"$0\" \"$@\""))
        .arg(&exe)
        .args([child_test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        // Few malloc arenas: each reserves 64 MiB of address space.
        .env("MALLOC_ARENA_MAX", "2")
        .output()
        .expect("run the child test");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    assert!(
        out.status.success() && stdout.contains("hostile cases:"),
        "the hostile-input child {child_test} failed ({}; a signal is an abort: stack overflow or allocation failure):\n{}\n--- stdout\n{}",
        out.status,
        tail.join("\n"),
        stdout.lines().rev().take(10).collect::<Vec<_>>().join("\n")
    );
    for line in stdout.lines() {
        if let Some(i) = line
            .find("hostile cases:")
            .or_else(|| line.find("outcomes:"))
        {
            println!("{}", &line[i..]);
        }
    }
    stdout
}

/// Run `f` on a fresh thread with the budget's stack; `Err` on a panic, on running past the
/// time budget (then the process exits: the thread cannot be stopped) or on holding more than
/// the allocation budget.
pub fn run_case<T: Send + 'static>(
    budget: &Budget,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let start_live = LIVE.load(Ordering::Relaxed);
    PEAK.store(start_live, Ordering::Relaxed);
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    let handle = std::thread::Builder::new()
        .stack_size(budget.stack)
        .name("hostile-case".into())
        .spawn(move || {
            let r = f();
            let _ = tx.send(());
            r
        })
        .map_err(|e| format!("cannot start the case thread: {e}"))?;
    if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(budget.time) {
        eprintln!("hostile case ran past {:?}: {what}", budget.time);
        let _ = std::io::stderr().flush();
        std::process::exit(3);
    }
    let r = handle.join().map_err(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".into());
        format!("panicked after {:?}: {msg}", started.elapsed())
    })?;
    let held = PEAK.load(Ordering::Relaxed).saturating_sub(start_live);
    if held > budget.bytes {
        return Err(format!(
            "held {held} bytes at once (budget {})",
            budget.bytes
        ));
    }
    Ok(r)
}

/// A property over generated hostile inputs, each run with [`run_case`]; prints
/// `hostile cases: N <entry point>` for the driver.
pub struct Cases {
    pub entry: &'static str,
    pub cases: u32,
    pub budget: Budget,
}

impl Cases {
    /// Run `check` on `cases` inputs of `strategy` (each case's description is the input's
    /// `Debug`, cut short); panic with the smallest failing input.
    pub fn run<S, F>(&self, strategy: S, check: F)
    where
        S: Strategy,
        S::Value: Send + Clone + std::fmt::Debug + 'static,
        F: Fn(S::Value) -> Result<(), String> + Send + Sync + Clone + 'static,
    {
        assert!(
            counting_installed(),
            "the test binary must install hostile::Counting as its global allocator"
        );
        let mut runner = TestRunner::new(Config {
            cases: self.cases,
            failure_persistence: None,
            // Shrinking re-runs cases of seconds each: bounded, so a failure is reported in
            // minutes, not after the CI's time limit.
            max_shrink_time: 120_000,
            ..Config::default()
        });
        let ran = AtomicUsize::new(0);
        let budget = self.budget;
        let result = runner.run(&strategy, |input| {
            let n = ran.fetch_add(1, Ordering::Relaxed);
            let what = short_debug(&input);
            // Before the case: an abort (stack overflow, allocation failure) leaves this as
            // the last line the driver shows.
            eprintln!("hostile case {n} ({}): {what}", self.entry);
            let check = check.clone();
            match run_case(&budget, &what, move || check(input)) {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) | Err(e) => Err(TestCaseError::fail(format!("{e}: {what}"))),
            }
        });
        match result {
            Ok(()) => {}
            // The reason first and the input cut short: the driver shows only the tail of
            // the child's output, and a pretty-printed input fills it.
            Err(TestError::Fail(reason, input)) => panic!(
                "{}: {reason}; smallest failing input: {}",
                self.entry,
                short_debug(&input)
            ),
            Err(e @ TestError::Abort(_)) => panic!("{}: {}", self.entry, short(&e.to_string())),
        }
        println!(
            "hostile cases: {} {}",
            ran.load(Ordering::Relaxed),
            self.entry
        );
    }
}

/// At most 300 characters of a value's `Debug`, formatting no more than that (inputs of
/// millions of characters would take seconds to format in a debug build).
pub fn short_debug<T: std::fmt::Debug>(value: &T) -> String {
    struct Cut(String);
    impl std::fmt::Write for Cut {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let room = SHORT.saturating_sub(self.0.chars().count());
            self.0.extend(s.chars().take(room));
            if s.chars().count() > room {
                return Err(std::fmt::Error);
            }
            Ok(())
        }
    }
    let mut cut = Cut(String::new());
    match std::fmt::write(&mut cut, format_args!("{value:?}")) {
        Ok(()) => cut.0,
        Err(_) => format!("{}... (cut)", cut.0),
    }
}

/// Characters a description keeps.
const SHORT: usize = 300;

/// At most 300 characters of a description (inputs hold strings of 100,000 characters).
pub fn short(s: &str) -> String {
    if s.chars().nth(300).is_none() {
        return s.to_string();
    }
    let cut: String = s.chars().take(300).collect();
    format!("{cut}... ({} characters)", s.chars().count())
}
