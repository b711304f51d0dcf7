//! Actions: what a Plan does when it fires. The built-in webhook lives here; WebAssembly
//! plugins join as a second kind of action with the plugin platform.

use std::sync::Arc;

pub mod webhook;

/// Asked right before each request of a run goes out: whether the host still holds the
/// lease its run started under. A host frozen (SIGSTOP, a paused VM) or cut off from
/// Redis past its lease may find its Plans already handed to another host, which runs
/// them again; a request it sent then would be a second call under way at once. The
/// later the question, the smaller that window: it is asked after the policy's DNS
/// lookup and the request's building, just before the client takes it.
///
/// The default fence always holds (a run outside any lease: `kairos plugins run`).
#[derive(Clone, Default)]
pub struct Fence(Option<Arc<dyn Fn() -> bool + Send + Sync>>);

impl Fence {
    pub fn new(holds: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        Fence(Some(Arc::new(holds)))
    }

    /// The lease still holds: the request may go out.
    pub fn holds(&self) -> bool {
        self.0.as_ref().is_none_or(|holds| holds())
    }
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Fence"
        } else {
            "Fence(none)"
        })
    }
}
