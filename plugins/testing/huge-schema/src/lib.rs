//! A plugin whose declared input schema is valid JSON Schema but over 64 KiB (a 70,000
//! character description): the tests check that kairos refuses its upload.

use kairos_guest::{export_action, Context, Error};

fn run(_ctx: Context, _input: serde_json::Value) -> Result<(), Error> {
    Ok(())
}

export_action!(
    run,
    input_schema = format!(r#"{{"description": "{}"}}"#, "x".repeat(70_000))
);
