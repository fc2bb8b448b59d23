//! `mira-runner`: the runner on its own (the same commands as `mira runner`).

use std::process::ExitCode;

use clap::Parser;

/// Runs the Read and Edit work of a Mira control plane on this machine.
#[derive(Parser)]
#[command(name = "mira-runner", version)]
struct Cli {
    #[command(flatten)]
    args: mira_runner::cli::RunnerArgs,
}

fn main() -> ExitCode {
    mira_runner::cli::init_logging();
    mira_runner::cli::main(Cli::parse().args)
}
