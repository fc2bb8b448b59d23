//! Rebuilds the crate when a migration is added or changed: `sqlx::migrate!` embeds
//! `migrations/` at compile time, and cargo does not see those files otherwise (the build
//! script sqlx's documentation gives, `sqlx migrate build-script`).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
