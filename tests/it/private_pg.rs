//! A private PostgreSQL 15 cluster for tests that must configure, restart or break a server —
//! never the shared one on `TEST_DATABASE_URL`. `initdb` + `pg_ctl` under a fresh folder in
//! `/tmp`, run as the `postgres` user when the tests run as root (`runuser -u postgres --`),
//! listening on a free loopback port with trust authentication by default. Stopped
//! (`pg_ctl stop -m immediate`) and removed on drop.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where Debian's PostgreSQL 15 server binaries live.
pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// How to set up a private cluster.
#[derive(Debug, Clone, Default)]
pub struct PgSetup {
    /// Extra `postgresql.conf` lines (e.g. `ssl = on`).
    pub conf: Vec<String>,
    /// The whole `pg_hba.conf`; `None` keeps initdb's (trust for local connections).
    pub hba: Option<String>,
    /// Files written into the data folder before the first start (name, contents), mode 0600
    /// and owned by the server's user (certificates, keys).
    pub files: Vec<(String, Vec<u8>)>,
    /// Addresses to listen on; empty means `127.0.0.1`.
    pub listen: Vec<String>,
}

/// A running private cluster.
pub struct PrivatePg {
    /// The folder holding `data/`, the socket folder and the log.
    pub root: PathBuf,
    /// The TCP port.
    pub port: u16,
    running: bool,
}

fn as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A PostgreSQL binary, run as the cluster's user.
fn pg_command(bin: &str) -> Command {
    let path = format!("{PG_BIN}/{bin}");
    if as_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", &path]);
        c
    } else {
        Command::new(&path)
    }
}

/// Runs a PostgreSQL binary as the cluster's user; panics with its output on failure.
fn pg(bin: &str, args: &[&str]) -> String {
    let path = format!("{PG_BIN}/{bin}");
    let out = pg_command(bin).args(args).env("LC_ALL", "C").output().unwrap_or_else(|e| panic!("running {path}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{bin} {args:?} failed: {text}");
    text
}

fn chown_postgres(path: &Path) {
    if as_root() {
        let ok = Command::new("chown").args(["-R", "postgres:postgres"]).arg(path).status().expect("chown");
        assert!(ok.success(), "chown postgres {}", path.display());
    }
}

/// A free TCP port on loopback (bound and released; the cluster binds it right after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

impl PrivatePg {
    /// Creates the cluster (`initdb`, user `postgres`, trust) and starts it.
    pub fn start(setup: PgSetup) -> PrivatePg {
        assert!(
            Path::new(PG_BIN).join("initdb").exists(),
            "{PG_BIN}/initdb is missing (Debian postgresql-15; scripts/ensure-postgres.sh installs it)"
        );
        let root = PathBuf::from(format!("/tmp/mira-pg-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(root.join("sock")).expect("cluster root");
        chown_postgres(&root);
        let data = root.join("data");
        let data_s = data.to_string_lossy().into_owned();
        pg("initdb", &["-D", &data_s, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"]);
        let port = free_port();
        let listen = if setup.listen.is_empty() { "127.0.0.1".to_owned() } else { setup.listen.join(",") };
        let mut conf = format!(
            "\n# mira private test cluster\nport = {port}\nlisten_addresses = '{listen}'\n\
             unix_socket_directories = '{}'\nfsync = off\nmax_connections = 40\n",
            root.join("sock").display()
        );
        for line in &setup.conf {
            conf.push_str(line);
            conf.push('\n');
        }
        append(&data.join("postgresql.conf"), &conf);
        if let Some(hba) = &setup.hba {
            std::fs::write(data.join("pg_hba.conf"), hba).expect("pg_hba.conf");
        }
        for (name, contents) in &setup.files {
            let file = data.join(name);
            std::fs::write(&file, contents).expect("cluster file");
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        }
        chown_postgres(&root);
        let mut cluster = PrivatePg { root, port, running: false };
        cluster.start_server();
        cluster
    }

    fn data(&self) -> String {
        self.root.join("data").to_string_lossy().into_owned()
    }

    /// Starts the server and waits until it accepts connections.
    pub fn start_server(&mut self) {
        let log = self.root.join("server.log").to_string_lossy().into_owned();
        let data = self.data();
        let out = pg_command("pg_ctl")
            .args(["-D", &data, "-l", &log, "-w", "-t", "60", "start"])
            .output()
            .expect("pg_ctl start");
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}{}\nserver log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        self.running = true;
    }

    /// Stops the server (`-m fast` when `graceful`, else `-m immediate`).
    pub fn stop_server(&mut self, graceful: bool) {
        if self.running {
            let mode = if graceful { "fast" } else { "immediate" };
            pg("pg_ctl", &["-D", &self.data(), "-m", mode, "-w", "stop"]);
            self.running = false;
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("server.log")).unwrap_or_default()
    }

    /// `postgres://postgres@HOST:PORT/DB?QUERY` (the query is appended as given, without `?`
    /// when empty).
    pub fn url(&self, host: &str, db: &str, query: &str) -> String {
        let q = if query.is_empty() { String::new() } else { format!("?{query}") };
        format!("postgres://postgres@{host}:{}/{db}{q}", self.port)
    }
}

fn append(file: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(file).expect("open for append");
    f.write_all(text.as_bytes()).expect("append");
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        if self.running {
            let data = self.data();
            let _ = pg_command("pg_ctl").args(["-D", &data, "-m", "immediate", "-w", "stop"]).output();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
