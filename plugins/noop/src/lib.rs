//! The smallest plugin: takes any input, does nothing, succeeds. The plugin benchmark
//! measures the host's per-invocation cost with it.

use kairos_guest::{export_action, Context, Error};

fn run(_ctx: Context, _input: serde_json::Value) -> Result<(), Error> {
    Ok(())
}

export_action!(run);
