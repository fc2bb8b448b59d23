//! The states and flags of the chain as types: every status column of the store and every
//! status field of the API is one of these enums, never a string, so a typo does not compile.
//!
//! Each enum serialises as its snake_case text (the same strings the API and the events
//! always carried), lists its values in the OpenAPI document (`utoipa::ToSchema`), and binds
//! and decodes as text through the store's sqlx `Any` driver. A stored value this build does
//! not know fails the read with [`crate::store::StoreError::Corrupt`] naming the column and
//! the value (the `CHECK` constraints of migration 0013 keep such values out of the tables).
//!
//! `0/1` integer columns are read as `bool` through [`Flag`] (and a nullable one as
//! `Option<bool>` through [`OptionalFlag`]); they are still written as integers, which is
//! what both schemas store.
//!
//! [`crate::events::EventKind`] is the model these follow.

use std::fmt;

use sqlx::any::AnyTypeInfo;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::{Any, Database, Decode, Encode, Type, ValueRef as _};

/// A stored or given text that names no value of a state enum.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} `{value}`")]
pub struct UnknownState {
    /// Which enum was parsed (`invocation status`, `approval rule`…).
    pub kind: &'static str,
    /// The text that was not one of its values.
    pub value: String,
}

/// Declares a state enum: variants with their stored text, `as_str`, `ALL`, `FromStr`,
/// `Display`, serde, `ToSchema` and the sqlx `Any` text encoding.
macro_rules! state_enum {
    (
        $(#[$meta:meta])*
        $name:ident, $kind:tt {
            $( $(#[$vmeta:meta])* $variant:ident = $text:tt, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
        pub enum $name {
            $( $(#[$vmeta])* #[serde(rename = $text)] $variant, )+
        }

        impl $name {
            /// Every value, in declaration order (the `CHECK` constraint of its column lists
            /// the same values).
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The stored and wire text, e.g. `awaiting_approval`.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( Self::$variant => $text, )+
                }
            }
        }

        impl std::str::FromStr for $name {
            type Err = UnknownState;

            /// Parses the stored text; [`UnknownState`] for anything else.
            fn from_str(text: &str) -> Result<Self, UnknownState> {
                match text {
                    $( $text => Ok(Self::$variant), )+
                    _ => Err(UnknownState { kind: $kind, value: text.to_owned() }),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Type<Any> for $name {
            fn type_info() -> AnyTypeInfo {
                <str as Type<Any>>::type_info()
            }

            fn compatible(ty: &AnyTypeInfo) -> bool {
                <str as Type<Any>>::compatible(ty)
            }
        }

        impl<'q> Encode<'q, Any> for $name {
            fn encode_by_ref(&self, buf: &mut <Any as Database>::ArgumentBuffer) -> Result<IsNull, BoxDynError> {
                <&str as Encode<'q, Any>>::encode(self.as_str(), buf)
            }
        }

        impl<'r> Decode<'r, Any> for $name {
            fn decode(value: <Any as Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
                let text = <&str as Decode<'r, Any>>::decode(value)?;
                Ok(text.parse::<Self>()?)
            }
        }
    };
}

state_enum! {
    /// Where a frozen invocation stands. `awaiting_approval` and `queued` have not started;
    /// `running` has; the other five are final.
    InvocationStatus, "invocation status" {
        /// Frozen; waits for a person's decision on its approval.
        AwaitingApproval = "awaiting_approval",
        /// May run (approval-free, or its approval was granted); waits for the harness.
        Queued = "queued",
        /// Claimed by a node and executing.
        Running = "running",
        /// The tool returned a result.
        Completed = "completed",
        /// The tool returned an error.
        Failed = "failed",
        /// Its approval was denied.
        Denied = "denied",
        /// Its approval expired undecided.
        Expired = "expired",
        /// The Planner cancelled it (before it ran, or while it ran and the stop won).
        Cancelled = "cancelled",
        /// The server stopped while it ran; it is never re-run.
        Interrupted = "interrupted",
    }
}

impl InvocationStatus {
    /// True for the five statuses nothing changes afterwards.
    pub fn is_final(self) -> bool {
        !matches!(self, Self::AwaitingApproval | Self::Queued | Self::Running)
    }
}

state_enum! {
    /// The single decision of an approval request.
    ApprovalStatus, "approval status" {
        /// Nobody has decided yet.
        Pending = "pending",
        /// Granted with the exact frozen triple.
        Granted = "granted",
        /// Denied (or withdrawn by its requester).
        Denied = "denied",
        /// Nobody decided within the approval TTL.
        Expired = "expired",
        /// The invocation was cancelled before anybody decided.
        Cancelled = "cancelled",
    }
}

state_enum! {
    /// Who may grant an approval: the rule that applied when the call was frozen. It is stored
    /// with the approval and never recomputed, so a later change of the deployment's
    /// `--four-eyes-domains` does not change what an existing approval demands (neither loosening
    /// it for a pending call nor stranding approvals asked under the old setting).
    ApprovalRule, "approval rule" {
        /// The user who froze the call decides (the default).
        SelfApproval = "self_approval",
        /// A different user decides: an admin or a user with the approver role. The requester
        /// may still deny (withdraw) the call, never grant it.
        FourEyes = "four_eyes",
    }
}

impl ApprovalRule {
    /// Parses the stored text; None for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        text.parse().ok()
    }
}

state_enum! {
    /// What a server's last `tools/list` said about one of its tools.
    McpToolStatus, "MCP tool status" {
        /// Listed and usable.
        Ok = "ok",
        /// Listed but refused (missing or non-object inputSchema, an invalid name…).
        Rejected = "rejected",
        /// Listed before, dropped by the server since.
        Removed = "removed",
    }
}

state_enum! {
    /// The last known connection of an External MCP server (`disconnected` by default).
    #[derive(Default)]
    McpConnectionState, "MCP connection state" {
        /// A handshake is under way.
        Connecting = "connecting",
        /// The handshake succeeded and the connection is up.
        Connected = "connected",
        /// The last attempt failed.
        Failed = "failed",
        /// Not connected (never yet, disabled, or closed).
        #[default]
        Disconnected = "disconnected",
    }
}

state_enum! {
    /// Where a terminal session stands: `running`, or how it ended.
    TerminalSessionState, "terminal session state" {
        /// The leader process runs.
        Running = "running",
        /// The leader exited by itself.
        Exited = "exited",
        /// A `kill` action (or a cancel) ended it.
        Killed = "killed",
        /// It outlived its life limit.
        TimedOut = "timed_out",
        /// It sat idle past the idle limit.
        Reaped = "reaped",
        /// The server stopped while it ran; its processes went with it.
        Lost = "lost",
        /// It could not be started.
        Failed = "failed",
    }
}

state_enum! {
    /// Whether a replica of the cluster is alive (see [`crate::cluster`]).
    ReplicaState, "replica state" {
        /// It keeps its heartbeat.
        Alive = "alive",
        /// Its heartbeat stopped; another replica declared it dead.
        Dead = "dead",
    }
}

state_enum! {
    /// What a vector of the embedding cache (`tool_embeddings`) was computed from.
    VectorKind, "vector kind" {
        /// A tool's text ([`crate::exposure::index`]); swept once no indexed tool has that
        /// text (see [`crate::embedding::worker`]).
        Tool = "tool",
        /// A user's past task (learning from use, [`crate::exposure::usage`]); removed with
        /// its turns by retention.
        Task = "task",
    }
}

state_enum! {
    /// Whether the replica named as a stdio MCP server's owner holds its process (see
    /// [`crate::mcp`], `mcp_owners`).
    McpOwnerState, "MCP owner state" {
        /// That replica runs (or may start) the server's process.
        Held = "held",
        /// That replica was declared dead; an explicit connect moves the server elsewhere.
        Lost = "lost",
    }
}

/// A `0/1` integer column read as `bool` (`#[sqlx(try_from = "Flag")]` on a row field):
/// zero is false, anything else true.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flag(pub bool);

impl From<Flag> for bool {
    fn from(flag: Flag) -> bool {
        flag.0
    }
}

impl Type<Any> for Flag {
    fn type_info() -> AnyTypeInfo {
        <i64 as Type<Any>>::type_info()
    }

    fn compatible(ty: &AnyTypeInfo) -> bool {
        <i64 as Type<Any>>::compatible(ty)
    }
}

impl<'r> Decode<'r, Any> for Flag {
    fn decode(value: <Any as Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
        Ok(Flag(<i64 as Decode<'r, Any>>::decode(value)? != 0))
    }
}

/// A nullable `0/1` integer column read as `Option<bool>`
/// (`#[sqlx(try_from = "OptionalFlag")]`): NULL is None.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionalFlag(pub Option<bool>);

impl From<OptionalFlag> for Option<bool> {
    fn from(flag: OptionalFlag) -> Option<bool> {
        flag.0
    }
}

impl Type<Any> for OptionalFlag {
    fn type_info() -> AnyTypeInfo {
        <i64 as Type<Any>>::type_info()
    }

    fn compatible(ty: &AnyTypeInfo) -> bool {
        <Option<i64> as Type<Any>>::compatible(ty)
    }
}

impl<'r> Decode<'r, Any> for OptionalFlag {
    fn decode(value: <Any as Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
        if value.is_null() {
            return Ok(OptionalFlag(None));
        }
        Ok(OptionalFlag(Some(<i64 as Decode<'r, Any>>::decode(value)? != 0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trips_and_unknown_text_is_refused() {
        for s in InvocationStatus::ALL {
            assert_eq!(s.as_str().parse::<InvocationStatus>(), Ok(*s));
            assert_eq!(serde_json::to_value(s).ok(), Some(serde_json::Value::from(s.as_str())));
        }
        for s in TerminalSessionState::ALL {
            assert_eq!(s.as_str().parse::<TerminalSessionState>(), Ok(*s));
        }
        assert_eq!(
            "granted ".parse::<ApprovalStatus>(),
            Err(UnknownState { kind: "approval status", value: "granted ".to_owned() })
        );
        assert_eq!(ApprovalRule::parse("four_eyes"), Some(ApprovalRule::FourEyes));
        assert_eq!(ApprovalRule::parse("FOUR_EYES"), None);
    }
}
