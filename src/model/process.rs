//! A process started in a sandbox, as the supervisor tracks it, and the
//! interpreters run-code starts.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessState {
    Running,
    Exited,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Process {
    pub id: u64,
    pub sandbox_id: String,
    pub argv: Vec<String>,
    pub state: ProcessState,
    /// Process id inside the sandbox.
    pub pid: i32,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// The process tree was killed because its timeout passed.
    pub timed_out: bool,
    /// The kernel's OOM killer ended it.
    pub oom_killed: bool,
    /// Output bytes the daemon had to drop because nobody read them in time.
    pub dropped_bytes: u64,
    pub started_at: String,
    pub ended_at: Option<String>,
}

/// How run-code starts the interpreter of `language` (its code file's
/// path is appended); None for a language it does not run.
pub fn interpreter_argv(language: &str) -> Option<&'static [&'static str]> {
    Some(match language {
        "python" | "python3" => PYTHON_ARGV,
        "bash" => &["bash"],
        "sh" => &["sh"],
        "node" | "javascript" => &["node"],
        _ => return None,
    })
}

/// Python's run-code interpreter, unbuffered so output streams as printed.
pub const PYTHON_ARGV: &[&str] = &["python3", "-u"];
