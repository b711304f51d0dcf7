//! A plugin whose `input-schema` export never returns (it spins): the tests check that
//! kairos stops asking after its 5 s bound and refuses the upload, and goes on serving.

use kairos_guest::{export_action, Context, Error};

fn run(_ctx: Context, _input: serde_json::Value) -> Result<(), Error> {
    Ok(())
}

/// Spins until the host's epoch deadline stops it.
fn never() -> String {
    let mut n = 0u64;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

export_action!(run, input_schema = never());
