//! Where a benchmark's CPU time goes, read from Linux's `/proc` before and after a load.
//!
//! A [`CpuSample`] holds, in clock ticks (`sysconf(_SC_CLK_TCK)`, usually 100 per second):
//! - the machine's total and busy time from the first line of `/proc/stat` (busy = everything
//!   but `idle` and `iowait`);
//! - this process's user + system time (`/proc/self/stat`, fields 14 and 15), and the part of it
//!   spent by threads whose name starts with a given prefix (`/proc/self/task/*/stat`), so that a
//!   benchmark's own load generator and SQLite's worker threads (`sqlx-sqlite-worker-*`) can be
//!   told apart from the server;
//! - the user + system time of every process named `postgres` (`/proc/*/stat`), the Postgres
//!   server's backends (the whole server: other databases' work counts too).
//!
//! [`CpuSample::since`] gives the difference, [`CpuUse::describe`] one line of figures. Field
//! numbers follow proc(5); the command name (field 2) is in parentheses and may itself contain
//! spaces and parentheses, so fields are counted after its last `)`.

use std::path::Path;

/// The thread name prefix of a benchmark's load generator (its own tokio runtime's workers).
pub const CLIENT_THREAD: &str = "bench-client";
/// The thread name prefix of sqlx's SQLite worker threads (one per SQLite connection).
const SQLITE_THREAD: &str = "sqlx-sqlite";

/// CPU counters at one moment, in clock ticks.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSample {
    machine_total: u64,
    machine_busy: u64,
    process: u64,
    clients: u64,
    sqlite: u64,
    postgres: u64,
}

/// CPU used between two samples, in clock ticks.
#[derive(Debug, Clone, Copy)]
pub struct CpuUse {
    delta: CpuSample,
    ticks_per_second: u64,
    cores: usize,
}

impl CpuSample {
    /// Reads the counters now; a file that cannot be read counts as zero (not Linux, or a
    /// process that ended meanwhile).
    pub fn now() -> Self {
        let (machine_total, machine_busy) = machine_ticks().unwrap_or_default();
        let process = std::fs::read_to_string("/proc/self/stat").ok().and_then(|s| stat_cpu(&s)).unwrap_or(0);
        let (mut clients, mut sqlite) = (0, 0);
        for (name, ticks) in stats_under(Path::new("/proc/self/task")) {
            if name.starts_with(CLIENT_THREAD) {
                clients += ticks;
            } else if name.starts_with(SQLITE_THREAD) {
                sqlite += ticks;
            }
        }
        let postgres =
            stats_under(Path::new("/proc")).filter(|(name, _)| name == "postgres").map(|(_, ticks)| ticks).sum();
        Self { machine_total, machine_busy, process, clients, sqlite, postgres }
    }

    /// What was used from `earlier` until this sample.
    pub fn since(&self, earlier: &Self) -> CpuUse {
        let delta = Self {
            machine_total: self.machine_total.saturating_sub(earlier.machine_total),
            machine_busy: self.machine_busy.saturating_sub(earlier.machine_busy),
            process: self.process.saturating_sub(earlier.process),
            clients: self.clients.saturating_sub(earlier.clients),
            sqlite: self.sqlite.saturating_sub(earlier.sqlite),
            postgres: self.postgres.saturating_sub(earlier.postgres),
        };
        let ticks_per_second = rustix::param::clock_ticks_per_second().max(1);
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        CpuUse { delta, ticks_per_second, cores }
    }
}

impl CpuUse {
    /// One line: the machine's busy share (percent of all cores, 100% per core) and the CPU
    /// milliseconds per unit of work (`units` of what `per` names) spent by the server (this
    /// process without the load generator; with the SQLite threads' share in parentheses), the
    /// load generator, the Postgres processes and everything else on the machine.
    pub fn describe(&self, units: u64, per: &str) -> String {
        let d = &self.delta;
        let ms = |ticks: u64| ticks as f64 * 1000.0 / self.ticks_per_second as f64 / units.max(1) as f64;
        let busy_percent = d.machine_busy as f64 * 100.0 * self.cores as f64 / d.machine_total.max(1) as f64;
        let server = d.process.saturating_sub(d.clients);
        let other = d.machine_busy.saturating_sub(d.process + d.postgres);
        format!(
            "cpu: machine busy {busy_percent:.0}% of {}% ({} cores); CPU ms per {per}: server {:.3} (SQLite threads {:.3}), bench clients {:.3}, postgres processes {:.3}, everything else {:.3}",
            self.cores * 100,
            self.cores,
            ms(server),
            ms(d.sqlite),
            ms(d.clients),
            ms(d.postgres),
            ms(other)
        )
    }
}

/// (total, busy) ticks of all CPUs from the `cpu` line of `/proc/stat`.
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    // user nice system idle iowait irq softirq steal; guest and guest_nice (9th, 10th) are
    // already counted in user and nice.
    let fields: Vec<u64> = line.split_whitespace().skip(1).take(8).filter_map(|f| f.parse().ok()).collect();
    let total: u64 = fields.iter().sum();
    // idle (4th) and iowait (5th) are not busy time.
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Some((total, total.saturating_sub(idle)))
}

/// The fields of one `stat` file's text after the command name, from field 3 (state) on.
pub(super) fn stat_fields_after_name(stat: &str) -> Option<std::str::SplitWhitespace<'_>> {
    stat.rsplit_once(')').map(|(_, after_name)| after_name.split_whitespace())
}

/// utime + stime (fields 14 and 15 of proc(5)'s `stat`) of one `stat` file's text.
fn stat_cpu(stat: &str) -> Option<u64> {
    // utime is field 14, i.e. the 12th after field 3.
    let mut fields = stat_fields_after_name(stat)?.skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// The command name (field 2, without its parentheses) of one `stat` file's text.
fn stat_name(stat: &str) -> Option<&str> {
    let start = stat.find('(')?;
    let end = stat.rfind(')')?;
    stat.get(start + 1..end)
}

/// (name, CPU ticks) of every `<dir>/<entry>/stat` that can be read and parsed.
fn stats_under(dir: &Path) -> impl Iterator<Item = (String, u64)> {
    std::fs::read_dir(dir).into_iter().flatten().flatten().filter_map(|entry| {
        let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        Some((stat_name(&stat)?.to_owned(), stat_cpu(&stat)?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_lines_whose_name_holds_spaces_and_parentheses() {
        let line = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 37 5 0 0 20 0 1 0 12345 1000 10";
        assert_eq!(stat_name(line), Some("a (b) c"));
        assert_eq!(stat_cpu(line), Some(42));
        assert_eq!(stat_cpu("garbage"), None);
    }

    #[test]
    fn process_time_grows_with_work() {
        let before = CpuSample::now();
        assert!(before.machine_total > 0, "the machine's counters are read");
        let started = std::time::Instant::now();
        let mut x = 0u64;
        // Spin until the process has used at least 5 ticks (50 ms at 100 per second).
        while CpuSample::now().process < before.process + 5 && started.elapsed().as_secs() < 20 {
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
        let used = CpuSample::now().since(&before);
        assert!(used.delta.process >= 5, "process ticks {} after spinning", used.delta.process);
        assert!(used.delta.machine_busy >= used.delta.process / 2, "the machine was busy meanwhile");
        assert!(used.describe(10, "call").contains("CPU ms per call: server"));
    }
}
