//! `mira serve`'s logs are plain text when stderr is not a terminal: a log file or a pipe
//! gets no ANSI colour codes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tokio::io::AsyncReadExt;

#[tokio::test]
async fn logs_written_to_a_pipe_carry_no_colour_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mira"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(tmp.path().join("data"))
        .arg("--workspace")
        .arg(tmp.path())
        .env_remove("RUST_LOG")
        .env_remove("MIRA_LOG_FORMAT")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let mut log = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), async {
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&log).contains("mira listening") {
            let n = stderr.read(&mut buf).await.unwrap();
            assert!(n > 0, "mira serve ended before listening:\n{}", String::from_utf8_lossy(&log));
            log.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    child.kill().await.unwrap();
    assert!(read.is_ok(), "mira serve did not log that it listens:\n{}", String::from_utf8_lossy(&log));
    let text = String::from_utf8_lossy(&log);
    assert!(!log.contains(&0x1b), "ANSI escape codes in logs written to a pipe:\n{text:?}");
    assert!(text.contains(" INFO "), "a text log line: {text}");
}
