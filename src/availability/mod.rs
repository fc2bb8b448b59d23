//! Availability: "can this user, on this device, with these connections, use it now?"
//!
//! Evaluated per (user, device, connection state) and always answered with a stable reason
//! code when the answer is no. Generic checks (the device has the capability the tool needs
//! and something can execute on that device) live here; tool-specific checks (a configured
//! search provider, a connected MCP server…) are the tool's own
//! [`crate::registry::Tool::availability`].

use crate::error::ErrorCode;
use crate::registry::Entry;

pub use mira_core::availability::*;

/// Evaluates availability of `entry` for `ctx`: an input schema that compiles
/// (`schema_unusable` otherwise, naming the problem), device capability, an executor for the
/// device, then the tool's own checks.
pub fn evaluate(entry: &Entry, ctx: &AvailabilityContext) -> Availability {
    if let Err(problem) = entry.schema() {
        return Availability::unavailable(
            ErrorCode::SchemaUnusable,
            format!("the input schema of {} cannot be used: {problem}", entry.spec().id),
        );
    }
    let spec = entry.spec();
    if let Some(cap) = &spec.capability {
        if !ctx.device.capabilities.iter().any(|c| c == cap) {
            return Availability::unavailable(
                ErrorCode::DeviceLacksCapability,
                format!("device {} does not declare capability {cap}", ctx.device.id),
            );
        }
        if !ctx.device.local {
            if ctx.device.runner != Availability::Available {
                return ctx.device.runner.clone();
            }
            if WORKSPACE_CAPABILITIES.contains(&cap.as_str())
                && ctx.device.runner_tools.as_ref().is_some_and(|tools| !tools.contains(&spec.id))
            {
                return Availability::unavailable(
                    ErrorCode::DeviceLacksCapability,
                    format!("the runner of device {} does not implement {}", ctx.device.id, spec.id),
                );
            }
        }
    }
    if spec.capability.as_deref().is_some_and(|c| WORKSPACE_CAPABILITIES.contains(&c))
        && ctx.workspace_state != Availability::Available
    {
        return ctx.workspace_state.clone();
    }
    entry.tool.availability(ctx)
}
