//! Output of a PTY: the ring, UTF-8 stream decoding, VT100 rendering and the capture of an
//! action's window. The code lives in [`mira_tools::terminal_output`] so that a device's
//! runner renders and hashes a terminal's output exactly as the host does.

pub use mira_tools::terminal_output::*;
