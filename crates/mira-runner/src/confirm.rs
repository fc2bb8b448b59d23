//! The local confirmation prompt (`--confirm`): before it runs a job that arrives with an
//! approval, the runner shows the person at the device what it is about to run — the tool,
//! the input hash, the canonical input (summarised) and the approval — and runs it only on
//! `y` (or `yes`). Any other answer, the end of input, or no answer within the timeout
//! (default 60 s) declines it: nothing is run and the control plane records `job_declined`.
//!
//! Answers are read from `/dev/tty` when the runner has a terminal, else from standard input
//! (so answers can be piped); [`ConfirmInput`] forces one. Prompts come one at a time, and a
//! line typed before a prompt appeared answers nothing (a late answer to a prompt that
//! timed out must not approve the next one).

use std::io::{BufRead, Write};
use std::time::Duration;

use mira_core::canonical::to_canonical_string;
use mira_core::error_code::ErrorCode;
use mira_core::remote::JobEnvelope;
use mira_core::tool::ToolError;
use tokio::sync::{Mutex, mpsc};

/// The default time the prompt waits for an answer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// How many characters of the canonical input the prompt shows.
const INPUT_SHOWN: usize = 600;

/// Where the answers come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ConfirmInput {
    /// `/dev/tty` when it can be opened, else standard input.
    #[default]
    Auto,
    /// The controlling terminal (`/dev/tty`); the prompt is written there too.
    Tty,
    /// Standard input; the prompt goes to standard error.
    Stdin,
}

/// Why a job was declined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Declined {
    /// An answer other than `y`/`yes`.
    No,
    /// No answer within the timeout.
    Timeout,
    /// The input ended (or cannot be read).
    Eof,
}

impl Declined {
    fn as_str(self) -> &'static str {
        match self {
            Self::No => "no",
            Self::Timeout => "timeout",
            Self::Eof => "end_of_input",
        }
    }
}

/// The prompt: one reader thread feeding answer lines, one prompt at a time.
pub struct Confirmer {
    lines: Mutex<mpsc::UnboundedReceiver<String>>,
    out: std::sync::Mutex<Box<dyn Write + Send>>,
    timeout: Duration,
}

impl Confirmer {
    /// A prompt reading from `input` that waits `timeout` for each answer. Errors: `tty`
    /// was asked for and `/dev/tty` cannot be opened.
    pub fn new(input: ConfirmInput, timeout: Duration) -> anyhow::Result<Self> {
        let tty = || -> std::io::Result<(std::fs::File, std::fs::File)> {
            let read = std::fs::File::open("/dev/tty")?;
            let write = std::fs::OpenOptions::new().write(true).open("/dev/tty")?;
            Ok((read, write))
        };
        let (reader, out): (Box<dyn BufRead + Send>, Box<dyn Write + Send>) = match input {
            ConfirmInput::Stdin => (Box::new(std::io::BufReader::new(std::io::stdin())), Box::new(std::io::stderr())),
            ConfirmInput::Tty => {
                let (r, w) = tty().map_err(|e| anyhow::anyhow!("--confirm-input tty: /dev/tty: {e}"))?;
                (Box::new(std::io::BufReader::new(r)), Box::new(w))
            }
            ConfirmInput::Auto => match tty() {
                Ok((r, w)) => (Box::new(std::io::BufReader::new(r)), Box::new(w)),
                Err(_) => (Box::new(std::io::BufReader::new(std::io::stdin())), Box::new(std::io::stderr())),
            },
        };
        Ok(Self::from_parts(reader, out, timeout))
    }

    /// A prompt reading answer lines from `reader` and writing prompts to `out`.
    pub fn from_parts(reader: Box<dyn BufRead + Send>, out: Box<dyn Write + Send>, timeout: Duration) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        // A plain thread: a blocking read of a terminal cannot be cancelled, and it must not
        // hold one of the runtime's blocking threads. It ends with the input.
        std::thread::spawn(move || {
            for line in reader.lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { lines: Mutex::new(rx), out: std::sync::Mutex::new(out), timeout }
    }

    /// Asks whether to run `env` (which names `approval_id`). `Ok` runs it; the error is
    /// `job_declined` (`details.declined`: `no`, `timeout` or `end_of_input`).
    pub async fn ask(&self, env: &JobEnvelope, approval_id: &str) -> Result<(), ToolError> {
        let mut lines = self.lines.lock().await;
        // Lines typed before this prompt appeared answer nothing.
        while lines.try_recv().is_ok() {}
        self.show(&prompt(env, approval_id, self.timeout));
        let declined = match tokio::time::timeout(self.timeout, lines.recv()).await {
            Ok(Some(answer)) if matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") => {
                self.show("mira runner: confirmed; running it.\n");
                tracing::info!(invocation = %env.invocation_id, approval = approval_id, "confirmed at the device");
                return Ok(());
            }
            Ok(Some(_)) => Declined::No,
            Ok(None) => Declined::Eof,
            Err(_) => Declined::Timeout,
        };
        let why = match declined {
            Declined::No => "the person at the device declined it".to_owned(),
            Declined::Timeout => {
                format!("nobody at the device confirmed it within {} s", self.timeout.as_secs())
            }
            Declined::Eof => "the device's confirmation input ended before an answer".to_owned(),
        };
        self.show(&format!("mira runner: declined ({why}); nothing was run.\n"));
        tracing::warn!(invocation = %env.invocation_id, approval = approval_id, declined = declined.as_str(), "declined at the device");
        Err(ToolError::new(ErrorCode::JobDeclined, format!("{why} at its confirmation prompt; nothing was run"))
            .with_details(serde_json::json!({
                "declined": declined.as_str(),
                "approval_id": approval_id,
                "timeout_secs": self.timeout.as_secs(),
            })))
    }

    fn show(&self, text: &str) {
        if let Ok(mut out) = self.out.lock() {
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        }
    }
}

/// The prompt's text for `env`.
fn prompt(env: &JobEnvelope, approval_id: &str, timeout: Duration) -> String {
    format!(
        "\nmira runner: a job needs your confirmation\n  tool:        {}\n  invocation:  {}\n  approval:    {}\n  workspace:   {}\n  input hash:  {}\n  input:       {}\nRun it? [y/N] (declined in {} s without an answer) ",
        printable(&env.tool_id),
        printable(&env.invocation_id),
        printable(approval_id),
        printable(&env.workspace),
        printable(&env.input_hash),
        summary(&to_canonical_string(&env.input)),
        timeout.as_secs(),
    )
}

/// The canonical input, cut after [`INPUT_SHOWN`] characters, made printable.
fn summary(canonical: &str) -> String {
    let total = canonical.chars().count();
    if total <= INPUT_SHOWN {
        return printable(canonical);
    }
    let head: String = canonical.chars().take(INPUT_SHOWN).collect();
    format!("{}… ({total} characters in all; the input hash covers all of it)", printable(&head))
}

/// `text` with control and bidirectional-override characters escaped (`\u{…}`), so that
/// nothing in a job can move the cursor, recolour or rewrite the prompt.
fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let bidi = matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if c.is_control() || bidi {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_escapes_what_could_rewrite_the_prompt() {
        assert_eq!(printable("a\u{1b}[2Jb\u{9b}c\u{202e}d"), "a\\u{1b}[2Jb\\u{9b}c\\u{202e}d");
        assert_eq!(printable("plain é"), "plain é");
        let long = "x".repeat(INPUT_SHOWN + 10);
        assert!(summary(&long).contains(&format!("{} characters in all", INPUT_SHOWN + 10)));
    }
}
