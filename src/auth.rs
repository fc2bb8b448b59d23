//! Bearer tokens: 32 random bytes, shown once, stored only as their SHA-256, and the
//! [`Scope`]s that say what each token may do.

use base64::Engine;
use rand::RngExt;

use crate::evidence::sha256_hex;

/// A new token: `mira_` + 43 characters of URL-safe base64 (256 random bits).
pub fn new_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill(&mut bytes);
    format!("mira_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The stored form of a token.
pub fn hash_token(token: &str) -> String {
    sha256_hex(token.as_bytes())
}

/// What a bearer token may do. A token holds a set of them ([`Scopes`]); every token made
/// before scopes existed, and every token made by the user-creating paths, holds all three.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Everything but deciding approvals and managing tokens: runs, turns, freezes, reads,
    /// streams, evidence, connections, the MCP façade. What an agent's token should hold.
    Plan,
    /// Grant or deny approvals (the API's routes and an MCP elicitation's answer): what a
    /// person keeps.
    Approve,
    /// Create tokens, and revoke tokens other than the one in use.
    Manage,
}

impl Scope {
    /// Every scope, in their stored order.
    pub const ALL: [Scope; 3] = [Scope::Plan, Scope::Approve, Scope::Manage];

    /// The scope's name, as the API and the store write it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Scope::Plan => "plan",
            Scope::Approve => "approve",
            Scope::Manage => "manage",
        }
    }

    const fn bit(self) -> u8 {
        match self {
            Scope::Plan => 1,
            Scope::Approve => 2,
            Scope::Manage => 4,
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The set of [`Scope`]s a token holds. Stored as their names separated by one space, in
/// [`Scope::ALL`]'s order (`plan approve manage`); serialised as an array of names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Scopes(u8);

impl Scopes {
    /// All three scopes: what tokens made before scopes existed, and by the user-creating
    /// paths, hold.
    pub const ALL: Scopes = Scopes(7);

    /// Whether `scope` is in the set.
    pub const fn contains(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The first scope of this set that `other` lacks, if any (None: a subset of `other`).
    pub fn first_missing_from(self, other: Scopes) -> Option<Scope> {
        self.iter().find(|s| !other.contains(*s))
    }

    /// The scopes of the set, in [`Scope::ALL`]'s order.
    pub fn iter(self) -> impl Iterator<Item = Scope> {
        Scope::ALL.into_iter().filter(move |s| self.contains(*s))
    }

    /// The stored form: names separated by one space.
    pub fn stored(self) -> String {
        self.iter().map(Scope::as_str).collect::<Vec<_>>().join(" ")
    }
}

impl FromIterator<Scope> for Scopes {
    fn from_iter<I: IntoIterator<Item = Scope>>(iter: I) -> Self {
        Scopes(iter.into_iter().fold(0, |bits, s| bits | s.bit()))
    }
}

impl TryFrom<String> for Scopes {
    type Error = String;

    /// Reads the stored form; an unknown name is an error (the row is not trusted).
    fn try_from(stored: String) -> Result<Self, Self::Error> {
        stored
            .split_whitespace()
            .map(|word| {
                Scope::ALL
                    .into_iter()
                    .find(|s| s.as_str() == word)
                    .ok_or_else(|| format!("unknown token scope {word:?}"))
            })
            .collect()
    }
}

impl serde::Serialize for Scopes {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::{Scope, Scopes};

    #[test]
    fn scopes_round_trip_their_stored_form() {
        assert_eq!(Scopes::ALL.stored(), "plan approve manage");
        assert_eq!(Scopes::try_from("plan approve manage".to_owned()), Ok(Scopes::ALL));
        let plan: Scopes = [Scope::Plan].into_iter().collect();
        assert_eq!(Scopes::try_from(plan.stored()), Ok(plan));
        assert!(Scopes::try_from("plan root".to_owned()).is_err());
        assert_eq!(plan.first_missing_from(Scopes::ALL), None);
        assert_eq!(Scopes::ALL.first_missing_from(plan), Some(Scope::Approve));
        assert_eq!(serde_json::to_value(plan).ok(), Some(serde_json::json!(["plan"])));
    }

    #[test]
    fn tokens_are_unique_and_hashed() {
        let a = super::new_token();
        assert_ne!(a, super::new_token());
        assert_eq!(a.len(), 48);
        assert_eq!(super::hash_token(&a).len(), 64);
    }
}
