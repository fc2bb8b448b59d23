//! TLS to Postgres: a private cluster (`private_pg`) with `ssl = on`, a server certificate
//! issued by a CA made here (openssl CLI), and a `pg_hba.conf` that only accepts `hostssl`.
//! `sslmode=require` serves a whole server; `verify-full` with `sslrootcert=` accepts the
//! right CA and host and refuses a wrong CA or a wrong host with a clear error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::private_pg::{PgSetup, PrivatePg};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").current_dir(dir).args(args).output().expect("openssl (Debian openssl) runs");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA (`<name>.crt`, `<name>.key`) in `dir`: P-256, CA:TRUE, valid for a day.
fn make_ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
            "-days",
            "1",
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

/// `server.crt`/`server.key` for `localhost` and `127.0.0.1` (not 127.0.0.2), signed by `ca`.
fn make_server_cert(dir: &Path, ca: &str) {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            &format!("{ca}.crt"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "1",
            "-extfile",
            "server.ext",
        ],
    );
}

/// The error of connecting a store to `url`, as an operator reads it (`{:#}`).
async fn connect_error(url: &str, data_dir: &Path) -> String {
    match mira::server::open_store(data_dir, url).await {
        Ok(store) => {
            store.close().await;
            panic!("{url} connected but should not have");
        }
        Err(e) => format!("{e:#}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_and_verify_full() {
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path();
    make_ca(certs, "test-ca");
    make_ca(certs, "other-ca");
    make_server_cert(certs, "test-ca");
    let pg = PrivatePg::start(PgSetup {
        conf: vec!["ssl = on".into(), "ssl_cert_file = 'server.crt'".into(), "ssl_key_file = 'server.key'".into()],
        hba: Some("local all all trust\nhostssl all all 127.0.0.0/8 trust\n".into()),
        files: vec![
            ("server.crt".into(), std::fs::read(certs.join("server.crt")).unwrap()),
            ("server.key".into(), std::fs::read(certs.join("server.key")).unwrap()),
        ],
        listen: vec!["127.0.0.1".into(), "127.0.0.2".into()],
    });
    let ca = certs.join("test-ca.crt");
    let other = certs.join("other-ca.crt");
    let data = tmp.path().join("data");

    // The cluster refuses plain connections: TLS is really in use below.
    let plain = connect_error(&pg.url("127.0.0.1", "postgres", "sslmode=disable"), &data).await;
    assert!(plain.contains("no pg_hba.conf entry") && plain.contains("no encryption"), "{plain}");

    // sslmode=require: a whole server starts on it and serves.
    let url = pg.url("127.0.0.1", "postgres", "sslmode=require");
    let opts = crate::common::Options::default();
    std::fs::create_dir_all(tmp.path().join("ws")).unwrap();
    let settings = mira::server::Settings {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: data.clone(),
        database_url: url.clone(),
        workspace: tmp.path().join("ws"),
        runtime: opts.runtime,
        body_limit: opts.body_limit,
        request_timeout: Duration::from_secs(30),
    };
    let server = mira::server::Server::start(settings).await.unwrap_or_else(|e| panic!("{e:#}\n{}", pg.log()));
    let token = std::fs::read_to_string(server.admin_token_file.clone().expect("fresh store")).unwrap();
    let client = mira::net::client_builder().build().unwrap();
    let base = format!("http://{}", server.addr);
    let ready: serde_json::Value = client.get(format!("{base}/readyz")).send().await.unwrap().json().await.unwrap();
    assert_eq!(ready["store"], "ok", "{ready}");
    let created = client
        .post(format!("{base}/v1/users"))
        .bearer_auth(token.trim())
        .json(&json!({"name": "tls-user"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    server.shutdown().await;

    // verify-full with the right CA and a host the certificate names: connects over TLS.
    let good = pg.url("127.0.0.1", "postgres", &format!("sslmode=verify-full&sslrootcert={}", ca.display()));
    let store = mira::server::open_store(&data, &good).await.unwrap_or_else(|e| panic!("{e:#}"));
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&good).await.unwrap();
    let ssl: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetch_one(&pool).await.unwrap();
    assert!(ssl, "the verify-full connection is encrypted");
    pool.close().await;
    store.close().await;

    // A CA that did not issue the server's certificate: refused, saying why.
    let wrong_ca = pg.url("127.0.0.1", "postgres", &format!("sslmode=verify-full&sslrootcert={}", other.display()));
    let e = connect_error(&wrong_ca, &data).await;
    assert!(e.contains("connecting to postgres://postgres@127.0.0.1"), "{e}");
    assert!(e.to_lowercase().contains("certificate") && e.contains("UnknownIssuer"), "{e}");

    // `mira serve` waits for a database that is down, not for one whose certificate is refused.
    let started = std::time::Instant::now();
    let e = mira::server::open_store_waiting(&data, &wrong_ca, Duration::from_secs(30)).await.err().expect("refused");
    assert!(format!("{e:#}").contains("UnknownIssuer"), "{e:#}");
    assert!(started.elapsed() < Duration::from_secs(10), "a refused certificate is not retried");

    // The right CA but a host the certificate does not name (the server listens there too).
    let wrong_host = pg.url("127.0.0.2", "postgres", &format!("sslmode=verify-full&sslrootcert={}", ca.display()));
    let e = connect_error(&wrong_host, &data).await;
    assert!(e.contains("not valid for name \"127.0.0.2\""), "{e}");

    // A missing CA file is a clear configuration error too.
    let missing = pg.url("127.0.0.1", "postgres", "sslmode=verify-full&sslrootcert=/nonexistent/ca.crt");
    let e = connect_error(&missing, &data).await;
    assert!(e.contains("/nonexistent/ca.crt") || e.to_lowercase().contains("no such file"), "{e}");
    let started = std::time::Instant::now();
    assert!(mira::server::open_store_waiting(&data, &missing, Duration::from_secs(30)).await.is_err());
    assert!(started.elapsed() < Duration::from_secs(10), "a missing CA file is not retried");
}
