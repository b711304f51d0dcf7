//! Actions: what a Plan does when it fires. The built-in webhook lives here; WebAssembly
//! plugins join as a second kind of action with the plugin platform.

pub mod webhook;
